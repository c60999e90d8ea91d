"""GET /v1/live: running jobs measured so far, by id or a user's, those the caller may see."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from cocaq.api.deps import LIVE_JOBS, ClusterQ, Context, NameQ, Who
from cocaq.units import S_PER_HOUR

router = APIRouter()


@router.get(
    "/v1/live",
    summary="Running jobs measured so far (as `cocaq watch -o json`): by id or a user's",
    response_model=None,
)
def live_jobs(
    who: Who,
    ctx: Context,
    jobs: Annotated[str | None, Query(pattern=LIVE_JOBS, description="job ids, comma-separated")] = None,
    user: NameQ = None,
    cluster: ClusterQ = None,
    window: Annotated[
        float, Query(ge=60, le=6 * S_PER_HOUR, description="seconds of recent samples")
    ] = 600.0,
) -> dict[str, Any]:
    from cocaq.footprint.live import Ask, live

    if (jobs is None) == (user is None):
        raise HTTPException(400, "ask for jobs=ID[,ID...] or user=NAME")
    if user is not None and user != who.user and not (who.admin or who.heads):
        raise HTTPException(403, f"{who.user} may not see user {user}'s jobs")
    ask = Ask(user=user, cluster=cluster)
    if jobs is not None:
        ask = Ask(job_ids=tuple(jobs.split(",")), cluster=cluster)
    with ctx.pool.db() as db:
        views = live(db, ctx.cfg, ask, window_s=window)
    # only one's own jobs, a headed lab's, or all for an admin: the same rule as /v1/jobs
    mine = [v for v in views if who.admin or v.get("user") == who.user or v.get("account") in who.heads]
    if jobs is not None and not mine:
        raise HTTPException(403, f"job {jobs}: not found, or not yours")
    return {"jobs": mine}
