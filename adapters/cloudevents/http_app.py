"""The HTTP door: health now, CloudEvents (binary and structured mode) later.

Why a factory taking the server's state: the app must answer ``/healthz``
truthfully while the process is starting, serving and stopping, and later
its CloudEvents routes need the MessagingProcessor; both live on the state
object that ``gateway.server`` owns, so the app keeps no globals and tests can
build one app per server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse

if TYPE_CHECKING:  # imported for type hints only: gateway.server imports this module
    from gateway.server import ServerState


def create_app(state: ServerState) -> FastAPI:
    """Build the FastAPI app for one server; ``state.phase`` drives ``/healthz``."""
    app = FastAPI(title="unimq", docs_url=None, redoc_url=None, openapi_url="/openapi.json")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """200 ``{"status": "ok"}`` once every door and the store are up; 503 otherwise.

        Load balancers and the tests poll this, so it must turn 503 again when
        shutdown begins, before the doors close.
        """
        if state.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": state.phase}, status_code=503)

    return app
