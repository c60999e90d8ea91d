"""`cocaq carbon`: carbon intensity over time. A thin layer over `cocaq.carbon.intensity`; errors are one
line."""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING

import click

from cocaq.errors import InputError, UsageError
from cocaq.units import S_PER_HOUR

if TYPE_CHECKING:
    from cocaq.carbon.intensity import Point
    from cocaq.carbon.when import Plan
    from cocaq.cli.app import Ctx

BASIS = click.Choice(["lca", "direct"])


@click.group()
def carbon() -> None:
    """Carbon intensity over time: import series, list them, see the value used at an instant.

    A series is stored under its zone (Electricity Maps' zone id, e.g. FR, ES, US-CAL-CISO, or --zone);
    jobs use it when their cluster's (or partition's) carbon_zone names that zone.
    """


@carbon.command("import")
@click.argument("file", type=click.Path())
@click.option(
    "--zone", default=None, help="Store the rows under this zone (default: the file's zone column)."
)
@click.option(
    "--basis",
    type=BASIS,
    default=None,
    help="lca (life cycle) or direct: the Electricity Maps column to take, or what a plain CSV holds "
    "(default: config [carbon] basis).",
)
@click.pass_obj
def carbon_import(obj: Ctx, file: str, zone: str | None, basis: str | None) -> None:
    """Import an Electricity Maps CSV export, or a CSV with zone,datetime,gco2_per_kwh (any time step).

    Times take an offset or Z; times without one are UTC. Importing a file again changes nothing; an
    overlapping file replaces the values it has for the same zone, basis and start time. Bad rows (a time
    outside 1990..2100, a zone id that is not letters and digits joined by - or _, a value that is not a
    plausible g/kWh, a repeated time) are skipped and reported with their line numbers.
    """
    from cocaq.carbon.series_import import parse_csv, read_file, write_rows

    if zone is not None and not zone.strip():
        raise UsageError("--zone: expected a zone id (FR, ES, US-CAL-CISO, ...), got an empty string")
    parsed = parse_csv(read_file(file), file, zone=zone, basis=basis or obj.cfg.carbon.basis)
    if not parsed.rows:
        reasons = ", ".join(f"{n} {r}" for r, n in parsed.skipped.most_common())
        raise InputError(
            f"{file}: no usable rows" + (f" (skipped: {reasons})" if reasons else " after the header")
        )
    with obj.engine().begin() as conn:
        res = write_rows(conn, parsed)
    for line in res.lines():
        click.echo(line, err=True)


@carbon.command("zones")
@click.option("-o", "--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table")
@click.pass_obj
def carbon_zones(obj: Ctx, fmt: str) -> None:
    """Each imported zone and basis: first and last time, points, resolution, gaps, sources."""
    from cocaq import outfile
    from cocaq.carbon.series import resolution_name, zone_summaries

    with obj.engine().connect() as conn:
        zones = zone_summaries(conn)
    if fmt == "json":
        outfile.stdout(json.dumps([z.as_dict() for z in zones], indent=2, ensure_ascii=False) + "\n")
        return
    if fmt == "csv":
        from cocaq.textsafe import csv_value

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        cols = ["zone", "basis", "first", "last", "points", "resolution_s", "gaps", "gap_hours", "sources"]
        w.writerow(cols)
        for z in zones:
            d = z.as_dict()
            w.writerow([csv_value(v) for v in (*(d[c] for c in cols[:-1]), "; ".join(d["sources"]))])
        outfile.stdout(buf.getvalue())
        return
    if not zones:
        click.echo("no carbon-intensity series imported (cocaq carbon import FILE)", err=True)
        return
    from rich.table import Table

    from cocaq.cli.app import _console

    table = Table(box=None, pad_edge=False)
    for col in ("zone", "basis", "first (UTC)", "last (UTC)", "points", "resolution", "gaps", "sources"):
        table.add_column(col, justify="right" if col in ("points", "gaps") else "left")
    for z in zones:
        table.add_row(
            z.zone,
            z.basis,
            f"{z.first:%Y-%m-%d %H:%M}",
            f"{z.last:%Y-%m-%d %H:%M}",
            f"{z.points:,}",
            resolution_name(z.resolution_s),
            f"{z.gaps:,}" + (f" ({z.gap_s / S_PER_HOUR:.1f} h)" if z.gaps else ""),
            "; ".join(z.sources),
        )
    _console().print(table)


@carbon.command("show")
@click.argument("zone")
@click.option(
    "--at",
    "at",
    default="now",
    show_default=True,
    help="The instant: 2023-07-01T12:00 (UTC unless it has an offset or Z), or a duration back (2h).",
)
@click.option("--basis", type=BASIS, default=None, help="lca or direct (default: config [carbon] basis).")
@click.option("-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.pass_obj
def carbon_show(obj: Ctx, zone: str, at: str, basis: str | None, fmt: str) -> None:
    """The intensity ZONE's jobs get at an instant, and why: series, nearest value, annual or world."""
    from datetime import UTC

    from cocaq.carbon.intensity import explain
    from cocaq.footprint.advice_words import intensity
    from cocaq.footprint.totals import now_utc
    from cocaq.timeparse import parse_when

    if not zone.strip():
        raise UsageError("ZONE: expected a zone id (FR, ES, US-CAL-CISO, FRA, ...), got an empty string")
    when = parse_when(at, now_utc(), UTC)
    cfg = obj.cfg.carbon
    with obj.engine().connect() as conn:
        p, prov = explain(conn, zone, when, basis or cfg.basis, cfg.gap_tolerance_s)
    if fmt == "json":
        d = {
            "zone": p.zone,
            "basis": p.basis,
            "at": p.at.isoformat(),
            "g_per_kwh": p.g_per_kwh,
            "method": p.method,
            "source": p.source,
            "has_series": p.has_series,
            "row_start": p.row_start.isoformat() if p.row_start else None,
            "row_end": p.row_end.isoformat() if p.row_end else None,
            "distance_s": p.distance_s,
            "tolerance_s": cfg.gap_tolerance_s,
            "fallback_zone": p.fallback_zone,
            "year": p.year,
            "provenance": json.loads(prov) if prov and prov.startswith("{") else prov,
        }
        click.echo(json.dumps(d, indent=2, ensure_ascii=False))
        return
    click.echo(f"{p.zone} at {p.at:%Y-%m-%d %H:%M:%S} UTC ({p.basis}): {intensity(p.g_per_kwh)}")
    click.echo(f"  {_why(p, cfg.gap_tolerance_s)}")
    click.echo(f"  source: {p.source}")
    if prov:
        click.echo(f"  provenance: {_provenance(prov)}")


@carbon.command("when")
@click.option(
    "--hours", "hours", type=float, required=True, help="How long the job runs, hours (like 6, 0.5)."
)
@click.option(
    "--within", default="24h", show_default=True, help="How long it may wait to start (like 12h, 2d)."
)
@click.option("--zone", default=None, help="The zone (default: the cluster's carbon_zone).")
@click.option(
    "--at",
    "at",
    default="now",
    show_default=True,
    help="Plan as if submitted then: 2023-07-01T12:00 (UTC unless it has an offset or Z).",
)
@click.option(
    "--weeks",
    default=4,
    show_default=True,
    type=click.IntRange(1, 52),
    help="Without a forecast, the typical day of this many past weeks.",
)
@click.option("--basis", type=BASIS, default=None, help="lca or direct (default: config [carbon] basis).")
@click.option("-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.pass_obj
def carbon_when(
    obj: Ctx,
    hours: float,
    within: str,
    zone: str | None,
    at: str,
    weeks: int,
    basis: str | None,
    fmt: str,
) -> None:
    """When to start a job of --hours to emit the least CO2, within --within from now: the best start,
    its saving, and the `sbatch --begin=` line."""
    from datetime import UTC

    from cocaq.carbon.when_answer import as_dict, checked, plan_and_line
    from cocaq.footprint.advice_words import intensity
    from cocaq.footprint.totals import now_utc
    from cocaq.timeparse import parse_duration, parse_when

    checked(hours, 0.0, "-")  # (the length first: its words name --hours)
    within_s = parse_duration(within).total_seconds()
    if not 0 <= within_s <= 31 * 86400:
        raise UsageError(f"--within: {within!r} is outside 0..31d")
    when = parse_when(at, now_utc(), UTC)
    with obj.engine().connect() as conn:
        p, line = plan_and_line(conn, obj.cfg, hours, within_s, zone=zone, at=when, weeks=weeks, basis=basis)
    tz = line.tz
    b = p.best
    if fmt == "json":
        click.echo(json.dumps(as_dict(p, line), indent=2, ensure_ascii=False))
        return
    if p.source == "mixed":
        click.echo(f"Zone {p.zone} ({p.basis}), hour by hour:")
        for a, e, origin in p.spans():
            click.echo(f"  {_span(a, e)}: {_ORIGIN[origin].format(basis=p.basis)}")
        click.echo(f"  The typical day: {p.source_text.split('a typical day: ', 1)[1]}.")
    else:
        click.echo(f"Zone {p.zone} ({p.basis}), from {p.source_text}.")
    if p.filled_hours:
        click.echo(f"  {p.filled_hours} of the hours had no value: the zone's annual figure stands in.")
    click.echo(
        f"A {_hours(p.length_s)} job started at {_local(p.at, tz)} would average {intensity(p.shift.now_g)}."
    )
    if b.saving < 0.005:
        click.echo(f"Starting now is as good as any start in the next {_hours(p.within_s)}.")
    else:
        click.echo(
            f"Best start: {line.shown()}: {intensity(b.g_per_kwh)}, {b.saving:.0%} less CO2"
            + (f" ({_from(p, b.start)})" if _from(p, b.start) else "")
            + "."
        )
        click.echo(f"  {line.command} job.sh")
        for note in line.notes():
            click.echo(f"  {note}")
    for o in p.others:
        click.echo(
            f"  or {_local(o.start, tz)}: {intensity(o.g_per_kwh)} ({o.saving:.0%} less"
            + (f"; {_from(p, o.start)})" if _from(p, o.start) else ")")
        )
    inter = p.shift.saving("interruptible")
    if inter >= b.saving + 0.005:
        click.echo(
            f"If the job could pause and resume (checkpoints), its cheapest hours in the window: "
            f"{intensity(p.shift.interruptible_g)}, {inter:.0%} less."
        )


_ORIGIN = {
    "series": "the imported {basis} series",
    "typical": "a typical day (past the series' end, or a hole in it)",
    "annual": "the zone's annual figure (no value for these hours)",
}


def _span(a: float, b: float) -> str:
    from cocaq.carbon.series import from_epoch

    return f"{from_epoch(a):%Y-%m-%d %H:%M} to {from_epoch(b):%Y-%m-%d %H:%M} UTC ({_hours(b - a)})"


def _from(p: Plan, start: float) -> str:
    """Where a run's hours came from, when not all from the series: '4 of its 6 h from the typical day'."""
    from cocaq.footprint.advice_words import num

    if p.source != "mixed":  # the heading says where every hour came from
        return ""
    got = p.hours_from(start, start + p.length_s)
    words = {"typical": "the typical day", "annual": "the zone's annual figure"}
    whole = p.length_s / S_PER_HOUR
    other = [
        ("all of it" if v >= whole - 1e-9 else f"{num(v)} of its {num(whole)} h") + f" from {words[k]}"
        for k, v in got.items()
        if k in words and v > 0
    ]
    return ", ".join(other)


def _hours(seconds: float) -> str:
    h = seconds / S_PER_HOUR
    return f"{h:g} h" if h >= 1 else f"{seconds / 60:.0f} min"


def _local(ts: float, tz: object) -> str:
    from datetime import UTC, datetime

    d = datetime.fromtimestamp(ts, UTC)
    local = d.astimezone(tz)  # type: ignore[arg-type]
    if local.utcoffset() == d.utcoffset():
        return f"{d:%Y-%m-%d %H:%M} UTC"
    return f"{d:%Y-%m-%d %H:%M} UTC ({local:%H:%M} {local.tzname()})"


def _why(p: Point, tol: float) -> str:
    span = (
        f"{p.row_start:%Y-%m-%d %H:%M}..{p.row_end:%Y-%m-%d %H:%M} UTC" if p.row_start and p.row_end else ""
    )
    if p.method == "series":
        return f"series point: the row {span}"
    if p.method == "nearest":
        away = _duration(p.distance_s)
        return f"nearest series value, {away} away (tolerance {_duration(tol)}): the row {span}"
    no_series = (
        f"no series value within {_duration(tol)}"
        if p.has_series
        else f"no {p.basis} series imported for {p.zone}"
    )
    if p.method == "annual":
        year = f", {p.year}" if p.year else ""
        return f"{no_series}: annual figure of {p.fallback_zone} (codecarbon{year})"
    return f"{no_series}, and no annual figure for this zone: world average"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s % S_PER_HOUR == 0 and s:
        return f"{s // S_PER_HOUR} h"
    if s >= S_PER_HOUR:
        return f"{s // S_PER_HOUR} h {s % S_PER_HOUR // 60} min"
    if s % 60 == 0 and s:
        return f"{s // 60} min"
    return f"{s} s"


def _provenance(prov: str) -> str:
    try:
        d = json.loads(prov)
    except ValueError:
        return prov
    if not isinstance(d, dict):
        return prov
    parts = []
    if "data_source" in d:
        parts.append(f"data source {d['data_source']}")
    if d.get("estimated") is True:
        parts.append("estimated" + (f" ({d['estimation_method']})" if d.get("estimation_method") else ""))
    elif "estimated" in d and d["estimated"] is not False:
        parts.append(f"estimated: {d['estimated']}")
    return ", ".join(parts) or prov
