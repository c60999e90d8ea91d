"""`cocaq import sacct`, `cocaq recompute`, `cocaq aggregate` and `cocaq reconcile`: the accounting run by
hand (the scheduler daemon runs the same functions on its timetable)."""

from __future__ import annotations

import sys
from typing import IO, Any

import click

from cocaq.cli.app import Ctx, _console, _window
from cocaq.config import Config
from cocaq.errors import InputError, UsageError


@click.group("import")
def import_() -> None:
    """Bring jobs into the database."""


@import_.command("sacct")
@click.option(
    "-f",
    "--file",
    "file",
    type=click.Path(allow_dash=True, dir_okay=False),
    default=None,
    help="A saved dump (sacct --json, --parsable or --parsable2 output); '-' for stdin.",
)
@click.option(
    "-S",
    "--starttime",
    "--since",
    "since",
    default="1d",
    show_default=True,
    help="Without --file: window start for sacct.",
)
@click.option("-E", "--endtime", "--until", "until", default=None, help="Without --file: window end (now).")
@click.option(
    "-a", "--allusers", is_flag=True, help="Without --file: all users' jobs (needs operator rights)."
)
@click.option("--delimiter", default="|", show_default=True, help="Field delimiter of a parsable dump.")
@click.option(
    "--fields", default=None, help="Columns of a dump without a header, as sacct's --format (JobID,User,...)."
)
@click.option(
    "--input-format", type=click.Choice(["auto", "json", "parsable"]), default="auto", show_default=True
)
@click.option("-M", "--cluster", default=None, help="Cluster name for records without a Cluster field.")
@click.option("--sacct", "sacct_bin", default=None, help="Path of the sacct binary.")
@click.option("--no-json", is_flag=True, help="Without --file: use --parsable2 even if sacct has --json.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "cli", "pyslurm"]),
    default=None,
    help="Without --file: read Slurm through sacct (cli) or slurmdbd with pyslurm ([slurm] backend).",
)
@click.option("--batch-size", default=20_000, show_default=True, type=click.IntRange(100, 1_000_000))
@click.pass_obj
def import_sacct(
    obj: Ctx,
    file: str | None,
    since: str,
    until: str | None,
    allusers: bool,
    delimiter: str,
    fields: str | None,
    input_format: str,
    cluster: str | None,
    sacct_bin: str | None,
    no_json: bool,
    backend: str | None,
    batch_size: int,
) -> None:
    """Backfill jobs from Slurm accounting (sacct), estimating energy where nothing measured it."""
    from cocaq.slurm import sacct

    cfg = obj.cfg
    engine = obj.engine()
    stats = sacct.ParseStats()
    default_cluster = cluster or cfg.cluster.name
    if len(delimiter) != 1 and delimiter != "\\t":
        raise UsageError(f"--delimiter must be one character, got {delimiter!r}")
    delim = "\t" if delimiter == "\\t" else delimiter
    field_list = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
    close: Any = None
    if file is None:
        from cocaq.slurm.backend import read_accounting

        w = _window(since, until)
        acct = read_accounting(
            cfg,
            w.since,
            w.until,
            all_users=allusers,
            backend=backend,
            sacct=sacct_bin,
            use_json=not no_json,
            default_cluster=default_cluster,
        )
        if acct.note:
            click.echo(acct.note, err=True)
        try:
            summary = _run_import(engine, acct.records, cfg, acct.source, batch_size)
        except sacct.SacctFormatError as exc:
            raise InputError(f"{acct.label}: {exc}") from None
        _print_import_summary(summary, acct.stats, acct.label)
        return
    if backend is not None:
        raise UsageError("--backend reads Slurm itself: it does not go with --file")
    if file == "-":
        fh: IO[bytes] = sys.stdin.buffer
    else:
        try:
            fh = open(file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise InputError(f"cannot read {file}: {exc.strerror}") from None
        close = fh
    head = fh.peek(64)[:64] if hasattr(fh, "peek") else b""
    kind = input_format if input_format != "auto" else sacct.sniff_format(head)
    source_name = f"file {file}"
    lines: Any = fh
    blob: Any = fh
    try:
        if kind == "json":
            records: Any = sacct.iter_json(blob, default_cluster=default_cluster, stats=stats)
            src = "sacct-json"
        else:
            records = _parsable_records(
                lines,
                file not in (None, "-"),
                cfg.estimate.max_node_power_w,
                tz=cfg.tz(),
                delimiter=delim,
                fields=field_list,
                default_cluster=default_cluster,
                stats=stats,
            )
            src = "sacct-parsable"
        summary = _run_import(engine, records, cfg, src, batch_size)
    except sacct.SacctFormatError as exc:
        raise InputError(f"{source_name}: {exc}") from None
    finally:
        if close:
            close.close()
    _print_import_summary(summary, stats, source_name)


def _parsable_records(lines: Any, from_file: bool, max_node_power_w: float, **kwargs: Any) -> Any:
    """A dump file parses in a second process (the import is CPU-bound), the plausibility rules with it;
    stdin and sacct's output here. (multiprocessing closes stdin in the child, and sacct's own output is
    already in memory.)
    """
    from cocaq.slurm import sacct

    if from_file:
        from cocaq.slurm.parallel import iter_parsable_forked

        return iter_parsable_forked(lines, max_node_power_w=max_node_power_w, **kwargs)
    return sacct.iter_parsable(lines, **kwargs)


def _run_import(engine: Any, records: Any, cfg: Config, src: str, batch_size: int) -> Any:
    from cocaq.accounting.importer import import_records

    if not sys.stderr.isatty():
        return import_records(engine, records, cfg, source=src, batch_size=batch_size)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("importing"),
        BarColumn(),
        TextColumn("{task.completed:,} jobs"),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        transient=True,
    ) as prog:
        task = prog.add_task("import", total=None)
        return import_records(
            engine, records, cfg, source=src, batch_size=batch_size, on_batch=lambda n: prog.advance(task, n)
        )


def _print_import_summary(summary: Any, stats: Any, source_name: str) -> None:
    out = _console(stderr=True)
    out.print(
        f"{source_name}: {stats.lines:,} records read ({stats.steps:,} job steps folded into their jobs); "
        f"imported {summary.inserted:,}, updated {summary.updated:,}, unchanged {summary.unchanged:,}, "
        f"skipped {sum(stats.skipped.values()) + sum(summary.skipped.values()):,}"
    )
    for reason, n in stats.skipped.most_common():
        out.print(f"  skipped {n:,}: {reason} (first at {stats.examples.get(reason, '?')})")
    for reason, n in summary.skipped.most_common():
        out.print(f"  skipped {n:,}: {reason} (first: {summary.examples.get(reason, '?')})")
    for reason, n in summary.clamped.most_common():
        out.print(f"  kept, corrected {n:,}: {reason} (first: {summary.examples.get(reason, '?')})")
    if stats.replaced_bytes_lines:
        out.print(f"  {stats.replaced_bytes_lines:,} records had bytes that are not UTF-8 (shown as \ufffd)")
    for part, n in summary.unknown_partitions.most_common():
        out.print(
            f"  partition {part!r} is not configured: {n:,} jobs estimated with the default hardware profile"
        )
    for z in sorted(summary.unknown_zones):
        out.print(f"  carbon zone {z!r} is unknown: the world average (475 g CO2e/kWh) was used")


@click.command()
@click.option("-S", "--since", "--starttime", "since", default=None, help="Only jobs that ran since then.")
@click.pass_obj
def recompute(obj: Ctx, since: str | None) -> None:
    """Redo estimates, CO2 and the rollups after the configuration or the intensity data changed."""
    from cocaq.accounting.aggregate import run_aggregate
    from cocaq.accounting.recompute import recompute_jobs

    w = _window(since, None) if since else None
    engine = obj.engine()
    n, changed = recompute_jobs(engine, obj.cfg, since=w.since if w else None)
    click.echo(f"recomputed {n:,} jobs' estimates, {changed:,} changed", err=True)
    # Carbon over time, PUE by month and the days the jobs count in follow (all of them without --since).
    res = run_aggregate(engine, obj.cfg, since=w.since if w else None, full=w is None)
    click.echo(res.line(), err=True)


@click.command()
@click.option(
    "-S", "--since", "--starttime", "since", default=None, help="Jobs that ran since then (30d, a date)."
)
@click.option("--full", is_flag=True, help="Every job and every day, from scratch.")
@click.option(
    "--rescan-samples",
    is_flag=True,
    help="Also derive every job's GPU use from the raw samples again (slow: otherwise only new ones).",
)
@click.pass_obj
def aggregate(obj: Ctx, since: str | None, full: bool, rescan_samples: bool) -> None:
    """Carbon over time, embodied CO2, GPU use and the daily rollups: what the scheduler runs hourly."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from cocaq.accounting.aggregate import run_aggregate

    if full and since:
        raise UsageError("--full and --since exclude each other")
    w = _window(since, None) if since else None
    with Progress(
        TextColumn("aggregating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=_console(stderr=True), transient=True, disable=not sys.stderr.isatty(),
    ) as bar:  # fmt: skip
        task = bar.add_task("jobs", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        res = run_aggregate(
            obj.engine(),
            obj.cfg,
            since=w.since if w else None,
            full=full,
            rescan_samples=rescan_samples,
            progress=progress,
        )
    click.echo(res.line(), err=True)


@click.command()
@click.option("-S", "--since", "--starttime", "since", default="2d", show_default=True)
@click.option("-E", "--until", "--endtime", "until", default=None)
@click.option("--no-sacct", is_flag=True, help="Only link node records to jobs already in the database.")
@click.option("--sacct", "sacct_bin", default=None, help="Path of the sacct binary.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "cli", "pyslurm"]),
    default=None,
    help="Read Slurm through sacct (cli) or slurmdbd with pyslurm (default: [slurm] backend).",
)
@click.pass_obj
def reconcile(
    obj: Ctx, since: str, until: str | None, no_sacct: bool, sacct_bin: str | None, backend: str | None
) -> None:
    """Take final job states from Slurm's accounting and join the nodes' measurements to their jobs."""
    from cocaq.accounting.reconcile import reconcile as run_reconcile

    w = _window(since, until)
    res = run_reconcile(
        obj.engine(), obj.cfg, w.since, w.until, sacct=sacct_bin, use_sacct=not no_sacct, backend=backend
    )
    for line in res.lines():
        click.echo(line, err=True)
