"""Several gateways: a shared subscription's group spans the fleet, each message to one member.

Why (issue 21): on one gateway a ``$share/G/filter`` group is one LMQ that a publish is
dispatched into and its members pop (shared.py). Across gateways a publish arriving at a
gateway without members of the group would not be dispatched into it, and QoS 0 went
round robin to the members of the publisher's own gateway only.

How, while the fleet has other live gateways (``Tail.several``): the groups are served
from the store topic itself, as rocketmq-mqtt does. Every MQTT publish is stored in the
store topic its first level maps to (mapping.py); each gateway with an online member of
``(G, filter)`` pops that topic with one broker-side consumer group per group and filter
(``mqtt-fshare-<G>-<filter>``), hands each popped message that matches the filter to one
of its online members (round robin, within their in-flight windows) and acknowledges
the rest at once. The publishing gateway no longer dispatches into group LMQs nor hands
QoS 0 to a member itself (``Routing.fleet_groups``).

The guarantee is the consumer group's: each message stored in the topic is popped by one
gateway, so it reaches one member of the group in the whole fleet; QoS 0 is acknowledged
as it is sent; QoS 1/2 when the member acknowledges it, and one whose member goes away
(or does not answer within :data:`INVISIBLE_MS`) is popped again, to any member (at least
once). A new group reads from the end when it is first popped (before the SUBACK of its
first member on this gateway); the group's position is kept by the brokers while no
member is online, so members that come back get what was stored meanwhile. Not covered:
filters whose first level is a wildcard (``$share/G/#``) stay per gateway, and messages
popped before the fleet went from one gateway to several (or back) may be delivered
twice or not at all at that moment.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from core_broker.errors import TopicNotFoundError, UnimqError
from gateway.naming import unified_topic_of_mqtt

from .mapping import P_TOPIC, now_ms, outgoing_from_stored
from .routing import SharedGroup
from .session import Inflight
from .topics import filter_matches, lmq_safe

if TYPE_CHECKING:
    from .broker import MQTTBroker

log = logging.getLogger("unimq.mqtt")

__all__ = ["FleetShares", "INVISIBLE_MS", "WILD", "demand_key"]

INVISIBLE_MS = 60_000  # a popped QoS 1/2 message not acknowledged by its member within this is popped again
WAIT_MS = 2_000  # a pop's long poll
MAX_POP = 32
WILD = "+"  # the store topic key of filters whose first level is a wildcard (every store topic)


def demand_key(flt: str) -> str:
    """The store topic a filter's messages are in, or :data:`WILD` for every one."""
    first = flt.split("/", 1)[0]
    return WILD if first in ("+", "#") else unified_topic_of_mqtt(flt)


class _Pump:
    __slots__ = ("group", "topic", "cgroup", "key", "task", "ready", "latest")

    def __init__(self, g: SharedGroup, topic: str) -> None:
        self.group = g
        self.topic = topic
        self.cgroup = f"mqtt-fshare-{lmq_safe(g.group)}-{lmq_safe(g.filter)}"
        # what the members' in-flight entries name (Inflight.lmq): SharedDelivery acknowledges by it
        self.key = f"%fshare%{self.cgroup}"
        self.task: asyncio.Task[None] | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # a new consumer group starts at the end of the topic; a topic that did not exist yet at
        # the first pop is read from its start (all of it came after)
        self.latest = True


class FleetShares:
    """The pumps of the shared groups with members here, while the fleet has several gateways."""

    def __init__(self, broker: MQTTBroker) -> None:
        self.broker = broker
        self.processor = broker.processor
        self.active = False
        self.pumps: dict[tuple[str, str], _Pump] = {}

    def follow(self, several: bool) -> None:
        """The fleet has other live gateways (or no longer): groups are served fleet-wide (or
        per gateway again, shared.py)."""
        routing = self.broker.routing
        if several != self.active:
            self.active = several
            routing.fleet_groups = several
            routing.changed()  # plans made before dispatched into group LMQs (or did not)
        if not several:
            for p in self.pumps.values():
                if p.task is not None:
                    p.task.cancel()
            self.pumps.clear()
            return
        for key, g in list(routing.groups.items()):
            self.wake(g)
        for key in [k for k, p in self.pumps.items() if routing.groups.get(k) is not p.group]:
            self.pumps.pop(key)  # the loop sees it is gone and ends

    def wake(self, g: SharedGroup) -> asyncio.Future[None] | None:
        """Make sure ``g`` is pumped here while it has an online member; the future is done once
        its consumer group reads from the end (None: nothing to wait for)."""
        if not self.active:
            return None
        topic = demand_key(g.filter)
        if topic == WILD or g.filter[0] == "$":
            return None  # not covered: such a group stays per gateway (shared.py)
        key = (g.group, g.filter)
        p = self.pumps.get(key)
        if p is not None and p.group is g and p.task is not None and not p.task.done():
            return p.ready
        if not g.online():
            return None
        p = self.pumps[key] = _Pump(g, topic)
        self.broker.shared.fleet_pops[p.key] = (p.cgroup, topic)
        p.task = self.broker.spawn(self._pump(key, p))
        return p.ready

    async def _pump(self, key: tuple[str, str], p: _Pump) -> None:
        g = p.group
        proc, ctx = self.processor, self.broker.ctx
        rr = 0
        try:
            while self.pumps.get(key) is p:
                online = g.online()
                if not online:
                    return  # woken again by the next member online (Tail.attach / subscribed)
                room = {m: m.session.conn.window - m.session.outstanding() for m in online  # type: ignore[union-attr]
                        if m.session.conn.writable}  # type: ignore[union-attr]
                want = sum(n for n in room.values() if n > 0)
                if not want and p.ready.done():
                    await asyncio.sleep(0.05)  # windows full: acknowledgements free them
                    continue
                try:
                    got = await proc.pop(ctx, p.cgroup, p.topic, max(1, min(want, MAX_POP)), INVISIBLE_MS, None,
                                         WAIT_MS if p.ready.done() else 0, from_latest=p.latest)
                except TopicNotFoundError:
                    got = []
                    if not p.ready.done():
                        p.latest = False
                    else:
                        await asyncio.sleep(1.0)  # made by its first send
                except UnimqError as e:
                    log.debug("mqtt fleet share: pop %s %s: %s", p.cgroup, p.topic, e)
                    await asyncio.sleep(1.0)
                    continue
                if not p.ready.done():
                    p.ready.set_result(None)
                done: list[str] = []
                release: list[str] = []
                now = now_ms()
                for pm in got:
                    m = pm.message
                    topic = m.properties.get(P_TOPIC) if m.properties else None
                    if not topic or not filter_matches(g.filter, topic):
                        done.append(pm.receipt_handle)
                        continue
                    members = [x for x, n in room.items() if n > 0 and x.session.conn is not None
                               and not x.session.conn.closed]
                    if not members:
                        release.append(pm.receipt_handle)
                        continue
                    rr += 1
                    sub = members[rr % len(members)]
                    s, conn = sub.session, sub.session.conn
                    assert conn is not None
                    out = outgoing_from_stored(m.properties, m.body, m.topic)
                    q = min(out.qos, sub.qos)
                    sids = [sub.sub_id] if sub.sub_id else None
                    if out.expired(now) or q == 0:
                        if not out.expired(now):
                            conn.deliver(out, 0, False, sids)
                        done.append(pm.receipt_handle)
                        continue
                    room[sub] -= 1
                    pid = s.alloc_pid()
                    s.inflight[pid] = Inflight(out, q, p.key, 0, pm.receipt_handle, sids)
                    conn.send_publish(out, q, False, pm.delivery_attempt > 1, pid, sids)
                if done:
                    await proc.ack_batch(ctx, p.cgroup, p.topic, done)
                for rh in release:
                    await proc.change_invisible(ctx, p.cgroup, p.topic, rh, 0)
        except asyncio.CancelledError:
            raise
        except Exception:  # pragma: no cover - logged; the next wake starts it again
            log.exception("mqtt fleet share: pump of %s failed", p.cgroup)
        finally:
            if not p.ready.done():
                p.ready.set_result(None)
            if self.pumps.get(key) is p:
                del self.pumps[key]
