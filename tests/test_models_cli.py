"""`cocaq models` and the model metadata of `cocaq job`, run as real processes on SQLite and PostgreSQL.

Model names come from users, so some here are hostile: HTML, rich markup, an ANSI escape, a spreadsheet
formula, a bidi override. Each output keeps them inert for what reads it: the table shows them as text
(no escape byte reaches the terminal, markup is printed, not obeyed), JSON keeps them exactly (escaped),
CSV defuses the formula.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from sqlalchemy import Engine

from tests.conftest import run_cocaq
from tests.test_modelstats import JOBS, J, d, populate

WINDOW = ["-S", "2026-11-01", "-E", "2026-12-01"]
EVIL = {
    "20": "<script>alert(1)</script>",
    "21": "[bold]x[/bold]",
    "22": "\x1b[31mred",
    "23": '=HYPERLINK("x")',
    "24": "gpt\u202eevil",
}


@pytest.fixture
def env(engine: Engine, cli_env: dict[str, str]) -> dict[str, str]:
    evil = [
        J(jid, "mallory", "lab_m", d(20 + i), 1.0 + i, {"model_name": name, "framework": "@cmd", "epochs": 1.0,
          "precision": "bf16" if i % 2 else "-fp8", "sources": {"model": "comment"}})
        for i, (jid, name) in enumerate(EVIL.items())
    ]  # fmt: skip
    populate(engine, [*JOBS, *evil])
    return dict(cli_env, COCAQ_DATABASE_URL=engine.url.render_as_string(hide_password=False))


def _no_raw_controls(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text


def test_table_has_every_section_and_shows_hostile_names_as_text(env: dict[str, str]) -> None:
    r = run_cocaq(["models", *WINDOW], env)
    assert r.code == 0, r.err
    for title in ("By model", "By framework", "Runs, most energy first", "energy per epoch by precision"):
        assert title in r.out
    assert (
        "alice's llama-3-8b runs in bf16 at batch size 32 used 1.70 kWh per epoch, 32% less than in fp32."
        in r.out
    )
    assert "(unnamed)" in r.out and "(unknown)" in r.out
    _no_raw_controls(r.out)
    assert "?[31mred" in r.out and "gpt?evil" in r.out  # the escape byte and the override as `?`
    assert "[bold]x[/bold]" in r.out  # printed as text: rich did not take it as markup
    assert "<script>alert(1)</script>" in r.out  # (text on a terminal; HTML is escaped by the reports)


def test_table_filters_and_sections(env: dict[str, str]) -> None:
    r = run_cocaq(["models", *WINDOW, "-u", "bob", "--section", "models"], env)
    assert r.code == 0, r.err
    assert "user bob" in r.out and "By model" in r.out and "By framework" not in r.out
    assert "llama-3-8b" in r.out and "resnet50" not in r.out
    r = run_cocaq(["models", *WINDOW, "-A", "lab_b", "--cluster", "other"], env)
    assert r.code == 0 and "resnet50" in r.out and "llama" not in r.out
    assert "carol's resnet50 runs in bf16" in r.out
    r = run_cocaq(["models", "-S", "2027-01-01", "-E", "2027-02-01"], env)
    assert r.code == 0 and "No job with model metadata ended in this window." in r.out
    r = run_cocaq(["models", "-u", "alice", "-A", "lab_a"], env)
    assert r.code == 2 and "exclude each other" in r.err and "Traceback" not in r.err


def test_json_has_the_dataclasses_and_keeps_names_exactly(env: dict[str, str]) -> None:
    r = run_cocaq(["models", *WINDOW, "-o", "json"], env)
    assert r.code == 0, r.err
    _no_raw_controls(r.out)  # JSON escapes them: \u001b, \u202e
    d = json.loads(r.out)
    assert set(d) >= {"since", "until", "window", "by_model", "by_framework", "runs", "comparisons"}
    assert {g["key"] for g in d["by_model"]} >= {*EVIL.values(), "llama-3-8b", "(unnamed)"}
    run = next(x for x in d["runs"] if x["job_id"] == "1")
    assert run["kwh_per_epoch"] == pytest.approx(2.5) and run["wh_per_1m_tokens"] == pytest.approx(5000)
    assert next(x for x in d["runs"] if x["job_id"] == "5")["kwh_per_epoch"] is None
    c = next(x for x in d["comparisons"] if x["user"] == "alice")
    assert c["basis"].startswith("energy-weighted") and c["saving"] == pytest.approx(0.32)
    assert [(g["precision"], g["ratio_to_best"]) for g in c["groups"]] == [
        ("bf16", pytest.approx(1.0)), ("fp32", pytest.approx(2.5 / 1.7)),
    ]  # fmt: skip
    only = json.loads(run_cocaq(["models", *WINDOW, "-o", "json", "--section", "runs"], env).out)
    assert "runs" in only and "by_model" not in only and "comparisons" not in only


def test_csv_is_one_table_with_formulas_defused(env: dict[str, str]) -> None:
    r = run_cocaq(["models", *WINDOW, "-o", "csv"], env)
    assert r.code == 0, r.err
    _no_raw_controls(r.out)
    rows = list(csv.DictReader(io.StringIO(r.out)))
    assert {x["job_id"] for x in rows} == {"1", "2", "3", "4", "5", "6", "7", "8", "9", "11", *EVIL}
    for row in rows:
        for cell in row.values():
            assert not cell.startswith(("=", "+", "-", "@")), cell
    by_id = {x["job_id"]: x for x in rows}
    assert by_id["23"]["model"] == '\'=HYPERLINK("x")' and by_id["20"]["framework"] == "'@cmd"
    assert by_id["20"]["precision"] == "'-fp8" and by_id["22"]["model"] == "?[31mred"
    assert by_id["1"]["kwh_per_epoch"] == "2.5" and by_id["5"]["kwh_per_epoch"] == ""
    for section, first in (("models", "model"), ("frameworks", "framework"), ("comparison", "user")):
        out = run_cocaq(["models", *WINDOW, "-o", "csv", "--section", section], env).out
        header = out.splitlines()[0].split(",")
        assert header[0] == first, out
        assert not any(c.startswith(("=", "@")) for row in csv.reader(io.StringIO(out)) for c in row)


def test_job_shows_its_metadata_with_sources(env: dict[str, str]) -> None:
    r = run_cocaq(["job", "1"], env)
    assert r.code == 0, r.err
    assert "Model metadata" in r.out
    lines = {line.split("│")[1].strip(): line for line in r.out.splitlines() if line.count("│") == 4}
    assert "llama-3-8b" in lines["model"] and "comment" in lines["model"]
    assert "fp32" in lines["precision"] and "api" in lines["precision"]
    assert "detected" in lines["epochs"] and "2,000,000" in lines["tokens"]
    d = json.loads(run_cocaq(["job", "1", "-o", "json"], env).out)
    m = d["model"]
    assert (m["model"], m["precision"], m["batch_size"], m["epochs"], m["tokens"]) == (
        "llama-3-8b", "fp32", 32, 4.0, 2_000_000,
    )  # fmt: skip
    assert m["sources"] == {"model": "comment", "precision": "api", "epochs": "detected"}
    # extra keys, with their source if any; a job without metadata says null
    r = run_cocaq(["job", "8"], env)
    assert "dtype" in r.out and "torch.float32" in r.out and "lr" in r.out
    assert json.loads(run_cocaq(["job", "13", "-o", "json"], env).out)["model"] is None
    # a hostile model name is text here too
    r = run_cocaq(["job", "22"], env)
    assert r.code == 0 and "?[31mred" in r.out
    _no_raw_controls(r.out)
    r = run_cocaq(["job", "21"], env)
    assert "[bold]x[/bold]" in r.out


def _table_rows(out: str) -> list[list[str]]:
    """The data rows of every rich table in `out`, as their cells (the text between the `│`s)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]


def _no_number_cut(out: str, width: int) -> None:
    """Every row of every table on one line (a number that folds puts its rest on a second, near-empty
    row), nothing wider than the screen."""
    assert max(map(len, out.splitlines())) <= width, out
    for cells in _table_rows(out):
        assert all(cells), f"a cell went on a second line at {width} columns: {cells}\n{out}"


def test_every_table_fits_the_screen_by_dropping_columns_never_cutting_a_number(env: dict[str, str]) -> None:
    """Issue 32: at 60 and 120 columns (and, in-process, every width from 40 to 200) each table drops its
    least important columns and says which, as `cocaq user` does: no number is folded or cut, the job id,
    the model and the energy stay, and every figure shown is the one -o csv gives."""
    import re

    from rich.console import Console

    from cocaq.cli.models import num, print_models
    from cocaq.footprint.by_model import ModelStats

    runs = {
        x["job_id"]: x
        for x in csv.DictReader(io.StringIO(run_cocaq(["models", *WINDOW, "-o", "csv"], env).out))
    }
    for width in (60, 120):
        r = run_cocaq(["models", *WINDOW], dict(env, COLUMNS=str(width)))
        assert r.code == 0, r.err
        _no_number_cut(r.out, width)
        joined = " ".join(r.out.split())
        assert re.search(r"\(too narrow for: [^)]*; --format csv has (it|them)\)", joined), r.out
        # the runs table: the job, its model and its kWh, as -o csv has them
        shown = [c for c in _table_rows(r.out) if c and c[0] in runs]
        assert len(shown) == len(runs), r.out
        for cells in shown:
            assert num(float(runs[cells[0]]["energy_kwh"])) in cells, cells
    stats = ModelStats.from_dict(json.loads(run_cocaq(["models", *WINDOW, "-o", "json"], env).out))
    for width in range(40, 201):
        buf = io.StringIO()
        print_models(stats, Console(file=buf, width=width, highlight=False, color_system=None))
        _no_number_cut(buf.getvalue(), width)
    assert "too narrow" not in buf.getvalue(), "at 200 columns every column fits"
