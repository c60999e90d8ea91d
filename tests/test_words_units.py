"""Words and units (issue 32, point 8): every surface of the demo month read for the classes of defect a
reader stops at: a raw float ("142.419"), a count without its thousands separator ("1466" beside
"1,175"), two spellings of the carbon intensity's unit ("gCO2eq/kWh" beside "g CO2e/kWh"), a plural
after 1 ("1 cores"), a label that starts with a capital spliced into a sentence ("worth making: Train
..."), a kWh figure without its unit, and the same CO2 in kg in a table and in g in the e-mail.

The demo is run once; its e-mails are read as plain text and as the HTML's visible text, its admin page
likewise, and the CLI at 60 columns and in JSON (the values that are words). Each class is a regular
expression over that text, so a new template or command that brings one back fails here.
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import re
from html.parser import HTMLParser

import pytest

from tests.conftest import run_cocaq

# Words that are capitalised wherever they stand: names of things, places, tools and days.
PROPER = {
    "Slurm", "Electricity", "Green", "Algorithms", "Lightning", "Hugging", "Face", "PyTorch", "Trainer",
    "TrainingArguments", "Baler", "McDonald", "Spain", "Princeton", "Mon", "Tue", "Wed", "Thu", "Fri",
    "Sat", "Sun", "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
    "Dec", "Demo", "File", "Shut", "Down", "Maps", "Greenhouse", "Gas", "Equivalencies", "Embodied",
}  # fmt: skip
RAW_FLOAT = re.compile(r"(?<![\w.,-])[1-9][\d,]*\.\d{3,}(?![\w.])")  # 142.419; never 0.0123 or 2.3.1
ZERO_TAIL = re.compile(r"(?<![\w.,-])\d[\d,]*\.\d*0 (?:k?Wh|h|GPU-hours|kg|g)\b")  # 48.00 h, 0.00 kWh
BARE_COUNT = re.compile(r"(?<![\w.,:/+@=-])(?!(?:19|20)\d\d\b)\d{4,5}(?![\w.,:/-])")  # 1466, not 2026
INTENSITY = re.compile(r"gCO2|CO2eq|(?<!CO2e)\bg/kWh")
PLURAL_1 = re.compile(
    r"(?<![\w.,])1 (?:jobs|cores|GPUs|CPUs|users|runs|nodes|models|GPU-hours|hours|days|people|tasks)\b"
)
# A capital after a colon, semicolon or comma that follows a lowercase word: a label spliced in whole.
SPLICED = re.compile(r"(?<=[a-z0-9)])[:;,] ([A-Z][a-z]+)\b")
LOWER_AFTER_STOP = re.compile(r"(?<=[a-z]{3})\. ([a-z]{3,})\b")  # "6 users. document checkpointing"
UNITLESS_PARTS = re.compile(r"idle GPUs \d[\d.,]*, failed \d")  # a list of kWh figures, unit only at the end


class _Text(HTMLParser):
    """The visible text of a page: no script or style; cells and blocks on their own lines."""

    BLOCKS = frozenset(
        {"p", "div", "tr", "td", "th", "li", "h1", "h2", "h3", "br", "table", "caption", "span"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.out: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self.skip += 1
        if tag in self.BLOCKS:
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self.skip -= 1
        if tag in self.BLOCKS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.out.append(data)


def visible(html: str) -> str:
    p = _Text()
    p.feed(html)
    return "\n".join(" ".join(line.split()) for line in "".join(p.out).splitlines() if line.strip())


def words_of(value: object) -> list[str]:
    """The string values of a JSON document that are words (with a space), not keys or ids."""
    if isinstance(value, dict):
        return [w for v in value.values() for w in words_of(v)]
    if isinstance(value, list):
        return [w for v in value for w in words_of(v)]
    return [value] if isinstance(value, str) and " " in value else []


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every surface of the demo month as text: name -> text."""
    tmp = tmp_path_factory.mktemp("words")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COCAQ_")}
    env.update(XDG_DATA_HOME=str(tmp / "xdg"), HOME=str(tmp), PYTHONUNBUFFERED="1", COLUMNS="60")
    out = tmp / "out"
    r = run_cocaq(["demo", "--out", str(out)], env, cwd=tmp)
    assert r.code == 0, r.err
    texts: dict[str, str] = {}
    for p in sorted((out / "reports").iterdir()):
        if p.suffix == ".eml":
            msg = email.message_from_bytes(p.read_bytes(), policy=email.policy.default)
            texts[p.name] = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
        elif p.suffix == ".html":
            texts[p.name] = visible(p.read_text())
    conf = ["--config", str(out / "cocaq-demo.toml")]
    commands = {
        "user": ["user", "dave", "--since", "30d"],
        "user-erin": ["user", "erin", "--since", "30d"],
        "lab": ["lab", "lab_nlp", "--since", "30d"],
        "lab-vision": ["lab", "lab_vision", "--since", "30d"],
        "job": ["job", "410382"],
        "job-small": ["job", "410352"],
        "models": ["models", "--since", "30d"],
        "when": [*conf, "carbon", "when", "--hours", "6"],
        "show": [*conf, "carbon", "show", "ES"],
    }
    for name, args in commands.items():
        r = run_cocaq(args, env, cwd=tmp)
        assert r.code == 0, (name, r.err)
        texts[f"cocaq {name}"] = r.out
    for name, args in {"user": commands["user"], "lab": commands["lab"], "job": commands["job"]}.items():
        r = run_cocaq([*args, "--format", "json"], env, cwd=tmp)
        assert r.code == 0, (name, r.err)
        texts[f"cocaq {name} json"] = "\n".join(words_of(json.loads(r.out)))
    return texts


def hits(texts: dict[str, str], pattern: re.Pattern[str], keep: object = None) -> list[str]:
    """Each match with the surface it is on and a little context; `keep` filters matches (a callable)."""
    found = []
    for name, text in texts.items():
        flat = " ".join(text.split()) if not name.startswith("cocaq ") else text
        for m in pattern.finditer(flat):
            if callable(keep) and not keep(m):
                continue
            found.append(f"{name}: ...{flat[max(0, m.start() - 40) : m.end() + 30]}...")
    return found


def test_no_raw_floats(surfaces: dict[str, str]) -> None:
    """Every figure through num: about three significant digits, never 142.419 or 48.00 h."""
    assert hits(surfaces, RAW_FLOAT) == []
    assert hits(surfaces, ZERO_TAIL) == []


def test_every_count_has_its_thousands_separator(surfaces: dict[str, str]) -> None:
    assert hits(surfaces, BARE_COUNT) == []


def test_one_spelling_of_the_carbon_intensity_unit(surfaces: dict[str, str]) -> None:
    assert hits(surfaces, INTENSITY) == []
    assert any("g CO2e/kWh" in t for t in surfaces.values())


def test_plurals_after_one(surfaces: dict[str, str]) -> None:
    assert hits(surfaces, PLURAL_1) == []


def test_no_capital_spliced_mid_sentence(surfaces: dict[str, str]) -> None:
    """A suggestion's title, a lever's or a waste part's label, spliced after a colon, reads lowercase
    ("the one change worth making: train mistral-7b"); a sentence after a full stop starts with a capital."""
    assert hits(surfaces, SPLICED, keep=lambda m: m.group(1) not in PROPER) == []
    code = ("cocaq", "torch", "out", "py", "txt")  # a command or a file name after a full stop
    assert hits(surfaces, LOWER_AFTER_STOP, keep=lambda m: m.group(1) not in code and not _abbrev(m)) == []


def _abbrev(m: re.Match[str]) -> bool:
    """A column heading abbreviated with a full stop ("meas."), then the table's first cell."""
    return m.string[max(0, m.start() - 4) : m.start()] == "meas"


def test_kwh_figures_carry_their_unit(surfaces: dict[str, str]) -> None:
    """The parts of the energy that did no work each say kWh or Wh (the admin e-mail listed "idle GPUs
    20.5, failed 74.8, ... 2.92 kWh", and "812 Wh of 63 kWh: ... failed 0.52"); the admin page's tables
    say the unit in the heading or in the cell."""
    assert hits(surfaces, UNITLESS_PARTS) == []
    page = next(t for n, t in surfaces.items() if re.fullmatch(r"admin-\d{4}-\d{2}\.html", n))
    waste = page[page.index("Energy that did no work") :]
    header = waste[: waste.index("lab_nlp")]
    for column in ("idle GPUs", "time limit", "cancelled"):
        assert re.search(column + r"\W*\(?k?Wh", header), (column, header)


def test_the_same_co2_is_the_same_figure_and_unit_everywhere(surfaces: dict[str, str]) -> None:
    """A CO2 under 1 kg reads in g in the e-mail text, in the HTML tables and on the admin page alike:
    never a kg column of 0.951 beside '951 g CO2e' in the sentence."""
    text = surfaces[next(n for n in surfaces if n.startswith("admin-") and n.endswith("-email.eml"))]
    page = next(t for n, t in surfaces.items() if re.fullmatch(r"admin-\d{4}-\d{2}\.html", n))
    m = re.search(r"- dave: [\d.]+ GPU-h \(\d+%\), [\d.]+ k?Wh, ([\d.]+) g CO2e", text)
    assert m, "dave's idle GPUs in the admin e-mail, in g"
    grams = m.group(1)
    idle = page[page.index("Idle GPUs: top users") :]
    # dave's row: his name and the cells after it (the users' order moves with the day the demo is built)
    start = idle.index("\ndave\n")
    row = "\n".join(idle[start:].splitlines()[:8])
    assert f"{grams} g" in row, row
    for name, t in surfaces.items():
        assert not re.search(r"(?<![\d.])0\.\d+ kg\b", t), name  # no "0.5 kg": that is 500 g


def test_cocaq_lab_speaks_to_the_lab_head_about_their_members(surfaces: dict[str, str]) -> None:
    """`cocaq lab` and the lab e-mails are read by the lab head: each member's suggestion says who ("dave
    could train ..."), in the third person ("their notebooks"), and points to the member's own figures;
    never the member's "you ran", "your own runs" or "your notebooks"."""
    for name in ("cocaq lab", "cocaq lab-vision"):
        out = " ".join(surfaces[name].split())
        advice = out[out.index("What the lab's members could change") :]
        assert re.search(r"1\. (dave|alice) could \w", advice), advice[:200]
        assert "`cocaq user " in advice and "own jobs" in advice
        for second in ("By your own runs", "you have not run", "your notebooks", "your jobs", "you ran"):
            assert second not in advice, (name, second)
    nlp = " ".join(surfaces["cocaq lab"].split())
    assert "erin could release GPUs their notebooks are not using" in nlp
    for name, text in surfaces.items():
        if name.startswith("lab-"):
            flat = " ".join(text.split())
            assert " could release GPUs your " not in flat and ": Release GPUs" not in flat, name
    flat = (
        " ".join(surfaces["lab-lab_nlp-2026-11.eml"].split()) if "lab-lab_nlp-2026-11.eml" in surfaces else ""
    )
    if flat:
        assert "Others: erin could release GPUs their notebooks are not using" in flat


def test_the_models_line_says_what_unnamed_is_and_how_to_name_them(surfaces: dict[str, str]) -> None:
    """Jobs that declared no model name are the demo's largest models line: every surface says what the
    group is ("jobs that declared no model name, framework pytorch"), never "(unnamed) (pytorch)", and how
    to name them (`cocaq tag model=NAME`, the user guide's ML section)."""
    mails = {n: " ".join(t.split()) for n, t in surfaces.items() if n.endswith((".eml", ".html"))}
    with_models = [n for n, t in mails.items() if "declared no model name" in t]
    assert {n.split("-")[0] for n in with_models} >= {"user", "lab", "admin"}, with_models
    for name, text in mails.items():
        assert "(unnamed) (pytorch)" not in text and '"(unnamed)"' not in text, name
        if "declared no model name" in text:
            assert "cocaq tag model=NAME" in text and '"ML models"' in text, name
    text = mails[next(n for n in mails if n.startswith("admin-") and n.endswith("-email.eml"))]
    assert "- jobs that declared no model name, framework pytorch: " in text
    page = mails[next(n for n in mails if re.fullmatch(r"admin-\d{4}-\d{2}\.html", n))]
    assert "no model name declared framework pytorch" in page
    models = " ".join(surfaces["cocaq models"].split())
    assert "(unnamed): jobs that declared no model name, by framework." in models
    assert "cocaq tag model=NAME" in models
