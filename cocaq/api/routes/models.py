"""GET /v1/models: energy and CO2 by model and framework, of the caller's runs, a headed lab's or (for
admins) anyone's."""

from typing import Any

from fastapi import APIRouter, HTTPException

from cocaq.api.deps import ClusterQ, Context, NameQ, Since, Until, Who, window

router = APIRouter()


@router.get(
    "/v1/models", summary="Energy and CO2 by model and framework, runs, comparisons", response_model=None
)
def models(
    who: Who,
    ctx: Context,
    since: Since = "30d",
    until: Until = None,
    user: NameQ = None,
    account: NameQ = None,
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
    with ctx.engine().connect() as conn:
        check_names(wrap(conn), user=user, account=account, cluster=cluster)  # UnknownName: 404
        stats = model_stats(conn, w.since, w.until, user=user, account=account, cluster=cluster)
    return stats.as_dict()
