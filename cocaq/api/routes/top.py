"""GET /v1/top: users, labs or partitions by energy over a window, for admins."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from cocaq.api.deps import ClusterQ, Context, Since, Until, Who, window

router = APIRouter()


@router.get("/v1/top", summary="Users or labs by energy over a window (admins)", response_model=None)
def top(
    who: Who,
    ctx: Context,
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
    with ctx.pool.db() as db:
        rows = group_totals(db, w, by, cluster=cluster, sessions=Sessions.of(ctx.cfg.advice))[:limit]
    return {"since": w.since.isoformat(), "until": w.until.isoformat(), "by": by, "rows": rows}
