"""cocaq's tables as pandas DataFrames, for notebooks: `cocaq.frames.jobs("30d", user="alice")`.

The same rows `cocaq export` writes (cocaq.footprint.export_rows: which rows a window holds, the columns
and their units), read from the database (`database_url`) or, where `[api] url` is set (a login node
without database credentials), from the read API's GET /v1/export/{table}, which applies the API's access
rules (your own rows, the labs you head, everything for admins; `sent` and `study_arms` for admins only).
Both give the same frame: UTC datetimes, floats, nullable integers and strings, one typed column per
name even when no row matched.

`jobs` and `job_energy` carry each job's `share` of the window (cocaq.accounting.window), so
`(df.energy_kwh * df.share).sum()` is `cocaq user`'s energy_kwh for the same window and
`(df.co2_kg * df.share).sum()` its co2_kg.

pandas is the optional extra `cocaq[analysis]` (with pyarrow, for parquet); only this module and
`cocaq export` import it, so `cocaq user`, the hooks and the collector stay as light as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cocaq.errors import CocaqError, UsageError
from cocaq.footprint.export_rows import COLUMNS, TABLES, check_table

if TYPE_CHECKING:
    import pandas as pd

    from cocaq.config import Config
    from cocaq.footprint.totals import Window

__all__ = ["TABLES", "frame", "job_energy", "jobs", "models", "rollups", "sent", "study_arms"]
INSTALL = "pip install 'cocaq[analysis]'"
_DTYPES = {
    "str": "string", "int": "Int64", "float": "float64", "time": "datetime64[ns, UTC]", "bool": "boolean",
}  # fmt: skip
PAGE_ROWS = 10_000  # rows per page read (from the API: per request)
log = logging.getLogger("cocaq")
When = str | datetime


def pandas() -> Any:
    """pandas, or a one-line error saying how to install it."""
    try:
        import pandas
    except ImportError:
        raise UsageError(f"cocaq.frames needs pandas: {INSTALL}") from None
    return pandas


def window(since: When = "30d", until: When | None = None) -> Window:
    """[since, until) from what people type (30d, 12h, a date: read in this machine's zone, as the CLI
    does) or datetimes (naive ones are UTC)."""
    from cocaq.footprint.totals import Window, now_utc
    from cocaq.timeparse import parse_when

    now = now_utc()
    zone = now.astimezone().tzinfo

    def when(x: When) -> datetime:
        if isinstance(x, datetime):
            return x.replace(tzinfo=UTC) if x.tzinfo is None else x
        try:
            return parse_when(x, now, zone)
        except ValueError as exc:
            raise UsageError(f"bad time {x!r}: {exc}") from None

    w = Window(when(since), now if until is None else when(until))
    if w.until <= w.since:
        raise UsageError(f"empty window: until ({w.until:%Y-%m-%d %H:%M}) is not after since")
    return w


def frame(
    table: str,
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """`table` (one of TABLES) over [since, until) as a DataFrame, from the API or the database."""
    pd = pandas()
    check_table(table)
    w = window(since, until)
    if cfg is None:
        from cocaq.config_load import load_config

        cfg = load_config()
    columns = tuple(COLUMNS[table])
    rows = list(_rows(cfg, table, w, user=user, account=account, cluster=cluster))
    df = pd.DataFrame.from_records(rows, columns=list(columns))
    return typed(df, table)


def typed(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Each column as its kind says (COLUMNS): the same dtypes whatever the rows came from."""
    pd = pandas()
    out = {}
    for name, kind in COLUMNS[table].items():
        col = df[name]
        if kind == "time":
            out[name] = pd.to_datetime(col, utc=True, format="ISO8601").astype(_DTYPES[kind])
        elif kind == "float":
            out[name] = pd.to_numeric(col, errors="raise").astype("float64")
        else:
            out[name] = col.astype(object).where(col.notna(), None).astype(_DTYPES[kind])
    return pd.DataFrame(out, columns=list(COLUMNS[table]))


def _rows(
    cfg: Config, table: str, w: Window, *, user: str | None, account: str | None, cluster: str | None
) -> Iterator[tuple[Any, ...]]:
    """The rows from the read API where `[api] url` is set, else from the database. An API that cannot be
    reached is skipped for the database only by those who can read it (as `cocaq user` does)."""
    if cfg.api.url:
        from cocaq.api.client import ApiUnreachable

        try:
            yield from _from_api(cfg, table, w, user=user, account=account, cluster=cluster)
            return
        except ApiUnreachable as exc:
            try:
                got = list(_from_db(cfg, table, w, user=user, account=account, cluster=cluster))
            except CocaqError:
                raise exc from None
            log.warning("%s; read the database directly", exc)
            yield from got
            return
    yield from _from_db(cfg, table, w, user=user, account=account, cluster=cluster)


def _from_db(cfg: Config, table: str, w: Window, **kw: Any) -> Iterator[tuple[Any, ...]]:
    from cocaq.db.dbapi import connect
    from cocaq.footprint import export_rows

    with connect(cfg.database_url) as db:
        for page in export_rows.read_all(db, table, w, limit=PAGE_ROWS, **kw):
            yield from page.rows


def _from_api(cfg: Config, table: str, w: Window, **kw: Any) -> Iterator[tuple[Any, ...]]:
    from cocaq.api.client import get

    params: dict[str, Any] = {"since": w.since.isoformat(), "until": w.until.isoformat(), **kw}
    after = 0
    while True:
        page = get(cfg.api, ("export", table), {**params, "after": after, "limit": PAGE_ROWS})
        if tuple(page["columns"]) != tuple(COLUMNS[table]):  # (another version's server)
            raise CocaqError(f"{cfg.api.url}: the API's {table} columns are not this cocaq's: upgrade both")
        for r in page["rows"]:
            yield tuple(r)
        if page.get("next") is None:
            return
        after = int(page["next"])


def jobs(
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """The jobs that ran in the window, one row each, whole-job figures and their `share` of the window."""
    return frame("jobs", since, until, user=user, account=account, cluster=cluster, cfg=cfg)


def job_energy(
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """The ledger of those jobs: one row per component, method and source (node), with the job's share."""
    return frame("job_energy", since, until, user=user, account=account, cluster=cluster, cfg=cfg)


def rollups(
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """Daily rollups (per UTC day, user, lab, partition) of the whole days that overlap the window."""
    return frame("rollups", since, until, user=user, account=account, cluster=cluster, cfg=cfg)


def models(
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """Model metadata of the runs that ended in the window, with each run's GPU-hours, energy and CO2."""
    return frame("models", since, until, user=user, account=account, cluster=cluster, cfg=cfg)


def sent(
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """Reports and e-mails sent (or failed, skipped) for periods that overlap the window (admins)."""
    return frame("sent", since, until, user=user, account=account, cluster=cluster, cfg=cfg)


def study_arms(
    since: When = "30d",
    until: When | None = None,
    *,
    user: str | None = None,
    account: str | None = None,
    cluster: str | None = None,
    cfg: Config | None = None,
) -> pd.DataFrame:
    """The e-mail study's arms drawn before the window's end (admins)."""
    return frame("study_arms", since, until, user=user, account=account, cluster=cluster, cfg=cfg)
