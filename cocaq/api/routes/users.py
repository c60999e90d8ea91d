"""GET /v1/users/{user}: a user's footprint, to themselves, their lab heads (within the labs they
head) and admins."""

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse

from cocaq.api.deps import (
    NAME,
    Caller,
    ClusterQ,
    Context,
    NamePath,
    Since,
    Top,
    Until,
    Who,
    headed_labs,
    known,
    window,
)
from cocaq.db.dbapi import Db

router = APIRouter()


@router.get(
    "/v1/users/{user}",
    summary="A user's footprint over a window (as `cocaq user -o json`)",
    response_model=None,
)
def user_footprint(
    who: Who,
    ctx: Context,
    user: NamePath,
    since: Since = "30d",
    until: Until = None,
    cluster: ClusterQ = None,
    top: Top = 5,
    from_jobs: bool = False,
) -> JSONResponse:
    from cocaq.footprint.lookup import user_answer

    w = window(since, until)
    with ctx.pool.db() as db, ctx.pool.spare() as beside:
        within = may_see(db, who, user)
        d = known(
            lambda: user_answer(
                db, ctx.cfg, user, w, cluster=cluster, top=top, from_jobs=from_jobs, within=within,
                beside=beside,
            )
        )  # fmt: skip
    return JSONResponse(d)  # (JSON-ready already: FastAPI's encoder walked a heavy user's 10,000 job ids)


def may_see(db: Db, who: Caller, user: str) -> tuple[str, ...] | None:
    """None: all of `user`'s jobs (their own, or an admin asks); else the labs `who` heads that `user`
    ran in, all a lab head may see of a member; 403 if none."""
    if user == who.user or who.admin:
        return None
    within = headed_labs(db, who, user)  # never the member's jobs in other labs
    if not within:
        raise HTTPException(403, f"{who.user} may not see user {user}'s footprint")
    return within


NameFilter = Annotated[str | None, Query(pattern=NAME)]


@router.get(
    "/v1/users/{user}/jobs",
    summary="A user's jobs in a window: filtered, sorted and paged by the database",
    response_model=None,
)
def user_jobs(
    who: Who,
    ctx: Context,
    user: NamePath,
    since: Since = "30d",
    until: Until = None,
    cluster: ClusterQ = None,
    state: Annotated[str | None, Query(pattern=r"^[A-Z_]{1,32}$")] = None,
    partition: NameFilter = None,
    model: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    name: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    sort: Annotated[str, Query(pattern=r"^[a-z]{1,16}$")] = "end",
    descending: bool = True,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    from cocaq.footprint.job_list import Filters, list_jobs

    w = window(since, until)
    with ctx.pool.db() as db:
        within = may_see(db, who, user)
        return known(
            lambda: list_jobs(
                db, user, w, filters=Filters(state, partition, model, name), sort=sort,
                descending=descending, offset=offset, limit=limit, cluster=cluster, within=within,
            )
        )  # fmt: skip


MONTH = r"^[0-9]{4}-(0[1-9]|1[0-2])$"


@router.get(
    "/v1/users/{user}/month",
    summary="A user's month: the monthly e-mail (text, HTML) and its figures (trend, rank)",
    response_model=None,
)
def user_month(
    who: Who,
    ctx: Context,
    user: NamePath,
    month: Annotated[str, Query(pattern=MONTH, description="YYYY-MM (UTC)")],
    cluster: ClusterQ = None,
) -> dict[str, Any]:
    """The e-mail is the user's whole month: a lab head, who sees a member only within the labs they
    head, is refused it (the lab's own month is theirs)."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint.lookup import check_names
    from cocaq.reports.month_answer import month_answer

    if not (user == who.user or who.admin):
        raise HTTPException(403, f"{who.user} may not see user {user}'s month")
    if not 1970 <= int(month[:4]) <= 2200:  # (its shape: MONTH, checked by FastAPI)
        raise HTTPException(400, f"bad month {month!r}: expected YYYY-MM, 1970 to 2200")
    start = datetime(int(month[:4]), int(month[5:]), 1, tzinfo=UTC)
    with ctx.engine().connect() as conn:
        known(lambda: check_names(wrap(conn), user=user, cluster=cluster))
        return month_answer(conn, ctx.cfg, user, start, cluster=cluster)
