"""RocketMQ 5 gRPC door: the v2 ``MessagingService`` over the MessagingProcessor.

Existing RocketMQ 5 applications (the official thin clients in any language)
point their endpoint at unimq's gRPC port and run unchanged. The servicer is
built on the stubs shipped by PyPI's ``rocketmq-python-client``
(``rocketmq.grpc_protocol``), served by ``grpc.aio``:

- :mod:`.convert`: v2 <-> unimq mapping and status codes (pure functions);
- :mod:`.signature`: the ``MQv2-HMAC-SHA1`` authorization check;
- :mod:`.sessions`: connected clients and their Telemetry streams;
- :mod:`.service`: the servicer; :mod:`.door`: the server `unimq up` starts.

Note on the package name: inside ``gateway/`` a bare ``import grpc`` still means
grpcio, because imports are absolute and ``gateway/`` itself is never on sys.path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .door import GrpcDoor
    from .service import MessagingService

__all__ = ["GrpcDoor", "MessagingService"]


def __getattr__(name: str) -> object:
    """``GrpcDoor`` and ``MessagingService`` on first use (PEP 562).

    Why lazily: grpcio and the v2 stubs take about 0.4 s to import, and the
    process reads this package's knobs (``settings.py``) for every command,
    ``unimq --help`` included.
    """
    if name == "GrpcDoor":
        from .door import GrpcDoor

        return GrpcDoor
    if name == "MessagingService":
        from .service import MessagingService

        return MessagingService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
