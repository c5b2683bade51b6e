"""The AMQP door's client table for the admin API (:class:`gateway.clients.ClientSource`):
open connections (named by peer address, as RabbitMQ's management UI does) with their channels."""

from __future__ import annotations

from typing import Iterable

from gateway.clients import ClientInfo

from . import codec
from .broker import AmqpBroker
from .connection import AmqpConnection
from .server import AmqpDoor

__all__ = ["AmqpClients"]


class AmqpClients:
    """Reads the broker's connections, found lazily on the door (its broker exists once started);
    ``disconnect`` closes the connection with 320 CONNECTION_FORCED."""

    door = "amqp"

    def __init__(self, door: AmqpDoor) -> None:
        self._door = door

    @property
    def _broker(self) -> AmqpBroker | None:
        return self._door.broker

    def _conns(self) -> dict[str, AmqpConnection]:
        b = self._broker
        return {c.peer: c for c in list(b.connections) if c.peer} if b is not None else {}

    def ids(self) -> Iterable[str]:
        return self._conns().keys()

    def describe(self, client_id: str) -> ClientInfo | None:
        c = self._conns().get(client_id)
        if c is None:
            return None
        channels = [{"number": ch.number, "consumers": [{"tag": t, "queue": k.queue.name} for t, k in ch.consumers.items()],
                     "unacked": len(ch.unacked), "prefetch": ch.prefetch, "confirm": ch.confirm}
                    for ch in list(c.channels.values())]
        name = c.client_properties.get("connection_name") or c.client_properties.get("product") or ""
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        return ClientInfo("amqp", client_id, True, client_id, c.user,
                          {"vhost": c.vhost.name if c.vhost is not None else "", "name": str(name),
                           "channels": channels})

    def connections(self) -> int:
        b = self._broker
        return len(b.connections) if b is not None else 0

    async def disconnect(self, client_id: str) -> bool:
        c = self._conns().get(client_id)
        if c is None:
            return False
        c.close_connection(codec.CONNECTION_FORCED, "CONNECTION_FORCED - closed by an administrator")
        return True
