"""GET /v1/status: how fresh the figures are (cocaq.footprint.freshness), to any authenticated caller."""

from typing import Any

from fastapi import APIRouter

from cocaq.api.deps import Context, Who

router = APIRouter()


@router.get(
    "/v1/status",
    summary="When accounting was last imported, how far the rollups go, the last node shipment",
    response_model=None,
)
def status(who: Who, ctx: Context) -> dict[str, Any]:
    from cocaq.footprint.freshness import freshness

    with ctx.pool.db() as db:
        return freshness(db)
