"""GET /v1/users/{user}: a user's footprint, to themselves, their lab heads (within the labs they
head) and admins."""

from typing import Any

from fastapi import APIRouter, HTTPException

from cocaq.api.deps import ClusterQ, Context, NamePath, Since, Top, Until, Who, headed_labs, known, window

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
) -> dict[str, Any]:
    from cocaq.footprint.lookup import user_answer

    w = window(since, until)
    with ctx.pool.db() as db:
        within: tuple[str, ...] | None = None
        if not (user == who.user or who.admin):
            # a lab head sees a member's jobs in the labs they head, never those in other labs
            within = headed_labs(db, who, user)
            if not within:
                raise HTTPException(403, f"{who.user} may not see user {user}'s footprint")
        return known(
            lambda: user_answer(
                db, ctx.cfg, user, w, cluster=cluster, top=top, from_jobs=from_jobs, within=within
            )
        )
