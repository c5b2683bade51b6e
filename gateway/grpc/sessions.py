"""Who is connected: client sessions and their Telemetry streams.

The v2 protocol has one server-to-client channel, the Telemetry stream, and
the broker needs it to ask a producer about a transaction left open. This
registry remembers, per client id (``x-mq-client-id``), the client's type,
group, the topics it publishes (from its settings and from what it actually
sent) and the outboxes of its live Telemetry streams. It is connection state
only: nothing here must survive a restart (clients reconnect and resend
their settings).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from .convert import resource_name


@dataclass
class ClientSession:
    client_id: str
    namespace: str = ""
    client_type: int = pb.ClientType.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    topics: set[str] = field(default_factory=set)
    outboxes: list[asyncio.Queue[spb.TelemetryCommand | None]] = field(default_factory=list)
    last_seen: float = field(default_factory=time.monotonic)
    streams_opened: int = 0  # telemetry streams ever opened (the admin API shows reconnects)

    @property
    def live(self) -> bool:
        return bool(self.outboxes)

    def apply_settings(self, settings: pb.Settings) -> None:
        if settings.HasField("client_type"):
            self.client_type = settings.client_type
        which = settings.WhichOneof("pub_sub")
        if which == "publishing":
            self.topics.update(resource_name(t) for t in settings.publishing.topics if t.name)
        elif which == "subscription":
            self.group = resource_name(settings.subscription.group)
            self.topics.update(resource_name(e.topic) for e in settings.subscription.subscriptions if e.topic.name)
        self.last_seen = time.monotonic()

    def push(self, command: spb.TelemetryCommand) -> bool:
        """Queue a server-initiated command on one live stream; False if none is open."""
        if not self.outboxes:
            return False
        self.outboxes[-1].put_nowait(command)  # the newest stream: older ones are being replaced
        return True


class SessionRegistry:
    def __init__(self) -> None:
        self.sessions: dict[str, ClientSession] = {}
        self._rr = itertools.count()

    def get(self, client_id: str, namespace: str = "") -> ClientSession:
        s = self.sessions.get(client_id)
        if s is None:
            s = self.sessions[client_id] = ClientSession(client_id, namespace)
        s.last_seen = time.monotonic()
        return s

    def touch(self, client_id: str, namespace: str = "", client_type: int | None = None, group: str = "") -> None:
        s = self.get(client_id, namespace)
        if client_type:
            s.client_type = client_type
        if group:
            s.group = group

    def published(self, client_id: str, namespace: str, topic: str) -> None:
        s = self.sessions.get(client_id)
        if s is None:
            s = self.get(client_id, namespace)
            s.client_type = pb.ClientType.PRODUCER
        if topic not in s.topics:
            s.topics.add(topic)

    def remove(self, client_id: str) -> None:
        s = self.sessions.get(client_id)
        if s is not None and not s.outboxes:
            del self.sessions[client_id]

    def producers_of(self, topic: str, producer_group: str = "") -> list[ClientSession]:
        """Live producers that publish ``topic`` (and belong to ``producer_group`` when one is known)."""
        out = [
            s
            for s in self.sessions.values()
            if s.live and s.client_type == pb.ClientType.PRODUCER and topic in s.topics
        ]
        if producer_group:
            same = [s for s in out if s.group == producer_group]
            out = same or out
        return out

    def pick(self, candidates: list[ClientSession]) -> ClientSession | None:
        if not candidates:
            return None
        return candidates[next(self._rr) % len(candidates)]

    def prune(self, idle_s: float) -> None:
        """Forget sessions with no stream that have not been heard from for ``idle_s``."""
        now = time.monotonic()
        for cid in [c for c, s in self.sessions.items() if not s.live and now - s.last_seen > idle_s]:
            del self.sessions[cid]
