"""The HTTP door's operations routes: ``/healthz``, ``/metrics``, the offline ``/docs`` and the console ``/ui``.

Why apart from the messaging routes: these answer whatever the process's
phase (``/healthz`` turns 503 while starting and again from the first signal
of a shutdown, before the doors close, so load balancers and tests can trust
it), and need no processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response

from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import UnimqCollector

if TYPE_CHECKING:  # imported for type hints only
    from gateway.door import ServerState

__all__ = ["CONSOLE_DIR", "DOCS_ASSETS", "router", "serve_console", "serve_docs"]

DOCS_ASSETS = "/docs/assets"


def serve_docs(app: FastAPI, openapi_url: str = "/openapi.json", mount_assets: bool = True) -> None:
    """Swagger UI at /docs with its script and styles from the installed ``swagger-ui-bundle``
    package (FastAPI's default page loads them from a CDN and is blank without internet).
    ``mount_assets=False``: the door's app serves them already (for an app mounted in it, such as
    the admin API, whose page points at the door's copy)."""
    import swagger_ui_bundle
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    if mount_assets:
        app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title="unimq - API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        )


CONSOLE_DIR = Path(__file__).with_name("console")


def serve_console(app: FastAPI) -> None:
    """The console at /ui: static files installed with the package (no CDN: it works offline),
    reading the JSON admin API (``http_console``)."""
    from fastapi.responses import RedirectResponse
    from fastapi.staticfiles import StaticFiles

    @app.get("/ui", include_in_schema=False)
    async def console_root() -> Response:
        return RedirectResponse("/ui/")

    app.mount("/ui/", StaticFiles(directory=CONSOLE_DIR, html=True), name="console")


def router(state: ServerState[Any], collector: UnimqCollector) -> APIRouter:
    """Health (from ``state.phase``) and Prometheus metrics (from ``collector``)."""
    router = APIRouter()

    @router.get("/healthz", tags=["ops"])
    async def healthz() -> JSONResponse:
        """200 ``{"status": "ok"}`` once every door and the store are up; 503 otherwise.

        Load balancers and the tests poll this, so it must turn 503 again when
        shutdown begins, before the doors close.
        """
        if state.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": state.phase}, status_code=503)

    @router.get("/metrics", tags=["ops"], response_class=Response,
                responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics() -> Response:
        """Prometheus metrics: messages in/out per door and topic, consumer lag, store bytes, flush latency."""
        return Response(await collector.render(), media_type=METRICS_CONTENT_TYPE)

    return router
