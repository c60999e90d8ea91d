"""GET /v1/labs/{account}: a lab's totals to its members; its users, jobs and advice too to its heads
and admins."""

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from cocaq.api.deps import ClusterQ, Context, NamePath, Since, Top, Until, Who, known, member_of, window

router = APIRouter()


@router.get(
    "/v1/labs/{account}",
    summary="A lab's totals; its users and jobs for its heads and admins",
    response_model=None,
)
def lab_footprint(
    who: Who,
    ctx: Context,
    account: NamePath,
    since: Since = "30d",
    until: Until = None,
    cluster: ClusterQ = None,
    top: Top = 5,
    from_jobs: bool = False,
) -> JSONResponse:
    from cocaq.footprint.lookup import lab_answer

    w = window(since, until)
    with ctx.pool.db() as db, ctx.pool.spare() as beside:
        full = who.admin or account in who.heads
        if not full and not member_of(db, who.user, account):
            raise HTTPException(403, f"{who.user} is not a member of lab {account}")
        d = known(
            lambda: lab_answer(
                db,
                ctx.cfg,
                account,
                w,
                cluster=cluster,
                top=top if full else 0,
                from_jobs=from_jobs,
                check=full,
                beside=beside,
            )
        )
    if not full:  # a member sees the lab's totals, not the other members, their jobs or advice
        d["users"] = [u for u in d.get("users", []) if u.get("user") == who.user]
        d["top_jobs"] = []
        d["advice"] = [a for a in d.get("advice", []) if a.get("user") == who.user]
        d["restricted"] = True
    return JSONResponse(d)  # (JSON-ready already, as /v1/users answers)
