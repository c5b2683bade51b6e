"""The HTTP door: the FastAPI app (``http_app``) served by uvicorn on the process's event loop.

With a certificate (``http_tls_cert`` or the shared ``tls_cert``) the same port
serves HTTPS only, from a context of ``gateway.tls`` (reloaded on SIGHUP).

Why uvicorn embedded rather than run stand-alone: the door must share the
loop, the signals and the shutdown order of the process that holds the store
(see ``embedded_uvicorn``); and the socket is bound here (``bind_socket``), so
port 0 reports the real port and a port in use is reported with its address.
"""

from __future__ import annotations

import asyncio

import uvicorn

from gateway.door import ServerState, bind_socket

from .embedded_uvicorn import EmbeddedUvicorn
from .http_app import create_app
from .http_certs import PeerCerts, protocol_class
from .http_connections import PeerLeases

__all__ = ["HttpDoor"]


class HttpDoor:
    """The HTTP door (``http_port``): CloudEvents, messages, admin, ``/healthz`` and ``/metrics``."""

    name = "http"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._server: EmbeddedUvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> tuple[str, int]:
        settings = self._state.settings
        files = settings.tls_files(settings.http_tls_cert, settings.http_tls_key)
        # HTTPS: uvicorn serves the door's own context (the one SIGHUP reloads, gateway.tls)
        tls = self._state.server_tls(files, "HTTPS door") if files is not None else None
        sock = bind_socket(settings.host, settings.http_port, reuse_port=settings.reuse_port)
        certs = PeerCerts() if tls is not None and getattr(settings, "http_cert_identity", False) else None
        # connections under the traffic limits (http_connections.py): wherever there is an identity store
        leases = PeerLeases() if getattr(self._state, "identities", None) is not None else None
        config = uvicorn.Config(
            create_app(self._state, certs, leases),
            log_level="warning",
            log_config=None,  # keep the process's logging setup (unimq.cli) instead of uvicorn's
            lifespan="on",  # the app's lifespan starts and stops the HTTP door's push deliveries
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        if tls is not None:
            config.load()  # serve() skips a loaded config; its ssl is then the door's context
            config.ssl = tls.context
        if certs is not None or leases is not None:  # per-connection state (http_certs.py)
            if not config.loaded:
                config.load()
            config.http_protocol_class = protocol_class(config.http_protocol_class, certs, leases)
        server = EmbeddedUvicorn(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="unimq-http")
        while not server.started:
            if self._task.done():
                sock.close()
                exc = self._task.exception() if not self._task.cancelled() else None
                raise RuntimeError(f"http door failed to start: {exc!r}") from exc
            await asyncio.sleep(0.01)
        bound = sock.getsockname()
        return bound[0], bound[1]

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except (asyncio.CancelledError, SystemExit):  # uvicorn may sys.exit on odd failures
            pass
