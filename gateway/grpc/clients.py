"""The gRPC door's client table for the admin API (:class:`gateway.clients.ClientSource`):
RocketMQ clients known by their client id, live while a telemetry stream is open."""

from __future__ import annotations

from typing import Iterable

from rocketmq.grpc_protocol import definition_pb2 as pb

from ..clients import ClientInfo
from .door import GrpcDoor
from .sessions import SessionRegistry

__all__ = ["GrpcClients"]


class GrpcClients:
    """Reads the service's sessions, found on the door once started; ``disconnect`` ends the
    client's telemetry streams (the RocketMQ client reconnects them, as after a network blip)."""

    door = "grpc"

    def __init__(self, door: GrpcDoor) -> None:
        self._door = door

    @property
    def _registry(self) -> SessionRegistry | None:
        service = self._door.service
        return service.sessions if service is not None else None

    def ids(self) -> Iterable[str]:
        r = self._registry
        return r.sessions.keys() if r is not None else ()

    def describe(self, client_id: str) -> ClientInfo | None:
        r = self._registry
        s = r.sessions.get(client_id) if r is not None else None
        if s is None:
            return None
        return ClientInfo("grpc", client_id, s.live, "", "",
                          {"client_type": pb.ClientType.Name(s.client_type), "group": s.group,
                           "topics": sorted(s.topics), "namespace": s.namespace, "streams": len(s.outboxes),
                           "streams_opened": s.streams_opened})

    def connections(self) -> int:
        r = self._registry
        return sum(1 for s in r.sessions.values() if s.live) if r is not None else 0

    async def disconnect(self, client_id: str) -> bool:
        r = self._registry
        s = r.sessions.get(client_id) if r is not None else None
        if s is None or not s.live:
            return False
        for outbox in list(s.outboxes):
            outbox.put_nowait(None)  # the stream's writer ends, the call completes
        return True
