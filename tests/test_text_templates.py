"""The plain-text e-mails' templates keep each line a line (issue 32: the admin e-mail's weeks ran
together as "GPU util 60%- 9 Nov-15 Nov: ...").

The text environment trims the newline after a block tag (reports.render: trim_blocks), so a line of
text that ends in `{% endif %}` or `{% endfor %}` loses its own newline unless a blank line follows it
to give one back. Every such line is checked here, in every text template but the one-line subjects."""

from __future__ import annotations

import re

from cocaq.reports.render import TEMPLATES

ENDS_IN_BLOCK = re.compile(r"\S.*\{%-?\s*end(if|for)\s*-?%\}\s*$")


def test_no_text_line_ends_in_a_block_tag_without_its_newline() -> None:
    bad = []
    for path in sorted(TEMPLATES.glob("*.txt")):
        if path.name == "subjects.txt":  # each subject is one line, stripped
            continue
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines):
            ends = ENDS_IN_BLOCK.search(line) and not line.lstrip().startswith("{%")
            if ends and i + 1 < len(lines) and lines[i + 1] != "":
                bad.append(f"{path.name}:{i + 1}: {line[-70:]}")
    assert not bad, "lines that run into the next one:\n" + "\n".join(bad)


def test_the_admin_email_has_one_line_per_week() -> None:
    """The golden admin e-mail (tests/data/golden/admin.txt) holds the rendered text; here, the weeks."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "golden" / "admin.txt").read_text(encoding="utf-8")
    weeks = text.split("WEEK BY WEEK\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(weeks) == 6 and all(re.fullmatch(r"  - \d+ Mar(-\d+ Mar)?[ :(].*", w) for w in weeks), weeks
    assert not any(re.search(r"(%|n/a)- \d", w) for w in weeks), weeks
