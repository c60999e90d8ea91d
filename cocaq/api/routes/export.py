"""GET /v1/export/{table}: a table's rows over a window, a page at a time, those the caller may see
(what cocaq.frames reads over the API)."""

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import JSONResponse, Response

from cocaq.api.deps import NAME, ClusterQ, Context, NameQ, Since, Until, Who, headed_labs, window

router = APIRouter()


@router.get(
    "/v1/export/{table}",
    summary="A table's rows over a window, a page at a time (as `cocaq export`)",
    response_model=None,
)
def export(
    who: Who,
    ctx: Context,
    table: Annotated[str, Path(pattern=NAME)],
    since: Since = "30d",
    until: Until = None,
    user: NameQ = None,
    account: NameQ = None,
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
    with ctx.pool.db() as db:
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
