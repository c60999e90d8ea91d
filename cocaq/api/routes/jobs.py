"""GET /v1/jobs/{job_id}: one job, an array's tasks or a het job's components, those the caller may see."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path

from cocaq.api.deps import JOB_OR_ARRAY, ClusterQ, Context, Who

router = APIRouter()


@router.get(
    "/v1/jobs/{job_id}",
    summary="One job, an array's tasks or a het job's components (as `cocaq job -o json`)",
    response_model=None,
)
def job(
    who: Who, ctx: Context, job_id: Annotated[str, Path(pattern=JOB_OR_ARRAY)], cluster: ClusterQ = None
) -> dict[str, Any]:
    """A job id's jobs (ids repeat across clusters and after a reset) and, for a base id (123), an
    array's tasks or a het job's components (cocaq.footprint.job_parts; an array's task list
    123_[0-9]: those tasks): only the parts the caller may see, each judged as a job is."""
    from cocaq.db.dbapi import wrap
    from cocaq.footprint.job_parts import job_parts, parse_job_ask, wholes
    from cocaq.footprint.lookup import check_names
    from cocaq.footprint.one_job import find_jobs

    ask = parse_job_ask(job_id)
    with ctx.engine().connect() as conn:
        check_names(wrap(conn), cluster=cluster)  # an unknown cluster: 404, not "not found"
        jobs = find_jobs(conn, ask.job_id, cluster, ctx.cfg) if ask.job_id is not None else []
        parts = job_parts(conn, ask, cluster)

    def visible(j: dict[str, Any]) -> bool:
        return who.admin or j.get("user_name") == who.user or j.get("account") in who.heads

    mine = [j for j in jobs if visible(j)]
    my_parts = [p for p in parts if visible(p)]
    if not mine and not my_parts:  # not there and not yours read the same, from the same work
        raise HTTPException(403, f"job {ask.text}: not found, or not yours")
    # (FastAPI writes datetimes as ISO text, as cocaq.cli.terminal does)
    return {
        "jobs": mine,
        "arrays": wholes(my_parts, ask, "array"),
        "het_jobs": wholes(my_parts, ask, "het"),
    }
