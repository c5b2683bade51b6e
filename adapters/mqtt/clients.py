"""The MQTT door's client table for the admin API (:class:`gateway.clients.ClientSource`):
sessions (connected or kept for a clean-start-false client) with their subscriptions."""

from __future__ import annotations

from typing import Iterable

from gateway.clients import ClientInfo

from . import packets as C
from .broker import MQTTBroker

__all__ = ["MqttClients"]


class MqttClients:
    """Reads the broker's sessions; ``disconnect`` closes a session's connection with v5 reason
    0x98 (administrative action) and publishes its will, as a lost connection would."""

    door = "mqtt"

    def __init__(self, broker: MQTTBroker) -> None:
        self.broker = broker

    def ids(self) -> Iterable[str]:
        return self.broker.sessions.keys()

    def describe(self, client_id: str) -> ClientInfo | None:
        s = self.broker.sessions.get(client_id)
        if s is None:
            return None
        conn = s.conn
        live = conn is not None and not conn.closed
        subs = [{"filter": key, "qos": sub.qos} for key, sub in s.subs.items()]
        return ClientInfo("mqtt", client_id, live, conn.peer if live and conn else "", s.username or "",
                          {"protocol_version": s.version, "subscriptions": subs, "inflight": len(s.inflight),
                           "session_expiry_s": s.expiry})

    def connections(self) -> int:
        return sum(1 for c in self.broker.connections if c.connected and not c.closed)

    async def disconnect(self, client_id: str) -> bool:
        s = self.broker.sessions.get(client_id)
        conn = s.conn if s is not None else None
        if conn is None or conn.closed:
            return False
        conn.close(C.RC_ADMINISTRATIVE_ACTION, "disconnected by an administrator")
        return True
