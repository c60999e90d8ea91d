"""`cocaq serve`: the read-only HTTP JSON API that login nodes' `cocaq user` talks to (docs/api.md).

Who asks is proven with MUNGE, which every Slurm cluster runs: the client sends a credential made by its
local munged (`Authorization: MUNGE <credential>`), whose payload names the request (`cocaq-api GET
/v1/users/alice`), so a credential seen on the wire cannot be spent on another request; munged refuses
it if it is expired or replayed. The uid it carries is the caller.

What they may see: their own jobs and footprint, their labs' totals (not the other members' rows or
jobs), everything of a lab they head (`[api] lab_heads`), everything if they are an admin (`[api]
admin_users`, members of `[api] admin_groups`). Anything else is 403 with a one-line reason; a job that
does not exist and a job of someone else get the same answer, from the same queries.

The same queries as the CLI's (cocaq.footprint.totals, cocaq.footprint.by_model), so the output is the same
either way.
"""

import grp
import hmac
import os
import pwd
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from cocaq import __version__
from cocaq.api.client import payload_for
from cocaq.config import Config
from cocaq.db.dbapi import Db, connect
from cocaq.errors import CocaqError, ConfigError, DatabaseError
from cocaq.footprint.job_parts import ASK_PATTERN
from cocaq.slurm.record import JOB_ID_PATTERN

NAME = r"^[A-Za-z0-9._@+-]{1,128}$"  # user and account names (as the hooks accept them)
JOB_OR_ARRAY = rf"^(?:{ASK_PATTERN})$"  # a job, or an array's tasks as squeue prints them (123_[0-9])
WHEN = r"^[0-9A-Za-z:.+ -]{1,40}$"
WHEN_DOC = "30d, 12h, a date (2026-11-01, 20261101) or an ISO time, 1970 to 2200 (cocaq.timeparse)"
LIVE_JOBS = rf"^{JOB_ID_PATTERN}(,{JOB_ID_PATTERN}){{0,99}}$"  # at most cocaq.footprint.live.MAX_JOBS


@dataclass(frozen=True)
class Caller:
    user: str
    uid: int
    admin: bool
    heads: frozenset[str]  # the labs (Slurm accounts) this user heads


class Pool:
    """Reused read-only connections (cocaq.db.dbapi), at most `size`: a connection costs more than a
    footprint query on PostgreSQL, and the server's threads (40) must not open one each. A request
    waits for a free one; each request starts a new snapshot."""

    def __init__(self, url: str, size: int = 16) -> None:
        self.url = url
        self.free: queue.LifoQueue[Db] = queue.LifoQueue(maxsize=size)
        self.slots = threading.BoundedSemaphore(size)

    @contextmanager
    def db(self) -> Iterator[Db]:
        with self.slots:
            try:
                db = self.free.get_nowait()
            except queue.Empty:
                db = connect(self.url)
            ok = False
            try:
                yield db
                ok = True
            finally:
                try:
                    db.raw.rollback()
                except Exception:
                    ok = False
                if ok and db.dialect != "sqlite":  # (sqlite3 connections stay in their thread: not pooled)
                    self.free.put_nowait(db)
                else:
                    db.close()

    def close(self) -> None:
        while True:
            try:
                self.free.get_nowait().close()
            except queue.Empty:
                return


def _groups(user: str, gid: int) -> set[str]:
    out = set()
    for g in os.getgrouplist(user, gid):
        try:
            out.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue
    return out


def create_app(cfg: Config, *, decode: Any = None) -> FastAPI:
    """The API over `cfg`'s database. `decode(credential) -> (uid, payload)` is cocaq.api.munge's by
    default."""
    from cocaq.api import munge

    api = cfg.api

    def default_decode(cred: str) -> tuple[int, bytes]:
        c = munge.decode(cred, socket=api.munge_socket)
        return c.uid, c.payload

    decode_fn = decode or default_decode
    pool = Pool(cfg.database_url)
    engine_box: list[Any] = []

    def engine() -> Any:
        if not engine_box:
            from cocaq.db.engine import make_engine

            engine_box.append(make_engine(cfg.database_url))
        return engine_box[0]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.close()
        if engine_box:
            engine_box[0].dispose()

    app = FastAPI(
        lifespan=lifespan,
        title="cocaq read API",
        version=__version__,
        description="Energy and CO2 of Slurm jobs, per job, user and lab. Authenticate with MUNGE: "
        "`Authorization: MUNGE <credential>`, the credential's payload `cocaq-api METHOD PATH`.",
    )

    @app.middleware("http")
    async def server_timing(request: Request, call_next: Any) -> Any:
        """What the server spent on a request (`Server-Timing: app;dur=MS`), for clients and benchmarks."""
        t0 = time.perf_counter()
        response = await call_next(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1000:.2f}"
        return response

    @app.exception_handler(CocaqError)
    def _cocaq_error(request: Request, exc: CocaqError) -> JSONResponse:
        """A name the database has never seen is a 404 with the reason wherever it is checked (the
        client exits 2 on it, as the CLI does without the API); a database down, 503; the rest, 400."""
        from cocaq.footprint.lookup import UnknownName

        status = 404 if isinstance(exc, UnknownName) else 503 if isinstance(exc, DatabaseError) else 400
        return JSONResponse({"detail": str(exc)}, status_code=status)

    def caller(request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, cred = header.partition(" ")
        if scheme.upper() != "MUNGE" or not cred.strip():
            raise HTTPException(401, "authenticate with MUNGE: send `Authorization: MUNGE <credential>`")
        try:
            uid, payload = decode_fn(cred.strip())
        except munge.MungeError as exc:
            raise HTTPException(401, f"MUNGE credential refused: {exc}") from None
        if payload != payload_for(request.method, request.url.path):
            raise HTTPException(401, "MUNGE credential refused: it was made for another request")
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise HTTPException(401, f"uid {uid} is not a user here") from None
        admin = pw.pw_name in api.admin_users or bool(
            api.admin_groups and _groups(pw.pw_name, pw.pw_gid) & set(api.admin_groups)
        )
        heads = frozenset(a for a, users in api.lab_heads.items() if pw.pw_name in users)
        return Caller(pw.pw_name, uid, admin, heads)

    def get(path: str, summary: str) -> Any:
        # The dicts go out as they are: validating them against `dict` cost a turn through the threadpool.
        return app.get(path, summary=summary, response_model=None)

    Who = Annotated[Caller, Depends(caller)]
    Since = Annotated[str, Query(pattern=WHEN, description=WHEN_DOC)]
    Until = Annotated[str | None, Query(pattern=WHEN)]
    ClusterQ = Annotated[str | None, Query(pattern=NAME)]
    Top = Annotated[int, Query(ge=0, le=1000)]

    def window(since: str, until: str | None) -> Any:
        from cocaq.footprint.lookup import parse_window

        try:
            w = parse_window(since, until, UTC)
        except (ValueError, CocaqError) as exc:
            raise HTTPException(400, f"bad time: {exc}") from None
        if w.until <= w.since:
            raise HTTPException(400, "empty window: until is not after since")
        return w

    def known(answer: Any) -> Any:
        """A name the database has never seen is a 404 with the reason (the CLI exits 2 on it)."""
        from cocaq.footprint.lookup import UnknownName

        try:
            return answer()
        except UnknownName as exc:
            raise HTTPException(404, str(exc)) from None

    def member_of(db: Db, user: str, account: str) -> bool:
        return bool(
            db.rows(
                "SELECT 1 FROM jobs WHERE user_name = %(u)s AND account = %(a)s LIMIT 1",
                {"u": user, "a": account},
            )
        )

    def headed_labs(db: Db, who: Caller, user: str) -> tuple[str, ...]:
        """The labs `who` heads that `user` ran jobs in: all a lab head may see of that user."""
        return tuple(a for a in sorted(who.heads) if member_of(db, user, a))

    @get("/v1/whoami", summary="Who the credential says you are, and what you may see")
    def whoami(who: Who) -> dict[str, Any]:
        return {"user": who.user, "uid": who.uid, "admin": who.admin, "lab_head_of": sorted(who.heads)}

    @get("/v1/users/{user}", summary="A user's footprint over a window (as `cocaq user -o json`)")
    def user_footprint(
        who: Who,
        user: Annotated[str, Path(pattern=NAME)],
        since: Since = "30d",
        until: Until = None,
        cluster: ClusterQ = None,
        top: Top = 5,
        from_jobs: bool = False,
    ) -> dict[str, Any]:
        from cocaq.footprint.lookup import user_answer

        w = window(since, until)
        with pool.db() as db:
            within: tuple[str, ...] | None = None
            if not (user == who.user or who.admin):
                # a lab head sees a member's jobs in the labs they head, never those in other labs
                within = headed_labs(db, who, user)
                if not within:
                    raise HTTPException(403, f"{who.user} may not see user {user}'s footprint")
            return known(
                lambda: user_answer(
                    db, cfg, user, w, cluster=cluster, top=top, from_jobs=from_jobs, within=within
                )
            )

    @get("/v1/labs/{account}", summary="A lab's totals; its users and jobs for its heads and admins")
    def lab_footprint(
        who: Who,
        account: Annotated[str, Path(pattern=NAME)],
        since: Since = "30d",
        until: Until = None,
        cluster: ClusterQ = None,
        top: Top = 5,
        from_jobs: bool = False,
    ) -> dict[str, Any]:
        from cocaq.footprint.lookup import lab_answer

        w = window(since, until)
        with pool.db() as db:
            full = who.admin or account in who.heads
            if not full and not member_of(db, who.user, account):
                raise HTTPException(403, f"{who.user} is not a member of lab {account}")
            d = known(
                lambda: lab_answer(
                    db,
                    cfg,
                    account,
                    w,
                    cluster=cluster,
                    top=top if full else 0,
                    from_jobs=from_jobs,
                    check=full,
                )
            )
        if not full:  # a member sees the lab's totals, not the other members, their jobs or advice
            d["users"] = [u for u in d.get("users", []) if u.get("user") == who.user]
            d["top_jobs"] = []
            d["advice"] = [a for a in d.get("advice", []) if a.get("user") == who.user]
            d["restricted"] = True
        return d

    @get(
        "/v1/jobs/{job_id}",
        summary="One job, an array's tasks or a het job's components (as `cocaq job -o json`)",
    )
    def job(
        who: Who, job_id: Annotated[str, Path(pattern=JOB_OR_ARRAY)], cluster: ClusterQ = None
    ) -> dict[str, Any]:
        """A job id's jobs (ids repeat across clusters and after a reset) and, for a base id (123), an
        array's tasks or a het job's components (cocaq.footprint.job_parts; an array's task list
        123_[0-9]: those tasks): only the parts the caller may see, each judged as a job is."""
        from cocaq.db.dbapi import wrap
        from cocaq.footprint.job_parts import job_parts, parse_job_ask, wholes
        from cocaq.footprint.lookup import check_names
        from cocaq.footprint.one_job import find_jobs

        ask = parse_job_ask(job_id)
        with engine().connect() as conn:
            check_names(wrap(conn), cluster=cluster)  # an unknown cluster: 404, not "not found"
            jobs = find_jobs(conn, ask.job_id, cluster, cfg) if ask.job_id is not None else []
            parts = job_parts(conn, ask, cluster)

        def visible(j: dict[str, Any]) -> bool:
            return who.admin or j.get("user_name") == who.user or j.get("account") in who.heads

        mine = [j for j in jobs if visible(j)]
        my_parts = [p for p in parts if visible(p)]
        if not mine and not my_parts:  # not there and not yours read the same, from the same work
            raise HTTPException(403, f"job {ask.text}: not found, or not yours")
        # (FastAPI writes datetimes as ISO text, as cocaq.cli.terminal does)
        return {
            "jobs": mine,
            "arrays": wholes(my_parts, ask, "array"),
            "het_jobs": wholes(my_parts, ask, "het"),
        }

    @get("/v1/live", summary="Running jobs measured so far (as `cocaq watch -o json`): by id or a user's")
    def live_jobs(
        who: Who,
        jobs: Annotated[str | None, Query(pattern=LIVE_JOBS, description="job ids, comma-separated")] = None,
        user: Annotated[str | None, Query(pattern=NAME)] = None,
        cluster: ClusterQ = None,
        window: Annotated[float, Query(ge=60, le=6 * 3600, description="seconds of recent samples")] = 600.0,
    ) -> dict[str, Any]:
        from cocaq.footprint.live import Ask, live

        if (jobs is None) == (user is None):
            raise HTTPException(400, "ask for jobs=ID[,ID...] or user=NAME")
        if user is not None and user != who.user and not (who.admin or who.heads):
            raise HTTPException(403, f"{who.user} may not see user {user}'s jobs")
        ask = Ask(user=user, cluster=cluster)
        if jobs is not None:
            ask = Ask(job_ids=tuple(jobs.split(",")), cluster=cluster)
        with pool.db() as db:
            views = live(db, cfg, ask, window_s=window)
        # only one's own jobs, a headed lab's, or all for an admin: the same rule as /v1/jobs
        mine = [v for v in views if who.admin or v.get("user") == who.user or v.get("account") in who.heads]
        if jobs is not None and not mine:
            raise HTTPException(403, f"job {jobs}: not found, or not yours")
        return {"jobs": mine}

    @get("/v1/models", summary="Energy and CO2 by model and framework, runs, comparisons")
    def models(
        who: Who,
        since: Since = "30d",
        until: Until = None,
        user: Annotated[str | None, Query(pattern=NAME)] = None,
        account: Annotated[str | None, Query(pattern=NAME)] = None,
        cluster: ClusterQ = None,
    ) -> dict[str, Any]:
        from cocaq.db.dbapi import wrap
        from cocaq.footprint.by_model import model_stats
        from cocaq.footprint.lookup import check_names

        if user is not None and account is not None:
            raise HTTPException(400, "user and account exclude each other")
        if not who.admin:
            if account is not None and account not in who.heads:
                raise HTTPException(403, f"{who.user} does not head lab {account}")
            if account is None:
                user = user or who.user
                if user != who.user:  # a lab head asks for the lab (account=), which holds its members' runs
                    raise HTTPException(
                        403, f"{who.user} may not see user {user}'s models (lab heads: ask with account=LAB)"
                    )
        w = window(since, until)
        with engine().connect() as conn:
            check_names(wrap(conn), user=user, account=account, cluster=cluster)  # UnknownName: 404
            stats = model_stats(conn, w.since, w.until, user=user, account=account, cluster=cluster)
        return stats.as_dict()

    @get("/v1/top", summary="Users or labs by energy over a window (admins)")
    def top(
        who: Who,
        since: Since = "30d",
        until: Until = None,
        by: Annotated[str, Query(pattern="^(user|account|partition)$")] = "user",
        limit: Annotated[int, Query(ge=1, le=1000)] = 20,
        cluster: ClusterQ = None,
    ) -> dict[str, Any]:
        from cocaq.accounting.sessions import Sessions
        from cocaq.footprint.totals import group_totals

        if not who.admin:
            raise HTTPException(403, f"{who.user} is not an admin: top lists are for admins")
        w = window(since, until)
        with pool.db() as db:
            rows = group_totals(db, w, by, cluster=cluster, sessions=Sessions.of(cfg.advice))[:limit]
        return {"since": w.since.isoformat(), "until": w.until.isoformat(), "by": by, "rows": rows}

    @get("/v1/export/{table}", summary="A table's rows over a window, a page at a time (as `cocaq export`)")
    def export(
        who: Who,
        table: Annotated[str, Path(pattern=NAME)],
        since: Since = "30d",
        until: Until = None,
        user: Annotated[str | None, Query(pattern=NAME)] = None,
        account: Annotated[str | None, Query(pattern=NAME)] = None,
        cluster: ClusterQ = None,
        after: Annotated[int, Query(ge=0, le=2**63 - 1, description="the previous page's `next`")] = 0,
        limit: Annotated[int, Query(ge=1, le=50_000)] = 10_000,
    ) -> Response:
        """Rows of cocaq.footprint.export_rows (what cocaq.frames reads): one's own, a headed lab's
        (and what a lab head may see of a member: their jobs in the labs they head), everything for
        admins; `sent` and `study_arms` for admins only."""
        from cocaq.footprint import export_rows as ex

        if table not in ex.COLUMNS:
            raise HTTPException(404, f"no table {table!r}: export one of {', '.join(ex.TABLES)}")
        w = window(since, until)
        with pool.db() as db:
            within: tuple[str, ...] | None = None
            if not who.admin:
                if table in ex.ADMIN_ONLY:
                    raise HTTPException(403, f"{who.user} is not an admin: {table} is for admins")
                if account is not None and account not in who.heads and user != who.user:
                    mine = f"your own rows in it: user={who.user}"
                    raise HTTPException(403, f"{who.user} does not head lab {account} ({mine})")
                if account is None:
                    user = user or who.user
                    if user != who.user:
                        within = headed_labs(db, who, user)
                        if not within:
                            raise HTTPException(403, f"{who.user} may not see user {user}'s rows")
            page = ex.read(
                db, table, w, user=user, account=account, cluster=cluster, within=within, after=after,
                limit=limit,
            )  # fmt: skip
        rows = [[v.isoformat() if isinstance(v, datetime) else v for v in r] for r in page.rows]
        return JSONResponse(
            {"table": table, "since": w.since.isoformat(), "until": w.until.isoformat(),
             "columns": list(page.columns), "rows": rows, "next": page.next}
        )  # fmt: skip

    # --- GET /metrics: the site's figures for Prometheus (cocaq.api.site_metrics), off by default -----
    metrics_token = _metrics_token(api.metrics_token_file) if api.metrics else None

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """No MUNGE (Prometheus cannot make it): labs' totals only, behind a bearer token if one is set."""
        from cocaq.api import site_metrics

        if not api.metrics:
            raise HTTPException(404, "metrics are off: set [api] metrics = true")
        if metrics_token is not None:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), metrics_token):
                raise HTTPException(
                    401, "send `Authorization: Bearer <token>` ([api] metrics_token_file)",
                    headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip

        def read() -> site_metrics.Site:
            with pool.db() as db, engine().connect() as conn:
                return site_metrics.read_site(db, conn, cfg, datetime.now(UTC))

        body, content_type = site_metrics.exposition(read, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    return app


def _metrics_token(path: str | None) -> bytes | None:
    """The bearer token GET /metrics requires, read once at start (None: no file configured)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            token = f.read(4097).strip()
    except OSError as exc:
        raise ConfigError(f"[api] metrics_token_file: cannot read {path}: {exc.strerror or exc}") from None
    if not token or len(token) > 4096 or b"\n" in token:
        raise ConfigError(f"[api] metrics_token_file: {path} must hold one token (1 to 4096 bytes, one line)")
    return token
