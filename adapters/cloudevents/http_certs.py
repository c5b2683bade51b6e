"""HTTPS client certificates as identities (``http_cert_identity``): which connection carries which CN.

Why a table beside uvicorn: an ASGI scope names its connection only by the
peer's address (``scope["client"]``) and carries no TLS details in uvicorn, so
the door's HTTP protocol class is extended (:func:`protocol_class`) to note
the CN of each connection's verified client certificate
(``gateway.access.certs``) under that address when the connection is made and
to forget it when it is lost. The login middleware (``http_auth``) reads it for
a request without an ``Authorization`` header. Only ``asyncio.Protocol``'s own
``connection_made``/``connection_lost`` are extended, so any uvicorn HTTP
protocol implementation works.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.access.certs import cert_identity

__all__ = ["PeerCerts", "protocol_class"]


class PeerCerts:
    """(peer host, peer port) -> the CN of that connection's verified client certificate."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, int], str] = {}

    def name_of(self, client: Any) -> str | None:
        if not self.names or not client:
            return None
        return self.names.get((client[0], client[1]))


def protocol_class(base: type[asyncio.Protocol], certs: PeerCerts) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's HTTP protocol) noting each connection's certificate name in ``certs``."""

    class CertProtocol(base):  # type: ignore[valid-type, misc]
        _peer_key: tuple[str, int] | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            name = cert_identity(transport)
            if name is not None:
                peer = transport.get_extra_info("peername")
                if isinstance(peer, tuple) and len(peer) >= 2:
                    self._peer_key = (peer[0], peer[1])
                    certs.names[self._peer_key] = name
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._peer_key is not None:
                certs.names.pop(self._peer_key, None)
            super().connection_lost(exc)

    return CertProtocol
