"""Who is connected, per door: the registry the admin API lists clients from and disconnects them through.

Why in ``gateway/`` (beside :class:`~gateway.door.ServerState`) and not in a door: the HTTP
door serves the admin API but must not import the MQTT, AMQP or gRPC doors (doors never
import each other), and the doors must not import the HTTP door. So each door's client table
is exposed through the small :class:`ClientSource` shape defined here; the application
(``unimq/doors.py``) registers one source per door in the process's :class:`ClientRegistry`,
which the HTTP door reads.

Why ids first and details per page: an MQTT door may hold 100,000 sessions. A page is
found by walking the ids (a substring filter on a ``str`` is cheap) and only the page's
clients are described, so a listing costs one pass over the ids, not 100,000 descriptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol

__all__ = ["ClientInfo", "ClientPage", "ClientRegistry", "ClientSource"]


@dataclass
class ClientInfo:
    """One client of one door, as the admin API shows it."""

    door: str  # mqtt, amqp, grpc, http (push subscriptions)
    client_id: str
    connected: bool
    remote: str = ""  # peer address when connected
    user: str = ""
    # door-specific details: MQTT subscriptions, AMQP channels, gRPC group and topics, a push sink...
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"door": self.door, "client_id": self.client_id, "connected": self.connected,
                "remote": self.remote, "user": self.user, **self.details}


class ClientSource(Protocol):
    """A door's client table."""

    door: str

    def ids(self) -> Iterable[str]:
        """Every client id (MQTT sessions, connected or kept; AMQP connections; ...), cheaply."""
        ...

    def describe(self, client_id: str) -> ClientInfo | None:
        """One client's details, None if it is gone."""
        ...

    def connections(self) -> int:
        """Open network connections of this door."""
        ...

    async def disconnect(self, client_id: str) -> bool:
        """Close the client's connection (its session, if any, stays); False if none is open."""
        ...


@dataclass
class ClientPage:
    total: int  # clients matching the filter
    clients: list[ClientInfo]


class ClientRegistry:
    """The client sources of one process's doors."""

    def __init__(self) -> None:
        self.sources: dict[str, ClientSource] = {}

    def register(self, source: ClientSource) -> None:
        self.sources[source.door] = source

    def connections(self) -> dict[str, int]:
        """Open connections per door."""
        return {door: s.connections() for door, s in self.sources.items()}

    def page(self, door: str = "", contains: str = "", offset: int = 0, limit: int = 50) -> ClientPage:
        """Clients of ``door`` (every door when empty) whose id contains ``contains``, the
        ``limit`` from ``offset`` on, in each door's own order."""
        total, picked = 0, []
        for name, source in self.sources.items():
            if door and name != door:
                continue
            for cid in list(source.ids()):
                if contains and contains not in cid:
                    continue
                if offset <= total < offset + limit:
                    picked.append((source, cid))
                total += 1
        out = [info for s, cid in picked if (info := s.describe(cid)) is not None]
        return ClientPage(total, out)

    def source(self, door: str) -> ClientSource | None:
        return self.sources.get(door)
