"""Time windows fuzzed (issue 33, points 2 and 6): the one parser of every time option and query
parameter (cocaq.timeparse), property-tested on the whole range of inputs (Hypothesis), then every
command's time options and every read API endpoint's since/until with out-of-range values.

The invariants: the parser returns an aware datetime within cocaq's range (EARLIEST..LATEST) or raises
UsageError, never anything else; a command says one line and exits 2; an endpoint answers 400 with the
reason, never 500; a compact date (20261101) is a date, not a duration of twenty million days.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cocaq.api import munge
from cocaq.api.client import get as api_get
from cocaq.api.client import payload_for
from cocaq.errors import CocaqError, UsageError
from cocaq.timeparse import (
    EARLIEST,
    LATEST,
    parse_duration,
    parse_month,
    parse_slurm_duration,
    parse_when,
)
from tests.conftest import new_database, run_cocaq

BUDGET = settings(
    max_examples=int(os.environ.get("COCAQ_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
ZONES = [UTC, ZoneInfo("Pacific/Kiritimati"), ZoneInfo("Etc/GMT+12"), ZoneInfo("Europe/Paris")]
OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))

# What the audit tried, and their kin: the extremes of Python's datetimes, offsets at +-14:00, counts
# no timedelta holds, compact dates in and out of range.
HOSTILE = [
    "99999999d", "20261101", "0001-01-01T00:00+14:00", "9999-12-31T23:59-14:00", "0001-01-01",
    "9999-12-31T23:00", "99991231", "00010101", "1" * 30 + "s", "9" * 400, "1e400d", "inf", "nan",
    "9999999999999999999w", "0000-01", "9999-12", "2026-13", "99999-01-01", "1969-12-31T23:59Z",
    "2200-01-01T00:00:01Z", "\ud800", "\x00", "", " ", "-1d", "now-30d",
]  # fmt: skip
BAD_MONTHS = ["0000-01", "0001-12", "9999-12", "1969-12", "2200-01", "2026-00", "2026-13", "99999-01", ""]


def _in_range_or_usage_error(call: Any) -> datetime | None:
    try:
        got = call()
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
        return None
    assert isinstance(got, datetime) and got.tzinfo is not None and got.utcoffset() is not None
    assert EARLIEST <= got <= LATEST, got
    got.astimezone(UTC).isoformat()  # what the queries and the API do with it
    return got


# --- the parser ---------------------------------------------------------------------------------------


@BUDGET
@given(st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE)), st.sampled_from(ZONES))
@example("99999999d", UTC)
def test_any_text_is_a_time_in_range_or_a_usage_error(text: str, zone: Any) -> None:
    _in_range_or_usage_error(lambda: parse_when(text, NOW, zone))


@BUDGET
@given(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    st.one_of(st.none(), OFFSETS),
    st.sampled_from(["iso", "space", "compact", "minutes"]),
    st.sampled_from(ZONES),
)
def test_datetimes_near_the_extremes_with_any_offset(
    dt: datetime, offset: timezone | None, form: str, zone: Any
) -> None:
    dt = dt.replace(microsecond=0, tzinfo=offset)
    text = {
        "iso": dt.isoformat(),
        "space": dt.isoformat(sep=" "),
        "compact": f"{dt:%Y%m%d}",
        "minutes": f"{dt:%Y-%m-%dT%H:%M}" + (dt.isoformat()[19:] if offset else ""),
    }[form]
    got = _in_range_or_usage_error(lambda: parse_when(text, NOW, zone))
    meant = dt.replace(second=0) if form == "minutes" else dt
    if form == "compact":
        meant = datetime(dt.year, dt.month, dt.day, tzinfo=zone)
    elif offset is None:
        meant = meant.replace(tzinfo=zone)
    # well inside the range, the time is read as written; at the edges, refused rather than wrapped
    if EARLIEST + timedelta(days=2) < meant < LATEST - timedelta(days=2):
        assert got == meant, text
    elif not EARLIEST <= meant <= LATEST:
        assert got is None, text


@BUDGET
@given(
    st.one_of(st.integers(0, 10**40), st.floats(0, 1e300, allow_nan=False)),
    st.sampled_from(["", "s", "sec", "m", "min", "h", "d", "day", "days", "w", "week", "weeks"]),
)
@example(99999999, "d")
@example(10**30, "s")
def test_durations_of_huge_counts(count: float, unit: str) -> None:
    text = f"{count}{unit}"
    try:
        d = parse_duration(text)
    except UsageError as exc:
        assert str(exc).startswith("bad duration")
    else:
        assert timedelta(0) <= d <= LATEST - EARLIEST
    _in_range_or_usage_error(lambda: parse_when(text, NOW, UTC))


@BUDGET
@given(st.integers(-10, 99999), st.integers(-1, 13))
@example(0, 1)
@example(9999, 12)
def test_months(year: int, month: int) -> None:
    text = f"{year:04d}-{month:02d}"
    try:
        got = parse_month(text)
    except UsageError as exc:
        assert text in str(exc) or repr(text) in str(exc)
        assert not (1970 <= year <= 2199 and 1 <= month <= 12), text
        return
    assert got == datetime(year, month, 1, tzinfo=UTC) and EARLIEST <= got < LATEST


@BUDGET
@given(st.text(max_size=40))
def test_any_text_is_a_month_or_a_usage_error(text: str) -> None:
    _in_range_or_usage_error(lambda: parse_month(text))


@BUDGET
@given(st.one_of(st.text(max_size=40), st.sampled_from([*HOSTILE, "99999999-00:00:00", "9" * 5000])))
def test_slurm_durations_are_seconds_none_or_value_error(text: str) -> None:
    try:
        got = parse_slurm_duration(text)
    except ValueError:
        return
    assert got is None or isinstance(got, float | int)


def test_compact_dates_and_the_range() -> None:
    assert parse_when("20261101", NOW, UTC) == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_when("20261101T0830", NOW, UTC) == datetime(2026, 11, 1, 8, 30, tzinfo=UTC)
    assert parse_when("7", NOW, UTC) == NOW - timedelta(days=7), "a short number is still days"
    for text, reason in (
        ("99999999d", "bad duration '99999999d': longer than"),
        ("0001-01-01T00:00+14:00", "before 1970-01-01"),
        ("9999-12-31T23:59-14:00", "after 2200-01-01"),
        ("99991231", "after 2200-01-01"),
        ("1969-12-31T23:59Z", "before 1970-01-01"),
    ):
        with pytest.raises(UsageError, match=reason):
            parse_when(text, NOW, UTC)
    assert parse_when("1970-01-01T00:00Z", NOW) == EARLIEST
    assert parse_when("2200-01-01", NOW, UTC) == LATEST
    assert parse_month("1970-01") == EARLIEST and parse_month("2199-12") == datetime(2199, 12, 1, tzinfo=UTC)
    for bad in BAD_MONTHS:
        with pytest.raises(UsageError):
            parse_month(bad)


# --- the commands ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite database: a time refused is refused before anything else is looked at."""
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine

    url = f"sqlite:///{tmp_path_factory.mktemp('time') / 'cocaq.sqlite'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


def _one_line_exit_2(code: int, err: str, args: list[str]) -> None:
    assert "Traceback" not in err, (args, err)
    assert code == 2, (args, code, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("cocaq: error: "), (args, err)


# The audit's commands, through the real `python -m cocaq`.
QUOTED = [
    (["lab", "X", "--since", "99999999d"], "longer than"),
    (["models", "--since", "0001-01-01T00:00+14:00"], "before 1970-01-01"),
    (["export", "jobs", "--since", "99999999d"], "longer than"),
    (["user", "dave", "--until", "9999-12-31T23:59-14:00"], "after 2200-01-01"),
    (["carbon", "when", "--hours", "2", "--at", "0001-01-01"], "before 1970-01-01"),
    (["carbon", "when", "--hours", "2", "--at", "9999-12-31T23:00"], "after 2200-01-01"),
    (["carbon", "when", "--hours", "2", "--at", "99999999d"], "longer than"),
    (["report", "user", "dave", "--month", "0000-01", "--out", "OUT"], "--month '0000-01'"),
    (["report", "send", "--month", "9999-12", "--dry-run"], "--month '9999-12'"),
    (["watch", "--window", "99999999999d"], "longer than"),
    (["import", "sacct", "-S", "99999999d"], "longer than"),
]


@pytest.mark.parametrize(("args", "reason"), QUOTED, ids=[" ".join(a) for a, _ in QUOTED])
def test_the_audits_commands_say_one_line_and_exit_2(
    args: list[str], reason: str, cli_db: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    args = [str(tmp_path) if a == "OUT" else a for a in args]
    r = run_cocaq(args, {**cli_env, "COCAQ_DATABASE_URL": cli_db})
    _one_line_exit_2(r.code, r.err, args)
    assert reason in r.err, r.err


def test_a_compact_date_is_a_date_on_the_command_line(cli_db: str, cli_env: dict[str, str]) -> None:
    """`cocaq user dave --since 20261101` read the date as 20 million days back (an OverflowError)."""
    r = run_cocaq(["user", "dave", "--since", "20261101"], {**cli_env, "COCAQ_DATABASE_URL": cli_db})
    _one_line_exit_2(r.code, r.err, ["user"])
    assert "no user 'dave'" in r.err, "past the window: the name is what is wrong"
    r = run_cocaq(["user", "dave", "--since", "20991101"], {**cli_env, "COCAQ_DATABASE_URL": cli_db})
    _one_line_exit_2(r.code, r.err, ["user"])
    assert "empty window" in r.err


# Every command with a time option: name -> its arguments around the option and its value.
WINDOWED = [
    ["user", "dave"], ["lab", "X"], ["models"], ["export", "jobs"], ["import", "sacct", "--backend", "cli", "--sacct", "/nonexistent/sacct"], ["recompute"],
    ["aggregate"], ["reconcile", "--no-sacct"],
]  # fmt: skip
OPTIONAL_SINCE = ("recompute", "aggregate")  # without -S: every job
MATRIX = (
    [[*c, opt, v] for c in WINDOWED for opt in ("-S", "-E") for v in HOSTILE if c[0] in ("user", "models") or opt == "-S"]
    + [["carbon", cmd, *extra, "--at", v] for cmd, extra in (("when", ["--hours", "2"]), ("show", ["FR"])) for v in HOSTILE]
    + [["carbon", "when", "--hours", "2", "--within", v] for v in HOSTILE]
    + [["watch", "--window", v] for v in HOSTILE]
    + [["scheduler", "--status", "--reconcile-every", v] for v in HOSTILE]
    + [["report", kind, *who, "--month", m, "--out", "OUT"] for kind, who in (("user", ["dave"]), ("lab", ["X"]), ("admin", [])) for m in BAD_MONTHS]
    + [["report", "send", "--month", m, "--dry-run"] for m in BAD_MONTHS]
)  # fmt: skip


def _main(argv: list[str]) -> tuple[int, str]:
    """The real entry point (cocaq.cli.main, what `python -m cocaq` runs) in this process: hundreds of
    command lines in seconds; anything but SystemExit escaping it is the traceback a user would see."""
    from cocaq.cli import main

    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue()
    return 0, err.getvalue()


def test_every_time_option_of_every_command(
    cli_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COCAQ_DATABASE_URL", cli_db)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    parsers: dict[str, Any] = {
        "-S": lambda v: parse_when(v, NOW), "-E": lambda v: parse_when(v, NOW),
        "--at": lambda v: parse_when(v, NOW), "--month": parse_month, "--within": parse_duration,
        "--window": parse_duration, "--reconcile-every": parse_duration,
    }  # fmt: skip
    for argv in MATRIX:
        argv = [str(tmp_path) if a == "OUT" else a for a in argv]
        code, err = _main(argv)  # an exception escaping it fails the test here
        opt = next(a for a in argv if a in parsers)
        value = argv[argv.index(opt) + 1]
        try:
            if value or not (opt == "-E" or argv[0] in OPTIONAL_SINCE):  # "": as if not given
                parsers[opt](value)
        except UsageError:
            _one_line_exit_2(code, err, argv)  # refused by the parser: refused by the command
        else:  # accepted (a past compact date, say): whatever the command says next, in one line
            assert code == 0 or len(err.strip().splitlines()) == 1, (argv, code, err)


# --- the read API ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.test_api import _job, need_munge_and_users, server_config

    need_munge_and_users()
    tmp = tmp_path_factory.mktemp("time-api")
    url = new_database("sqlite", tmp, request)
    cfg_path = tmp / "c.toml"
    cfg_path.write_text(server_config(url))
    from cocaq.accounting.importer import import_records
    from cocaq.config_load import load_config
    from cocaq.db import migrate
    from cocaq.db.engine import make_engine

    engine = make_engine(url)
    migrate.upgrade(engine)
    cfg = load_config(cfg_path, {})
    import_records(engine, [_job(3, "bob", "lab_nlp", "b", 10)], cfg, source="t")
    engine.dispose()
    from cocaq.api.server import create_app

    with TestClient(create_app(cfg), base_url="http://api") as c:
        yield SimpleNamespace(client=c, cfg_path=cfg_path)


def _get(c: httpx.Client, path: str, **params: str) -> httpx.Response:
    """GET as root (an admin here: every query behind the endpoint runs), with a real credential."""
    cred = munge.encode(payload_for("GET", path))
    return c.get(path, params=params, headers={"Authorization": f"MUNGE {cred}"})


ENDPOINTS = ["/v1/users/bob", "/v1/labs/lab_nlp", "/v1/models", "/v1/export/jobs", "/v1/top"]
API_BAD = ["99999999d", "0001-01-01T00:00+14:00", "9999-12-31T23:59-14:00", "99991231", "1" * 30 + "s"]


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("param", ["since", "until"])
def test_out_of_range_windows_are_400_with_the_reason(api: Any, path: str, param: str) -> None:
    for value in API_BAD:
        r = _get(api.client, path, **{param: value})
        assert r.status_code == 400, (path, param, value, r.status_code, r.text)
        assert r.json()["detail"].startswith("bad time: "), r.text
    r = _get(api.client, path, since="20261101", until="20261202")
    assert r.status_code == 200, r.text
    if "since" in r.json():
        assert r.json()["since"] == "2026-11-01T00:00:00+00:00", "a compact date is a date"


@BUDGET
@given(
    st.sampled_from(ENDPOINTS),
    st.sampled_from(["since", "until"]),
    st.one_of(  # (a URL carries no lone surrogate)
        st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
        st.sampled_from([h for h in HOSTILE if h != "\ud800"]),
    ),
)
def test_any_window_is_answered_never_500(api: Any, path: str, param: str, value: str) -> None:
    r = _get(api.client, path, **{param: value})
    assert r.status_code in (200, 400, 422), (path, param, value, r.status_code, r.text)


def test_the_client_makes_a_bad_window_exit_2(api: Any) -> None:
    """What a script gets from cocaq.api.client for the server's 400: the reason, and a usage error's exit
    (2), as the CLI gives it without the API; through a real `cocaq serve`."""
    from tests.test_api_cli import serving

    with serving(api.cfg_path, "http") as base:
        conf = SimpleNamespace(url=base, munge_socket=None, timeout_s=10.0, ca_file=None)
        with pytest.raises(CocaqError, match=r"400: bad time: .*longer than") as exc:
            api_get(conf, ("users", "bob"), {"since": "99999999d"})
        assert exc.value.exit_code == 2
