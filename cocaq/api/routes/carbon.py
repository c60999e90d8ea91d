"""GET /v1/carbon/when: the best start for a job of some hours (as `cocaq carbon when -o json`), to any
authenticated caller: the grid's intensity is nobody's private data."""

from datetime import UTC
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from cocaq.api.deps import WHEN, Context, Who
from cocaq.errors import CocaqError
from cocaq.units import S_PER_HOUR

router = APIRouter()


@router.get(
    "/v1/carbon/when",
    summary="When to start a job of `hours` to emit the least CO2 (as `cocaq carbon when -o json`)",
    response_model=None,
)
def carbon_when(
    who: Who,
    ctx: Context,
    hours: Annotated[float, Query(gt=0, le=24 * 31, description="how long the job runs")],
    within: Annotated[float, Query(ge=0, le=31 * 24, description="hours it may wait to start")] = 24.0,
    at: Annotated[str, Query(pattern=WHEN, description="plan as if submitted then")] = "now",
    weeks: Annotated[int, Query(ge=1, le=52)] = 4,
) -> dict[str, Any]:
    from cocaq.carbon.when_answer import as_dict, plan_and_line
    from cocaq.footprint.totals import now_utc
    from cocaq.timeparse import parse_when

    try:
        when = parse_when(at, now_utc(), UTC)
        with ctx.engine().connect() as conn:
            p, line = plan_and_line(conn, ctx.cfg, hours, within * float(S_PER_HOUR), at=when, weeks=weeks)
    except (ValueError, CocaqError) as exc:
        raise HTTPException(400, str(exc)) from None
    return as_dict(p, line)
