"""`cocaq serve`: the read-only HTTP JSON API that login nodes' `cocaq user` talks to (docs/api.md).

Who asks is proven with MUNGE, which every Slurm cluster runs: the client sends a credential made by its
local munged (`Authorization: MUNGE <credential>`), whose payload names the request (`cocaq-api GET
/v1/users/alice`), so a credential seen on the wire cannot be spent on another request; munged refuses
it if it is expired or replayed. The uid it carries is the caller.

What they may see: their own jobs and footprint, their labs' totals (not the other members' rows or
jobs), everything of a lab they head (`[api] lab_heads`), everything if they are an admin (`[api]
admin_users`, members of `[api] admin_groups`). Anything else is 403 with a one-line reason; a job that
does not exist and a job of someone else get the same answer, from the same queries.

The same queries as the CLI's (cocaq.footprint.totals, cocaq.footprint.by_model), so the output is the same
either way. The routes live in cocaq.api.routes, one module per area, and what they share (the caller,
the window, the parameters' patterns) in cocaq.api.deps; this module makes the app and wires them.
"""

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cocaq import __version__
from cocaq.api.context import ApiContext, Decode
from cocaq.api.deps import munge_decoder
from cocaq.api.routes import ROUTERS
from cocaq.api.routes.metrics import metrics_token
from cocaq.config import Config
from cocaq.errors import CocaqError, DatabaseError
from cocaq.units import MS_PER_S


def create_app(cfg: Config, *, decode: Decode | None = None) -> FastAPI:
    """The API over `cfg`'s database. `decode(credential) -> (uid, payload)` is cocaq.api.munge's by
    default."""
    api = cfg.api
    token = metrics_token(api.metrics_token_file) if api.metrics else None
    app = FastAPI(
        lifespan=_lifespan,
        title="cocaq read API",
        version=__version__,
        description="Energy and CO2 of Slurm jobs, per job, user and lab. Authenticate with MUNGE: "
        "`Authorization: MUNGE <credential>`, the credential's payload `cocaq-api METHOD PATH`.",
    )
    app.state.context = ApiContext(cfg, decode or munge_decoder(api.munge_socket), token)
    app.middleware("http")(server_timing)
    app.exception_handler(CocaqError)(_cocaq_error)
    for router in ROUTERS:
        app.include_router(router)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.context.close()


async def server_timing(request: Request, call_next: Any) -> Any:
    """What the server spent on a request (`Server-Timing: app;dur=MS`), for clients and benchmarks."""
    t0 = time.perf_counter()
    response = await call_next(request)
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * MS_PER_S:.2f}"
    return response


def _cocaq_error(request: Request, exc: CocaqError) -> JSONResponse:
    """A name the database has never seen is a 404 with the reason wherever it is checked (the
    client exits 2 on it, as the CLI does without the API); a database down, 503; the rest, 400."""
    from cocaq.footprint.lookup import UnknownName

    status = 404 if isinstance(exc, UnknownName) else 503 if isinstance(exc, DatabaseError) else 400
    return JSONResponse({"detail": str(exc)}, status_code=status)
