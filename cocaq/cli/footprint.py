"""`cocaq user`, `cocaq lab` and `cocaq job`: footprints from the read API (login nodes) or the database.

JSON and CSV stay light (no SQLAlchemy, no rich): these commands run on every login node, and
tests/test_user_imports.py holds them to it."""

from __future__ import annotations

import contextlib
import getpass
from datetime import datetime
from typing import Any

import click

from cocaq.cli.app import FORMAT, Ctx, _console, _window, cluster_opt, since_opt, until_opt
from cocaq.errors import CocaqError, InputError

from_jobs_opt = click.option(
    "--from-jobs", is_flag=True, help="Ignore the daily rollups and compute everything from jobs (slower)."
)


@click.command()
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
    from cocaq.footprint.lookup import query_params, user_answer

    name = user or getpass.getuser()
    w = _window(since, until)

    def from_db() -> Any:
        with connect(obj.cfg.database_url) as db:
            return user_answer(db, obj.cfg, name, w, cluster=cluster, top=top, from_jobs=from_jobs)

    _emit(_api_or_db(obj, ("users", name), query_params(w, cluster, top, from_jobs), from_db), fmt)


@click.command()
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
    from cocaq.footprint.lookup import lab_answer, query_params

    w = _window(since, until)

    def from_db() -> Any:
        with connect(obj.cfg.database_url) as db:
            return lab_answer(db, obj.cfg, account, w, cluster=cluster, top=top, from_jobs=from_jobs)

    _emit(_api_or_db(obj, ("labs", account), query_params(w, cluster, top, from_jobs), from_db), fmt)


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
    from cocaq import outfile
    from cocaq.cli import terminal as render
    from cocaq.footprint.totals import Footprint

    if fmt == "json":
        outfile.stdout(render.to_json(d) + "\n")
        return
    fp = Footprint.from_dict(d)
    if fmt == "csv":
        outfile.stdout(render.footprint_csv(fp))
    else:
        render.print_footprint(fp, _console())


@click.command()
@click.argument("jobid")
@cluster_opt
@click.option(
    "-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def job(obj: Ctx, jobid: str, cluster: str | None, fmt: str) -> None:
    """One job: its facts, energy by component and method, and CO2 with zone, intensity, source and PUE.
    An array's base id (123) or task list (123_[0-9]) shows its tasks, a het job's base id its
    components, as `sacct -j 123` does."""
    from cocaq.cli import terminal as render
    from cocaq.footprint.job_parts import parse_job_ask

    ask = parse_job_ask(jobid)

    def from_db() -> Any:
        from cocaq.db.dbapi import wrap
        from cocaq.footprint.job_parts import job_parts, wholes
        from cocaq.footprint.lookup import check_names
        from cocaq.footprint.one_job import find_jobs

        with obj.engine().connect() as conn:
            check_names(wrap(conn), cluster=cluster)  # an unknown cluster: exit 2, not "no job"
            jobs = find_jobs(conn, ask.job_id, cluster, obj.cfg) if ask.job_id is not None else []
            parts = job_parts(conn, ask, cluster)
        return {"jobs": jobs, "arrays": wholes(parts, ask, "array"), "het_jobs": wholes(parts, ask, "het")}

    from cocaq.api.client import ApiRefused

    refused: ApiRefused | None = None
    try:
        got = _api_or_db(obj, ("jobs", ask.text), {"cluster": cluster}, from_db)
    except ApiRefused as exc:  # (the API says "not found, or not yours" alike)
        got, refused = {"jobs": []}, exc
    jobs = [_revive(j) for j in got["jobs"]]
    # (an older API server: no arrays, or no het jobs)
    found = jobs + [_revive(w) for w in got.get("arrays", []) + got.get("het_jobs", [])]
    if not found:
        # a running job Slurm's accounting has not been imported for yet: what its node shipped so far
        running = _running_not_imported(obj, ask.job_id, cluster) if ask.job_id is not None else []
        if running:
            if fmt == "json":
                click.echo(render.to_json(running[0] if len(running) == 1 else running))
                return
            from cocaq.cli.live_view import print_live

            con = _console()
            for v in running:
                print_live(v, con)
            return
        if refused is not None:
            raise refused
        what = f"job {ask.text}" if ask.job_id is not None else f"task of array {ask.text}"
        raise InputError(
            f"no {what} in cocaq's records{f' on cluster {cluster}' if cluster else ''}: jobs "
            "appear within the hour after Slurm accounts them; `cocaq user` lists your recent jobs"
        )
    if fmt == "json":
        click.echo(render.to_json(found[0] if len(found) == 1 else found))
        return
    con = _console()
    for j in found:
        if j.get("kind") in ("array", "het"):
            from cocaq.cli.parts_view import print_parts

            print_parts(j, con)
            continue
        render.print_job(j, con)
        if j.get("live"):
            from cocaq.cli.live_view import print_live

            print_live(j["live"], con, header=False)
            con.print(f"[dim]`cocaq watch {render.term(j['job_id'])}` follows it as it runs.[/]")
            if j.get("model"):
                render.print_model_metadata(j["model"], con)


def _running_not_imported(obj: Ctx, job_id: str, cluster: str | None) -> list[dict[str, Any]]:
    """Live views (cocaq.footprint.live) of a job known only from its node's shipments, from the API or
    the database as the other answers (`_api_or_db`)."""
    from cocaq.api.client import ApiRefused

    def from_db() -> dict[str, Any]:
        from cocaq.db.dbapi import connect
        from cocaq.footprint.live import Ask, live

        with connect(obj.cfg.database_url) as db:
            return {"jobs": live(db, obj.cfg, Ask((job_id,), cluster=cluster))}

    try:
        got = _api_or_db(obj, ("live",), {"jobs": job_id, "cluster": cluster}, from_db)
    except ApiRefused:  # not found, or not yours: the caller says so
        return []
    return [v for v in got["jobs"] if not v["in_accounting"]]


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
