"""`cocaq`: the command line.  A thin layer over the library; errors are one line, never a traceback."""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import sys
from datetime import datetime
from typing import IO, Any, ClassVar

import click

from cocaq.config import Config, load_config
from cocaq.errors import CocaqError, DatabaseError, InputError, UsageError
from cocaq.timeparse import parse_when

log = logging.getLogger("cocaq")


class Ctx:
    def __init__(self, config_path: str | None, verbose: int) -> None:
        self.config_path = config_path
        self.verbose = verbose
        self._cfg: Config | None = None

    @property
    def cfg(self) -> Config:
        if self._cfg is None:
            self._cfg = load_config(self.config_path)
        return self._cfg

    def engine(self, *, migrated: bool = True) -> Any:
        from cocaq.db.engine import make_engine, require_schema

        engine = make_engine(self.cfg.database_url)
        if migrated:
            require_schema(engine)
        return engine


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output keeps whole columns rather than rich's 80-column default, unless COLUMNS says otherwise
    # (tables then drop their least important columns: cocaq.cli.terminal.fit_table).
    width = None if stream.isatty() or os.environ.get("COLUMNS", "").strip().isdigit() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr, width=width)


def _window(since: str, until: str | None) -> Any:
    from cocaq.footprint.totals import Window, now_utc

    now = now_utc()
    local = now.astimezone().tzinfo
    w = Window(parse_when(since, now, local), parse_when(until, now, local) if until else now)
    if w.until <= w.since:
        raise UsageError(f"empty window: --until ({w.until:%Y-%m-%d %H:%M}) is not after --since")
    return w


FORMAT = click.Choice(["table", "json", "csv"])
since_opt = click.option(
    "-S",
    "--since",
    "--starttime",
    "since",
    default="30d",
    show_default=True,
    help="Window start: a duration back from now (30d, 12h, 2w) or a date (2026-11-01).",
)
until_opt = click.option(
    "-E",
    "--until",
    "--endtime",
    "until",
    default=None,
    help="Window end (default: now); same forms as --since.",
)
cluster_opt = click.option(
    "-M", "--cluster", default=None, help="Only this cluster (default: all in the database)."
)


class LazyGroup(click.Group):
    """Commands that live in their own modules are imported when named (or listed by --help): `cocaq
    user` on a login node does not pay for importing the report, mail, carbon and scheduler commands."""

    # name -> ("module:attribute", then modules that add subcommands to it)
    lazy: ClassVar[dict[str, tuple[str, ...]]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            import importlib

            module, attribute = self.lazy[cmd_name][0].split(":")
            command = getattr(importlib.import_module(module), attribute)
            for extra in self.lazy[cmd_name][1:]:
                importlib.import_module(extra)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (default: $COCAQ_CONFIG, then /etc/cocaq/cocaq.toml).",
)
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.version_option(package_name="cocaq")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: int) -> None:
    """Energy and CO2 of Slurm jobs, per job, user and lab."""
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="cocaq: %(levelname)s: %(message)s")
    ctx.obj = Ctx(config_path, verbose)


# --- users ----------------------------------------------------------------------------------------


from_jobs_opt = click.option(
    "--from-jobs", is_flag=True, help="Ignore the daily rollups and compute everything from jobs (slower)."
)


@cli.command()
@click.argument("user", required=False)
@since_opt
@until_opt
@cluster_opt
@click.option("-o", "--format", "fmt", type=FORMAT, default="table", show_default=True)
@click.option("--top", default=5, show_default=True, type=click.IntRange(0, 1000), help="How many top jobs.")
@from_jobs_opt
@click.pass_obj
def user(
    obj: Ctx,
    user: str | None,
    since: str,
    until: str | None,
    cluster: str | None,
    fmt: str,
    top: int,
    from_jobs: bool,
) -> None:
    """A user's footprint over a window (default: you, the last 30 days)."""
    from cocaq.db.dbapi import connect
    from cocaq.footprint.totals import add_advice, check_names, user_footprint

    name = user or getpass.getuser()
    w = _window(since, until)

    def from_db() -> Any:
        with connect(obj.cfg.database_url) as db:
            check_names(db, user=name, cluster=cluster)
            fp = user_footprint(db, name, w, cluster=cluster, top=top, from_jobs=from_jobs)
            return add_advice(db, obj.cfg, fp, cluster=cluster).as_dict()

    _emit(_api_or_db(obj, ("users", name), _fp_params(w, cluster, top, from_jobs), from_db), fmt)


@cli.command()
@click.argument("account")
@since_opt
@until_opt
@cluster_opt
@click.option("-o", "--format", "fmt", type=FORMAT, default="table", show_default=True)
@click.option("--top", default=5, show_default=True, type=click.IntRange(0, 1000))
@from_jobs_opt
@click.pass_obj
def lab(
    obj: Ctx,
    account: str,
    since: str,
    until: str | None,
    cluster: str | None,
    fmt: str,
    top: int,
    from_jobs: bool,
) -> None:
    """A lab's (Slurm account's) totals and its users over a window."""
    from cocaq.db.dbapi import connect
    from cocaq.footprint.totals import add_advice, check_names, lab_footprint

    w = _window(since, until)

    def from_db() -> Any:
        with connect(obj.cfg.database_url) as db:
            check_names(db, account=account, cluster=cluster)
            fp = lab_footprint(db, account, w, cluster=cluster, top=top, from_jobs=from_jobs)
            return add_advice(db, obj.cfg, fp, cluster=cluster).as_dict()

    _emit(_api_or_db(obj, ("labs", account), _fp_params(w, cluster, top, from_jobs), from_db), fmt)


def _fp_params(w: Any, cluster: str | None, top: int, from_jobs: bool) -> dict[str, Any]:
    """The window as absolute times: the server reads them as the client meant them, whatever its zone."""
    p = {"since": w.since.isoformat(), "until": w.until.isoformat(), "cluster": cluster, "top": top}
    return {**p, "from_jobs": "true"} if from_jobs else p


def _api_or_db(obj: Ctx, parts: tuple[str, ...], params: dict[str, Any], from_db: Any) -> Any:
    """The answer from the read API when `[api] url` is set (login nodes: no database credentials), else
    from the database. An API that cannot be reached is skipped for the database only by those who can
    read it (admins); everyone else gets the API's one-line error."""
    if not obj.cfg.api.url:
        return from_db()
    from cocaq.api.client import ApiUnreachable, get

    try:
        return get(obj.cfg.api, parts, params)
    except ApiUnreachable as exc:
        try:
            got = from_db()
        except CocaqError:
            raise exc from None
        click.echo(f"cocaq: warning: {exc}; read the database directly", err=True)
        return got


def _emit(d: dict[str, Any], fmt: str) -> None:
    """JSON and CSV stay light (no rich: `cocaq user` runs on every login node); tables use rich."""
    from cocaq.cli import terminal as render
    from cocaq.footprint.totals import Footprint

    if fmt == "json":
        click.echo(render.to_json(d))
        return
    fp = Footprint.from_dict(d)
    if fmt == "csv":
        click.echo(render.footprint_csv(fp), nl=False)
    else:
        render.print_footprint(fp, _console())


@cli.command()
@click.argument("jobid")
@cluster_opt
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def job(obj: Ctx, jobid: str, cluster: str | None, fmt: str) -> None:
    """One job: its facts, energy by component and method, and CO2 with zone, intensity, source and PUE."""
    import re

    from cocaq.cli import terminal as render
    from cocaq.slurm.record import JOB_ID_PATTERN

    if not re.fullmatch(JOB_ID_PATTERN, jobid.strip()):
        raise UsageError(
            f"{jobid.strip()!r} is not a Slurm job id (like 12345, an array task 12345_7 or a het job "
            "part 12345+1)"
        )

    def from_db() -> Any:
        from cocaq.footprint.totals import find_jobs

        with obj.engine().connect() as conn:
            return {"jobs": find_jobs(conn, jobid.strip(), cluster, obj.cfg)}

    got = _api_or_db(obj, ("jobs", jobid.strip()), {"cluster": cluster}, from_db)
    jobs = [_revive(j) for j in got["jobs"]]
    if not jobs:
        raise InputError(
            f"no job {jobid.strip()} in cocaq's records{f' on cluster {cluster}' if cluster else ''}: jobs "
            "appear within the hour after Slurm accounts them; `cocaq user` lists your recent jobs"
        )
    if fmt == "json":
        click.echo(render.to_json(jobs[0] if len(jobs) == 1 else jobs))
        return
    con = _console()
    for j in jobs:
        render.print_job(j, con)


def _revive(d: Any) -> Any:
    """Times as datetimes again in a job the API sent (its JSON has them as ISO text)."""
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            if isinstance(v, str) and (k.endswith(("_time", "_at", "ts")) or k in ("start", "end")):
                with contextlib.suppress(ValueError):
                    v = datetime.fromisoformat(v)
            out[k] = _revive(v)
        return out
    if isinstance(d, list):
        return [_revive(x) for x in d]
    return d


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("pairs", nargs=-1, required=True)
@click.option("--strict", is_flag=True, help="Exit 1 when nothing was recorded (default: warn, exit 0).")
def tag(pairs: tuple[str, ...], strict: bool) -> None:
    """Record model metadata from inside a Slurm job: `cocaq tag model=llama-3-8b precision=bf16 epochs=2`.

    Run it any time, as often as you like (later values win; `key=` removes a key). Known keys: model,
    task, framework, framework_version, params, precision, batch_size, dataset, epochs, tokens; others are
    kept as extra. A problem is a warning and exit status 0, so a job script with `set -e` goes on.
    """
    from cocaq.ml.annotation import parse_pairs, update

    values, bad = parse_pairs(list(pairs))
    for word in bad:
        click.echo(f"cocaq: warning: {word!r} is not key=value; ignored", err=True)
    ok = bool(values) and update(values)
    if strict and not ok:
        sys.exit(1)


# --- import ---------------------------------------------------------------------------------------


@cli.group("import")
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
        out.print(f"  carbon zone {z!r} is unknown: the world average (475 g/kWh) was used")


# --- maintenance ----------------------------------------------------------------------------------


@cli.command()
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


@cli.command()
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


@cli.group()
def db() -> None:
    """The database: migrations."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.pass_obj
def db_upgrade(obj: Ctx, revision: str) -> None:
    """Create or migrate the configured database."""
    from cocaq.db import migrate
    from cocaq.db.engine import mask_url

    engine = obj.engine(migrated=False)
    before = migrate.current_revision(engine)
    migrate.upgrade(engine, revision)
    after = migrate.current_revision(engine)
    click.echo(f"{mask_url(obj.cfg.database_url)}: schema {before or 'empty'} -> {after}", err=True)


@db.command("current")
@click.pass_obj
def db_current(obj: Ctx) -> None:
    """Print the schema revision of the configured database."""
    from cocaq.db import migrate

    click.echo(migrate.current_revision(obj.engine(migrated=False)) or "empty")


# --- node side ------------------------------------------------------------------------------------


@cli.group()
def hook() -> None:
    """Slurm Prolog/Epilog hooks."""


@hook.command("shims")
@click.option(
    "--dir", "directory", required=True, type=click.Path(file_okay=False), help="Where to write them."
)
@click.option(
    "--hook-config",
    default="/etc/cocaq/cocaq.toml",
    show_default=True,
    help="Config file the hooks read (absolute; Slurm passes no environment).",
)
@click.option("--timeout", "timeout_s", default=20, show_default=True, type=click.IntRange(1, 300))
def hook_shims(directory: str, hook_config: str, timeout_s: int) -> None:
    """Write cocaq-prolog, cocaq-epilog (and the slurmctld ones) for slurm.conf's Prolog=/Epilog=."""
    from cocaq.prolog_epilog.shims import write_shims

    for path in write_shims(directory, hook_config, timeout_s=timeout_s):
        click.echo(path)


@cli.command()
@click.option("--once", is_flag=True, help="One cycle: sample every source, ship everything spooled, exit.")
@click.option(
    "--interval", "interval_s", type=click.FloatRange(1, 3600), default=None, help="Seconds (config)."
)
@click.option("--no-ship", is_flag=True, help="Sample and spool only; leave shipping to a later run.")
@click.pass_obj
def collector(obj: Ctx, once: bool, interval_s: float | None, no_ship: bool) -> None:
    """The node collector daemon: sample GPUs, RAPL and cgroups per job, ship the spool to the database."""
    from cocaq.collector.daemon import run_collector

    run_collector(obj.cfg, once=once, interval_s=interval_s, ship=not no_ship)


@cli.command()
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


@cli.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="cocaq-demo", show_default=True)
@click.option("--seed", default=42, show_default=True, type=int)
@click.option("--days", default=30, show_default=True, type=click.IntRange(1, 366))
@click.pass_obj
def demo(obj: Ctx, out_dir: str, seed: int, days: int) -> None:
    """Fill a database with a realistic month of a small GPU cluster and show what cocaq makes of it."""
    from cocaq.cli.demo import run_demo

    run_demo(obj, out_dir, seed=seed, days=days)


# --- commands that live in their own modules, imported when used (LazyGroup) ---------------------------
LazyGroup.lazy.update(
    {
        "calibrate": ("cocaq.cli.calibrate:calibrate",),
        "carbon": ("cocaq.cli.carbon:carbon",),
        "mail": ("cocaq.cli.mail:mail",),
        "models": ("cocaq.cli.models:models",),
        "report": ("cocaq.cli.report:report", "cocaq.cli.report_send"),  # the latter adds `report send`
        "scheduler": ("cocaq.cli.scheduler:scheduler",),
        "serve": ("cocaq.cli.serve:serve",),
    }
)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="cocaq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("cocaq: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except CocaqError as exc:
        click.echo(f"cocaq: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("cocaq: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        os._exit(0)
    except Exception as exc:  # last resort: the database going away mid-command, say
        from sqlalchemy.exc import OperationalError

        if isinstance(exc, OperationalError):
            click.echo(f"cocaq: error: {DatabaseError(str(exc.orig).splitlines()[0])}", err=True)
            sys.exit(3)
        raise
