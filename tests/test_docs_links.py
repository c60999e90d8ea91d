"""Every relative link in README.md, BENCHMARKS.md and docs/ points at a file that exists, and every
`#anchor` into a Markdown file at one of its headings (as GitHub makes them), so moving or renaming a
page or a section cannot leave a reader at a dead end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(page: Path) -> list[str]:
    return [
        m.group(1)
        for m in _LINK.finditer(_prose(page.read_text(encoding="utf-8")))
        if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1))  # http:, https:, mailto:
    ]


def test_there_are_pages_to_check() -> None:
    assert ROOT / "README.md" in PAGES and len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


_CODE_PATH = re.compile(r"`((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]+\.(?:py|md|sh|toml|yml|yaml|j2|html|ini))`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_the_docs_name_exist(page: Path) -> None:
    """A module or file named in the docs (`cocaq/accounting/ledger.py`) is there: after a module moves,
    the docs that send a reader to it move too."""
    names = set(_CODE_PATH.findall(page.read_text(encoding="utf-8")))
    missing = sorted(n for n in names if not (ROOT / n).exists())
    assert missing == [], f"{page.relative_to(ROOT)} names files that do not exist: {missing}"
