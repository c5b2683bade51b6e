"""Mosquitto-style ``$SYS/broker/...`` topics: the door's own statistics over MQTT.

Why: monitoring written for Mosquitto (``mosquitto_sub -t '$SYS/#' -v``, MQTT
Explorer, Node-RED and Grafana MQTT dashboards) reads broker health from these
topics, so a device fleet moved to unimq keeps its dashboards. The values are
live state of this process, not messages anyone published: they are kept in
memory only (retained for new subscribers, sent at QoS 0 as Mosquitto does) and
never written to the commitlog, where a value every ``mqtt_sys_interval_s``
would be noise in every unified stream. Only values that changed since the
last round are sent, as Mosquitto does. ``$``-topics are not matched by a
leading ``+`` or ``#`` (MQTT 4.7.2), so ``#`` subscribers never see them.

The names follow Mosquitto's where the meaning is the same; counters are of
PUBLISH packets and of bytes on this process's MQTT connections since start.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from core_broker.deadline_loop import DeadlineLoop

from .mapping import Outgoing
from .routing import member_sub_ids

if TYPE_CHECKING:
    from .broker import MQTTBroker

PREFIX = "$SYS/broker/"


class Counters:
    """What the door counts as it goes (PUBLISH packets and bytes in and out, QoS 0 drops)."""

    __slots__ = ("pub_in", "pub_out", "bytes_in", "bytes_out", "qos0_dropped")

    def __init__(self) -> None:
        self.pub_in = self.pub_out = self.bytes_in = self.bytes_out = self.qos0_dropped = 0


class SysTopics:
    """Publishes the door's statistics every ``interval_s`` seconds (0: never)."""

    def __init__(self, broker: MQTTBroker, interval_s: float, version: str) -> None:
        self.broker = broker
        self.interval_s = interval_s
        self.version = version
        self.started = time.monotonic()
        self.retained: dict[str, Outgoing] = {}  # topic -> the latest value, for new subscribers
        self._loop: DeadlineLoop | None = None
        # (time, received, sent) a minute of rounds back, for the per-minute loads
        self._history: list[tuple[float, int, int]] = []

    def start(self) -> None:
        if self.interval_s > 0:
            self.publish_once()
            self._loop = DeadlineLoop("mqtt-sys", self._round, self.interval_s, first_delay_s=self.interval_s)
            self._loop.start()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None

    async def _round(self) -> float:
        self.publish_once()  # a failure is logged by the loop, which goes on
        return self.interval_s

    def values(self) -> dict[str, str]:
        b = self.broker
        now = time.monotonic()
        connected = sum(1 for c in b.connections if c.session is not None and not c.closed)
        sessions = len(b.sessions)
        c = b.counters
        received, sent = c.pub_in, c.pub_out
        hist = self._history
        hist.append((now, received, sent))
        while len(hist) > 2 and now - hist[1][0] >= 60:
            hist.pop(0)
        t0, r0, s0 = hist[0]
        span = max(now - t0, 1e-9)
        per_min_in = (received - r0) * 60 / span if span >= 1 else 0.0
        per_min_out = (sent - s0) * 60 / span if span >= 1 else 0.0
        return {
            "version": f"unimq {self.version}",
            "uptime": f"{int(now - self.started)} seconds",
            "clients/connected": str(connected),
            "clients/disconnected": str(max(sessions - connected, 0)),
            "clients/total": str(max(sessions, connected)),
            "subscriptions/count": str(sum(len(s.subs) for s in b.sessions.values())),
            "retained messages/count": str(len(b.retained)),
            "messages/received": str(received),
            "messages/sent": str(sent),
            "publish/messages/received": str(received),
            "publish/messages/sent": str(sent),
            "publish/messages/dropped": str(c.qos0_dropped),
            "bytes/received": str(c.bytes_in),
            "bytes/sent": str(c.bytes_out),
            "load/messages/received/1min": f"{per_min_in:.2f}",
            "load/messages/sent/1min": f"{per_min_out:.2f}",
        }

    def publish_once(self) -> int:
        """Send every value that changed to the subscribers of its topic; return how many."""
        b = self.broker
        changed = 0
        for name, value in self.values().items():
            topic = PREFIX + name
            payload = value.encode()
            old = self.retained.get(topic)
            if old is not None and old.payload == payload:
                continue
            out = Outgoing(topic, payload, 0, True, None)
            self.retained[topic] = out
            changed += 1
            subs, groups = b.routing.match(topic)
            for sub in subs:
                conn = sub.session.conn
                if conn is not None and not conn.closed and b.access.can_read(sub.session, topic):
                    conn.deliver(out, 0, bool(sub.rap), member_sub_ids(sub))
            for g in groups:
                m = g.next_online()
                if m is not None and m.session.conn is not None:
                    m.session.conn.deliver(out, 0, False, member_sub_ids(m))
        return changed
