"""`cocaq watch`: a running job's power and energy so far, refreshed in place like `top`.

Each refresh is one query (cocaq.footprint.live.fetch) against the database, or one request to the read
API (`GET /v1/live`, which runs that query under the API's rules: only one's own jobs). With a job id it
follows that job until it ends, then waits for the import of Slurm's accounting to close it and prints its
final footprint as `cocaq job` does; without one it shows all of the caller's running jobs. The same
rendering is the "Now" section of `cocaq job` on a running job (`print_live`).
"""

from __future__ import annotations

import getpass
import time
from typing import Any

import click

from cocaq.cli.app import Ctx, _console, cluster_opt
from cocaq.cli.live_view import live_renderable, summary_renderable
from cocaq.errors import InputError, UsageError
from cocaq.units import S_PER_HOUR


class Source:
    """Where the views come from: the read API when `[api] url` is set, else the database."""

    def __init__(self, obj: Ctx, window_s: float) -> None:
        self.obj = obj
        self.window_s = window_s
        self.db: Any = None

    def views(self, job_id: str | None, user: str | None, cluster: str | None) -> list[dict[str, Any]]:
        """One refresh: one request to the API (the database if it cannot be reached, for those who
        can read it, as `cocaq user` does), or one statement on the database."""
        from cocaq.cli.footprint import _api_or_db

        cfg = self.obj.cfg

        def from_db() -> dict[str, Any]:
            from cocaq.footprint.live import Ask, live

            if self.db is None:
                from cocaq.db.dbapi import connect

                self.db = connect(cfg.database_url)
            else:
                self.db.renew()  # a new snapshot for each refresh
            ask = Ask(job_ids=(job_id,), cluster=cluster) if job_id else Ask(user=user, cluster=cluster)
            return {"jobs": live(self.db, cfg, ask, window_s=self.window_s)}

        params: dict[str, Any] = {"jobs": job_id, "user": None if job_id else user, "cluster": cluster}
        params["window"] = self.window_s
        return list(_api_or_db(self.obj, ("live",), params, from_db)["jobs"])

    def final_job(self, job_id: str, cluster: str | None) -> list[dict[str, Any]]:
        """The job as `cocaq job` shows it, once accounted."""
        cfg = self.obj.cfg
        if cfg.api.url:
            from cocaq.api.client import get
            from cocaq.cli.footprint import _revive

            return [_revive(j) for j in get(cfg.api, ("jobs", job_id), {"cluster": cluster})["jobs"]]
        from cocaq.footprint.one_job import find_jobs

        with self.obj.engine().connect() as conn:
            return find_jobs(conn, job_id, cluster, cfg)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


def _final_ready(v: dict[str, Any]) -> bool:
    """Accounted: Slurm's final state imported (and with it the measured energy reconciled)."""
    return bool(v.get("accounted"))


@click.command()
@click.argument("jobid", required=False)
@cluster_opt
@click.option(
    "-i",
    "--interval",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.5, 3600),
    help="Seconds between refreshes.",
)
@click.option(
    "--window",
    default="10m",
    show_default=True,
    help="How far back the power history and the utilisation mean go (like 5m, 1h; at most 6h).",
)
@click.option(
    "-n",
    "--iterations",
    type=click.IntRange(1),
    default=None,
    help="Stop after this many refreshes (like top -n); default: until the job ends (or Ctrl-C).",
)
@click.option("--no-final", is_flag=True, help="Do not wait for the final footprint once the job has ended.")
@click.option(
    "-o",
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="json: one line per refresh (all jobs' views), for scripts.",
)
@click.pass_obj
def watch(
    obj: Ctx,
    jobid: str | None,
    cluster: str | None,
    interval: float,
    window: str,
    iterations: int | None,
    no_final: bool,
    fmt: str,
) -> None:
    """What a running job draws now and has used so far (measured where the collector measures it),
    refreshed in place; without JOBID, all your running jobs."""
    import re

    from cocaq.slurm.record import JOB_ID_PATTERN
    from cocaq.timeparse import parse_duration

    if jobid is not None and not re.fullmatch(JOB_ID_PATTERN, jobid.strip()):
        raise UsageError(f"{jobid.strip()!r} is not a Slurm job id (like 12345, an array task 12345_7)")
    window_s = parse_duration(window).total_seconds()
    if not 60 <= window_s <= 6 * S_PER_HOUR:
        raise UsageError(f"--window: {window!r} is outside 1m..6h")
    job_id = jobid.strip() if jobid else None
    user = getpass.getuser()
    src = Source(obj, window_s)
    console = _console()
    try:
        _loop(src, console, job_id, user, cluster, interval, iterations, no_final, fmt)
    except KeyboardInterrupt:
        pass
    finally:
        src.close()


def _loop(
    src: Source,
    console: Any,
    job_id: str | None,
    user: str,
    cluster: str | None,
    interval: float,
    iterations: int | None,
    no_final: bool,
    fmt: str,
) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from cocaq.cli import terminal

    live_display: Live | None = None
    if fmt == "table" and console.is_terminal:
        live_display = Live(console=console, auto_refresh=False, transient=False)
        live_display.start()
    n = 0
    ended_seen = False
    try:
        while True:
            got = src.views(job_id, user, cluster)
            n += 1
            if job_id is not None and not got:
                raise InputError(
                    f"no job {job_id} in cocaq's records that has started (running jobs appear with "
                    "their node's first shipment, [collector] ship_interval_s after their start; ended ones "
                    "within the hour; a pending job once it starts)"
                )
            done = job_id is not None and not got[0]["running"]
            waiting = done and not no_final and fmt != "json" and not _final_ready(got[0])
            msg = Text(
                f"Job {job_id} has ended; waiting for cocaq to import Slurm's accounting of it (the "
                "scheduler's reconcile) to print its final footprint. Ctrl-C to stop.",
                style="yellow",
            )
            if fmt == "json":
                click.echo(terminal.to_json({"now_ts": time.time(), "jobs": got}).replace("\n", " "))
            elif live_display is not None:
                body = live_renderable(got[0], console) if job_id else summary_renderable(got, console, user)
                live_display.update(Group(body, msg) if waiting else body, refresh=True)
            elif not ended_seen:  # piped: a block per refresh while it runs, the last one once
                console.print(
                    live_renderable(got[0], console) if job_id else summary_renderable(got, console, user)
                )
                if waiting:
                    console.print(msg)
                console.rule(style="dim")
            ended_seen = ended_seen or done
            if iterations is not None and n >= iterations:
                return
            if job_id is None and live_display is None and not any(v["running"] for v in got):
                return  # piped, and none of the user's jobs runs: nothing more will come
            if done and not waiting:
                if no_final or fmt == "json":
                    return
                if live_display is not None:
                    live_display.stop()
                    live_display = None
                for j in src.final_job(job_id or "", cluster)[:1]:
                    terminal.print_job(j, console)
                return
            # once ended, the import comes within the hour: no need to ask as often
            time.sleep(max(interval, 10.0) if done else interval)
    finally:
        if live_display is not None:
            live_display.stop()
