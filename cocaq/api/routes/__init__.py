"""The read API's routes, one APIRouter per area, in ROUTERS in the order the app serves them (and
the OpenAPI document lists them).

The JSON routes say `response_model=None`: their dicts go out as they are, since validating them
against `dict` cost a turn through the threadpool.
"""

from cocaq.api.routes import carbon, export, jobs, labs, live, metrics, models, status, top, users, whoami

ROUTERS = (
    whoami.router,
    users.router,
    labs.router,
    jobs.router,
    live.router,
    models.router,
    top.router,
    export.router,
    status.router,
    carbon.router,
    metrics.router,
)
