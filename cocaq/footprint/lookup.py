"""What `cocaq user`, `cocaq lab` and the read API's /v1/users and /v1/labs answer, built once for both.

The CLI (reading the database on an admin's machine) and the API server (answering login nodes) show the
same footprint: the window parsed from the same `--since/--until` words, the names checked the same way,
the totals, top jobs and advice computed by the same calls, and the query sent from one to the other with
the same parameters; a name nowhere in the database is refused the same way (`check_names`,
`UnknownName`) and the advice is picked the same way (`add_advice`). Each front-end keeps only what is
its own: how an error reaches the person (an exit code or an HTTP status) and who may see what.
Stdlib-only at import beyond cocaq.footprint.totals: `cocaq user` runs on every login node
(tests/test_user_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import tzinfo
from typing import TYPE_CHECKING, Any

from cocaq.accounting.sessions import Sessions
from cocaq.errors import UsageError
from cocaq.footprint.totals import Footprint, Window, lab_footprint, now_utc, user_footprint
from cocaq.timeparse import parse_when

if TYPE_CHECKING:
    from cocaq.config import Config
    from cocaq.db.dbapi import Db
    from cocaq.footprint.advice import Thresholds
    from cocaq.footprint.advice_jobs import AdviceJobs
    from cocaq.footprint.jobfacts import JobFacts


class UnknownName(UsageError):
    """A user, lab or cluster the database has never seen (a typo, most likely): exit 2, not "no jobs"."""


def check_names(
    db: Db, *, user: str | None = None, account: str | None = None, cluster: str | None = None
) -> None:
    """Raise UnknownName for a name that is nowhere: a user with no job ever, no `users` row and no
    account on this machine; a lab (Slurm account) no job ever ran under; a cluster not in the database.
    A name that exists but had no jobs in the window is not an error: its footprint is all zeros."""
    if cluster and not db.rows("SELECT 1 FROM clusters WHERE name = %(n)s", {"n": cluster}):
        known = [r[0] for r in db.rows("SELECT name FROM clusters ORDER BY name")]
        raise UnknownName(f"no cluster named {cluster!r} (known: {', '.join(known) or 'none yet'})")
    if user is not None and not (
        db.rows("SELECT 1 FROM jobs WHERE user_name = %(n)s LIMIT 1", {"n": user})
        or db.rows("SELECT 1 FROM users WHERE name = %(n)s", {"n": user})
        or _local_user(user)
    ):
        raise UnknownName(
            f"no user {user!r}: no job of theirs was ever recorded and no such account exists here"
        )
    if account is not None and not db.rows(
        "SELECT 1 FROM jobs WHERE account = %(n)s LIMIT 1", {"n": account}
    ):
        raise UnknownName(
            f"no lab {account!r}: no job ever ran under that Slurm account "
            "(`sacctmgr show account` lists them)"
        )


def _local_user(name: str) -> bool:
    try:
        import pwd

        pwd.getpwnam(name)
    except (KeyError, ImportError, ValueError):
        return False
    return True


def advice_loader(
    cfg: Config,
    scope: str,
    key: str,
    w: Window,
    *,
    cluster: str | None = None,
    within: tuple[str, ...] | None = None,
    thresholds: Thresholds | None = None,
) -> Callable[[Db], AdviceJobs]:
    """What reads the jobs a user's or a lab's shown advice reads (cocaq.footprint.advice_jobs), on the
    connection it is given: the footprint's query needs none of it, so the two may run at once
    (cocaq.db.alongside)."""
    from cocaq.footprint import advice
    from cocaq.footprint.advice_jobs import load_for_advice

    user, account = (key, None) if scope == "user" else (None, key)
    ctx = advice.site_context(cfg, w.since, w.until, period="in this window", thresholds=thresholds)
    return lambda db: load_for_advice(
        db, cfg, ctx, w.since, w.until, user=user, account=account, cluster=cluster, within=within
    )


def add_advice(
    db: Db,
    cfg: Config,
    fp: Footprint,
    *,
    cluster: str | None = None,
    whole: bool = False,
    thresholds: Thresholds | None = None,
    loaded: AdviceJobs | None = None,
) -> Footprint:
    """Fill `fp.advice` from the window's jobs (cocaq.footprint.advice): a user's suggestions above the
    configured share of their energy, or a lab's members' largest each. Only the jobs a shown suggestion
    reads are loaded (cocaq.footprint.advice_jobs; `loaded`: read already, by `advice_loader`); `whole`:
    every job of the window, as the reports do (what tests compare the two with); `thresholds`: the
    rules' own, where not the defaults (tests)."""
    from cocaq.footprint import advice

    user, account = (fp.key, None) if fp.scope == "user" else (None, fp.key)
    ctx = advice.site_context(cfg, fp.since, fp.until, period="in this window", thresholds=thresholds)
    if whole:
        from cocaq.footprint import jobfacts

        jobs = jobfacts.load(
            db, cfg, fp.since, fp.until, user=user, account=account, cluster=cluster, within=fp.within
        )
        by_user: dict[str, list[JobFacts]] = {}
        for j in jobs:
            by_user.setdefault(j.user, []).append(j)
        got: dict[str, tuple[list[JobFacts], list[JobFacts] | None]] = {
            u: (js, None) for u, js in by_user.items()
        }
        total: float | None = None
        shift = True
    else:
        w = Window(fp.since, fp.until)
        aj = loaded or advice_loader(
            cfg, fp.scope, fp.key, w, cluster=cluster, within=fp.within, thresholds=thresholds
        )(db)
        got = {u: (x.jobs, x.precision_jobs) for u, x in aj.users.items()}
        total, shift = aj.co2_kg, aj.shift
    if fp.scope == "user":
        from cocaq.footprint.when_advice import settings, when_to_run

        jobs, gpu_jobs = got.get(fp.key, ([], None))
        fp.advice = [a.as_dict() for a in advice.advise_user(jobs, ctx, fp.totals.energy_kwh, cfg, gpu_jobs)]
        when = when_to_run(jobs if shift else [], settings(cfg), ctx.period, total)
        fp.when_to_run = when.as_dict() if when is not None else None
        return fp
    totals = {m["user"]: float(m["energy_kwh"]) for m in fp.members}
    pairs = advice.largest_per_user(
        {u: js for u, (js, _) in got.items()},
        totals,
        ctx,
        cfg,
        None if whole else {u: pj for u, (_, pj) in got.items() if pj is not None},
    )
    fp.advice = [{"user": u, **a.as_dict()} for u, a in pairs]
    return fp


def parse_window(since: str, until: str | None, tz: tzinfo | None = None) -> Window:
    """[since, until or now) from the words people type (30d, 12h, a date, an ISO time), dates read in
    `tz` (None: this machine's zone). Raises what `parse_when` raises; an empty window is the caller's to
    refuse (each says it its own way)."""
    now = now_utc()
    zone = now.astimezone().tzinfo if tz is None else tz
    return Window(parse_when(since, now, zone), parse_when(until, now, zone) if until else now)


def query_params(w: Window, cluster: str | None, top: int, from_jobs: bool) -> dict[str, Any]:
    """The API query for a footprint: the window as absolute times, so that the server reads them as the
    client meant them, whatever its zone."""
    p = {"since": w.since.isoformat(), "until": w.until.isoformat(), "cluster": cluster, "top": top}
    return {**p, "from_jobs": "true"} if from_jobs else p


def user_answer(
    db: Db,
    cfg: Config,
    user: str,
    w: Window,
    *,
    cluster: str | None = None,
    top: int = 5,
    from_jobs: bool = False,
    within: tuple[str, ...] | None = None,
    beside: Db | None = None,
) -> dict[str, Any]:
    """A user's footprint with its advice, as JSON-ready data; UnknownName for a name that is nowhere.
    `beside`: a second connection, for the advice's jobs to be read while the footprint's query runs."""
    from cocaq.db.alongside import Alongside

    loader = advice_loader(cfg, "user", user, w, cluster=cluster, within=within)
    with Alongside(db, beside, loader) as loading:
        check_names(db, user=user, cluster=cluster)
        fp = user_footprint(
            db,
            user,
            w,
            cluster=cluster,
            top=top,
            from_jobs=from_jobs,
            within=within,
            sessions=Sessions.of(cfg.advice),
        )
        return add_advice(db, cfg, fp, cluster=cluster, loaded=loading.result()).as_dict()


def lab_answer(
    db: Db,
    cfg: Config,
    account: str,
    w: Window,
    *,
    cluster: str | None = None,
    top: int = 5,
    from_jobs: bool = False,
    check: bool = True,
    beside: Db | None = None,
) -> dict[str, Any]:
    """A lab's totals, members and their advice, as JSON-ready data; with `check`, UnknownName for a lab
    no job ever ran under; `beside` as for `user_answer`."""
    from cocaq.db.alongside import Alongside

    with Alongside(db, beside, advice_loader(cfg, "account", account, w, cluster=cluster)) as loading:
        if check:
            check_names(db, account=account, cluster=cluster)
        fp = lab_footprint(
            db, account, w, cluster=cluster, top=top, from_jobs=from_jobs, sessions=Sessions.of(cfg.advice)
        )
        return add_advice(db, cfg, fp, cluster=cluster, loaded=loading.result()).as_dict()
