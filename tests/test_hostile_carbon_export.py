"""Issue 33, points 4, 5, 7 and 9, through the real CLI on both databases: a carbon CSV's bad rows (a year
9999 or 0001, a path-like or quoted zone, a non-number, a duplicate hour) skipped with their line numbers
while the good rows are imported; `cocaq export -o` to a path that cannot be written (a missing directory,
/dev/full, a read-only directory) is one line, exit 1 and no file left behind; and every CSV surface
writes a job or model named like a spreadsheet formula as text, numbers as numbers."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine, insert, select

from cocaq.accounting.aggregate import run_aggregate
from cocaq.accounting.importer import import_records
from cocaq.db.schema import Job, ModelMetadata
from tests.builders import config
from tests.builders import job as _job
from tests.conftest import ROOT, run_cocaq

# --- points 4 and 5: carbon import ---------------------------------------------------------------------

HOSTILE_CSV = (
    "zone,datetime,gco2_per_kwh\n"  # 1
    "ES,2026-01-01T00:00Z,100\n"  # 2 good
    "ES,9999-12-31T23:00Z,200\n"  # 3 year 9999
    "ES,0001-01-01T00:00Z,200\n"  # 4 year 0001
    "../X,2026-01-01T01:00Z,200\n"  # 5 a path as a zone
    'E"S,2026-01-01T01:00Z,200\n'  # 6 a quote in a zone
    "ES,2026-01-01T01:00Z,lots\n"  # 7 not a number
    "\n"  # 8 empty: not a row, nothing to report
    "ES,2026-01-01T01:00Z,110\n"  # 9 good
    "ES,2026-01-01T01:00Z,111\n"  # 10 the same hour again
    "ES,2026-01-01T02:00Z,120\n"  # 11 good
    "fr,2026-01-01T00:00Z,50\n"  # 12 good (zones are case-insensitive)
)


@pytest.fixture
def carbon_env(cli_env: dict[str, str], migrated_db_url: str, tmp_path: Path) -> dict[str, str]:
    return dict(cli_env, COCAQ_DATABASE_URL=migrated_db_url)


def test_carbon_import_skips_each_bad_row_with_its_line_and_keeps_the_good(
    carbon_env: dict[str, str], tmp_path: Path
) -> None:
    f = tmp_path / "hostile.csv"
    f.write_text(HOSTILE_CSV)
    r = run_cocaq(["carbon", "import", str(f)], carbon_env)
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert "imported 4, replaced 0, unchanged 0, skipped 6" in r.err, r.err
    assert "skipped 2: year outside 1990..2100 (lines 3, 4)" in r.err, r.err
    assert "skipped 2: bad zone id (lines 5, 6)" in r.err, r.err
    assert "skipped 1: bad number (line 7)" in r.err and "skipped 1: duplicate time (line 10)" in r.err
    r = run_cocaq(["carbon", "zones", "-o", "json"], carbon_env)
    zones = {z["zone"]: z["points"] for z in json.loads(r.out)}
    assert zones == {"ES": 3, "FR": 1}, r.out
    r = run_cocaq(["carbon", "show", "ES", "--at", "2026-01-01T01:30Z"], carbon_env)
    assert "110 g CO2e/kWh" in r.out, r.out


@pytest.mark.parametrize(
    "rows",
    ["ES,9999-12-31T23:00Z,200\n", "ES,0001-01-01T00:00+14:00,200\n", "../X,2026-01-01T00:00Z,1\n"],
)
def test_a_file_of_only_bad_rows_is_one_line(carbon_env: dict[str, str], tmp_path: Path, rows: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("zone,datetime,gco2_per_kwh\n" + rows)
    r = run_cocaq(["carbon", "import", str(f)], carbon_env)
    assert r.code == 4 and r.err.startswith("cocaq: error: ") and r.err.count("\n") == 1, r.err
    assert "no usable rows" in r.err


@pytest.mark.parametrize("zone", ["../X", 'E"S', "a/b", "", "X" * 33, "E\x1bS", "ES;DROP", "É"])
def test_a_bad_zone_option_is_refused(carbon_env: dict[str, str], tmp_path: Path, zone: str) -> None:
    f = tmp_path / "ok.csv"
    f.write_text("datetime,gco2_per_kwh\n2026-01-01T00:00Z,10\n")
    r = run_cocaq(["carbon", "import", str(f), "--zone", zone], carbon_env)
    assert r.code == 2 and r.err.startswith("cocaq: error: --zone") and r.err.count("\n") == 1, r.err


# --- point 7: export to a path that cannot be written ----------------------------------------------------


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create files in: 0555 for a user; root writes anywhere but /sys."""
    if os.geteuid() == 0:
        return Path("/sys")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_to_an_unwritable_path_is_one_line_and_leaves_nothing(
    carbon_env: dict[str, str], tmp_path: Path, fmt: str
) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet needs pyarrow (the [analysis] extra)")
    ro = _read_only_dir(tmp_path)
    before = set(os.listdir(ro))
    for target, why in [
        (f"/nonexistent/dir/x.{fmt}", "No such file or directory"),
        ("/dev/full", "No space left on device"),
        (str(ro / f"x.{fmt}"), ""),
    ]:
        r = run_cocaq(["export", "jobs", "--format", fmt, "-o", target], carbon_env)
        assert r.code == 1 and r.err.count("\n") == 1, (target, r.err)
        assert r.err.startswith(f"cocaq: error: cannot write {target}: {why}"), r.err
    assert set(os.listdir(ro)) == before
    assert not Path("/nonexistent").exists()


def test_export_writes_a_whole_file_or_standard_output(carbon_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "jobs.csv"
    out.write_text("old\n")
    out.chmod(0o640)
    r = run_cocaq(["export", "jobs", "-o", str(out)], carbon_env)
    assert r.code == 0, r.err
    assert out.read_text().startswith("cluster,job_id,") and out.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == sorted({"jobs.csv", *os.listdir(tmp_path)})
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    r = run_cocaq(["export", "jobs", "-o", "-"], carbon_env)
    assert r.code == 0 and r.out.startswith("cluster,job_id,") and not (ROOT / "-").exists(), r.err
    r = run_cocaq(["export", "jobs", "--format", "parquet", "-o", "-"], carbon_env)
    assert r.code == 2 and "parquet is binary" in r.err, r.err
    with open("/dev/full", "wb") as full:  # standard output that cannot be written: one line too
        for args in (["export", "jobs"], ["carbon", "zones", "-o", "csv"]):
            p = subprocess.run(
                [sys.executable, "-m", "cocaq", *args], env=carbon_env, stdout=full, stderr=subprocess.PIPE,
                cwd=ROOT, timeout=300, check=False,
            )  # fmt: skip
            err = p.stderr.decode()
            assert p.returncode == 1 and err.count("\n") == 1, (args, err)
            assert err == "cocaq: error: cannot write standard output: No space left on device\n", err


# --- point 9: formulas in every CSV ----------------------------------------------------------------------

DAY = datetime(2026, 11, 3, tzinfo=UTC)
H = timedelta(hours=1)
FORMULAS = ['=HYPERLINK("http://x")', "+1", "-1", "@SUM(A1)", "\t=1"]
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@pytest.fixture
def formula_env(engine: Engine, tmp_path: Path, cli_env: dict[str, str]) -> dict[str, str]:
    url = engine.url.render_as_string(hide_password=False)
    cfg = config(tmp_path, url, cluster={"carbon_zone": "FR"})
    recs = [
        _job(10 + i, DAY + 3 * i * H, 2.0, user="mallory", account="lab_m", name=name)
        for i, name in enumerate(FORMULAS)
    ]
    import_records(engine, recs, cfg, source="sacct-json")
    with engine.begin() as c:
        pks = dict(c.execute(select(Job.job_id_raw, Job.id)).all())
        for i, name in enumerate(FORMULAS):
            c.execute(
                insert(ModelMetadata).values(
                    job_pk=pks[10 + i], model_name=name, framework="@cmd", precision="-fp8", epochs=-1.0
                )
            )
    run_aggregate(engine, cfg)
    return dict(cli_env, COCAQ_DATABASE_URL=url)


def _defused(text: str) -> list[list[str]]:
    """The CSV's cells; each that a spreadsheet would run is a number (a negative one, say)."""
    rows = list(csv.reader(io.StringIO(text)))
    for row in rows:
        for cell in row:
            if cell.startswith(FORMULA_START):
                float(cell)  # (raises for text: a formula got through)
    cells = {c for row in rows for c in row}
    for name in FORMULAS:  # (the import strips a job name's tab: "\t=1" is "=1" there)
        assert {"'" + name.replace("\t", "?"), "'" + name.strip()} & cells, (name, text)
    return rows


def test_every_csv_writes_formulas_as_text(formula_env: dict[str, str], tmp_path: Path) -> None:
    window = ["-S", "2026-11-01", "-E", "2026-12-01"]
    outputs = {}
    for table in ("jobs", "models"):
        r = run_cocaq(["export", table, *window], formula_env)
        assert r.code == 0, r.err
        outputs[f"export {table}"] = r.out
        f = tmp_path / f"{table}.csv"
        r = run_cocaq(["export", table, *window, "-o", str(f)], formula_env)
        assert r.code == 0, r.err
        outputs[f"export {table} -o"] = f.read_text()
    for args in (["user", "mallory"], ["lab", "lab_m"], ["models"]):
        r = run_cocaq([*args, *window, "-o", "csv"], formula_env)
        assert r.code == 0, r.err
        outputs[" ".join(args)] = r.out
    for what, text in outputs.items():
        try:
            _defused(text)
        except (AssertionError, ValueError) as exc:
            raise AssertionError(f"{what}: {exc}\n{text}") from None
    models = pd.read_csv(io.StringIO(outputs["export models"]))
    assert models["epochs"].tolist() == [-1.0] * len(FORMULAS)  # a negative number stays a number
    assert set(models["precision"]) == {"'-fp8"} and set(models["framework"]) == {"'@cmd"}
