"""HTTPS client certificates as identities (``http_cert_identity``): which connection carries which CN;
and the connection slots of the traffic limits (``http_connections``), which follow the same connections.

Why a table beside uvicorn: an ASGI scope names its connection only by the
peer's address (``scope["client"]``) and carries no TLS details in uvicorn, so
the door's HTTP protocol class is extended (:func:`protocol_class`) to note
the CN of each connection's verified client certificate
(``gateway.access.certs``) under that address when the connection is made and
to forget it when it is lost. The login middleware (``http_auth``) reads it for
a request without an ``Authorization`` header. Only ``asyncio.Protocol``'s own
``connection_made``/``connection_lost`` are extended, so any uvicorn HTTP
protocol implementation works. The same extension notes each connection in a
:class:`http_connections.PeerLeases` (and releases its slot when lost).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.access.certs import cert_identity

from .http_connections import PeerLeases

__all__ = ["PeerCerts", "protocol_class"]


class PeerCerts:
    """(peer host, peer port) -> the CN of that connection's verified client certificate."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, int], str] = {}

    def name_of(self, client: Any) -> str | None:
        if not self.names or not client:
            return None
        return self.names.get((client[0], client[1]))


def protocol_class(base: type[asyncio.Protocol], certs: PeerCerts | None,
                   leases: PeerLeases | None = None) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's HTTP protocol) noting each connection's certificate name in ``certs`` and each
    connection in ``leases`` (either may be None)."""

    class PeerProtocol(base):  # type: ignore[valid-type, misc]
        _peer_key: tuple[str, int] | None = None
        _noted = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            if isinstance(peer, tuple) and len(peer) >= 2:
                self._peer_key = (peer[0], peer[1])
                name = cert_identity(transport) if certs is not None else None
                if name is not None:
                    certs.names[self._peer_key] = name  # type: ignore[union-attr]
                    self._noted = True
                if leases is not None:
                    leases.opened(self._peer_key)
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            key = self._peer_key
            if key is not None:
                if self._noted:
                    certs.names.pop(key, None)  # type: ignore[union-attr]
                if leases is not None:
                    leases.lost(key)
            super().connection_lost(exc)

    return PeerProtocol
