"""The HTTP door: CloudEvents and plain messages in, messages out (pull, pop, push), admin, health, metrics.

Why a factory taking the server's state: the app must answer ``/healthz``
truthfully while the process is starting, serving and stopping, and its
routes need the MessagingProcessor; both live on the state object that
the process (``unimq``) owns, so the app keeps no globals and tests can build one
app per server.

Why routers per concern: each concern is its own module with its own
``APIRouter`` (``http_ops``: health, metrics, docs; ``http_topics``: topic
admin; ``http_admin``: users and permissions; ``http_ingest``: CloudEvents and
plain messages in; ``http_pop``: pop,
ack, invisible time; ``http_read``: reads by offset, Arrow pages, a topic
merged, events by id; ``http_table``: a compacted topic as a table, compact now;
``http_push``: push subscriptions; ``http_console``: the console's views and actions,
in the admin API beside users and permissions), sharing what they
read from a request (``http_request``), what they answer (``http_responses``),
their documented shapes (``http_models``) and the error contract
(``http_errors``). :func:`create_app` only composes them, in an order that
matters: topic names may hold slashes, so a route whose path is a suffix of
another's comes after it (see :func:`create_app`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import FastAPI

from . import (http_admin, http_console, http_ingest, http_ops, http_pop, http_push, http_read, http_table, http_topics,
               http_trace)
from .http_auth import AuthMiddleware
from .http_certs import PeerCerts
from .http_connections import PeerLeases
from .http_errors import STATUS_OF_CODE, install_error_handlers
from .http_request import Deps
from .http_responses import send_json, send_list_json
from .metrics import UnimqCollector
from .push import PushManager

if TYPE_CHECKING:  # imported for type hints only
    from gateway.door import ServerState

__all__ = ["create_app", "STATUS_OF_CODE", "send_json", "send_list_json"]


def create_app(state: ServerState[Any], certs: PeerCerts | None = None, leases: PeerLeases | None = None) -> FastAPI:
    """Build the FastAPI app for one server; ``state.phase`` drives ``/healthz``; ``certs``: the
    HTTPS connections' client certificate names, when they are identities (``http_cert_identity``);
    ``leases``: the connections' slots under the traffic limits (``http_connections``)."""
    deps = Deps.of(state)
    push = PushManager(state.processor, getattr(state.settings, "http_push_allowed_hosts", []))
    collector = UnimqCollector(state.processor, push, state.clients,
                               getattr(state.settings, "http_metrics_max_topics", 100),
                               getattr(state.settings, "http_admin_controller", ""))
    state.clients.register(http_console.PushClients(push))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        processor = state.processor
        push.processor = processor
        collector.processor = processor
        if processor is not None:
            await push.start()
        try:
            yield
        finally:
            if push.started:
                await push.stop()

    app = FastAPI(
        title="unimq",
        version="1",
        description=(
            "The HTTP and CloudEvents door of unimq: post CloudEvents (binary, structured, batch) and plain "
            "messages; consume by pop (receipt handles, long polling) or by queue offset; push to webhooks. "
            "Errors are `{\"error\": CODE, \"message\": text}`."
        ),
        docs_url=None,  # served by http_ops from the installed swagger-ui-bundle: /docs works offline
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.unimq = state
    app.state.push = push
    http_ops.serve_docs(app)
    http_ops.serve_console(app)
    install_error_handlers(app)

    ingest, events_fast_path = http_ingest.routes(deps)
    # In this order: the queue-offset read (.../queues/{queue}/messages) before the topic read
    # (.../messages), and describe/delete (/v1/topics/{topic}, any suffix) after every other.
    for router in (
        http_ops.router(state, collector),
        http_topics.router(deps),
        ingest,
        http_pop.router(deps),
        http_read.router(deps),
        http_table.router(deps),
        http_topics.named_router(deps),
        http_push.router(deps, push),
        http_trace.router(deps),
    ):
        app.include_router(router)
    # The ingest hot path as a plain Starlette route placed before FastAPI's: same handler, same
    # exception handlers, minus FastAPI's per-request dependency solving (a path parameter and the
    # Request), which is a noticeable share of a one-event request. The APIRoute stays for the
    # OpenAPI document and /docs.
    app.router.routes.insert(0, events_fast_path)
    admin = http_admin.admin_app(deps)
    admin.include_router(http_console.router(deps))  # the console's views and actions, beside users and ACLs
    admin.include_router(http_trace.router(deps, prefix="", not_found=False))  # a message's trace, for the console and the CLI
    app.mount("/v1/admin", admin)
    # Basic / Bearer logins, checked against the process's identity store before any route runs.
    app.add_middleware(AuthMiddleware, state=state, certs=certs, leases=leases)
    return app
