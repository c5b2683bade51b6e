"""Shared subscriptions (``$share/<group>/<filter>``): one LMQ per group, popped by its members.

Why pop/ack here and pull by offset elsewhere: a shared group has several
readers, load split and no order promise, which is what the processor's pop
gives (invisible until acknowledged, redelivered otherwise). A member that
leaves releases its in-flight messages to the others at once (change-invisible 0).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Coroutine

from core_broker.errors import TopicNotFoundError, UnimqError
from gateway.api import MessagingAPI
from gateway.context import RequestContext

from .mapping import now_ms, outgoing_from_stored
from .routing import Routing, SharedGroup
from .session import Inflight, Session
from .tracing import delivered as trace_delivered, mark_read as trace_mark_read

log = logging.getLogger("unimq.mqtt")

__all__ = ["SharedDelivery"]


class SharedDelivery:
    """Pumps each shared group's LMQ into its online members, round robin."""

    def __init__(self, processor: MessagingAPI, ctx: RequestContext, routing: Routing,
                 spawn: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self.processor = processor
        self.ctx = ctx
        self.routing = routing
        self.spawn = spawn
        self.tracer = processor.tracer  # message traces: deliveries, expiries (adapters/mqtt/tracing.py)
        # several gateways: what fleet_share.py's in-flight entries name -> (consumer group, topic)
        self.fleet_pops: dict[str, tuple[str, str]] = {}

    def wake_session(self, s: Session, reconnected: bool = False) -> None:
        """``s`` can take messages again: pump the groups it is a member of (``reconnected``:
        it was away, so its groups may hold messages nobody was woken for)."""
        groups = self.routing.groups
        for sub in s.subs.values():
            if sub.group:
                g = groups.get((sub.group, sub.filter))
                if g is not None:
                    if reconnected:
                        g.pending += 1
                    self.wake(g)

    def wake(self, g: SharedGroup) -> None:
        if g.pumping:
            return
        g.pumping = True
        self.spawn(self._pump(g))

    async def _pump(self, g: SharedGroup) -> None:
        """Pop the group's LMQ into its online members, a small batch each, round robin."""
        try:
            while True:
                members = [m for m in g.online() if m.session.conn is not None and m.session.conn.writable]
                if not members:
                    return
                round_pending = g.pending
                progressed = False
                start = g.rr
                g.rr += 1
                for i in range(len(members)):
                    sub = members[(start + i) % len(members)]
                    s = sub.session
                    conn = s.conn
                    if conn is None or conn.closed:
                        continue
                    room = conn.window - s.outstanding()
                    if room <= 0:
                        continue
                    try:
                        got = await self.processor.pop(s.ctx, g.cgroup, g.lmq, min(room, 8), 3_600_000)
                    except TopicNotFoundError:
                        g.pending = 0
                        return
                    if s.conn is not conn or conn.closed:
                        for p in got:
                            await self.processor.change_invisible(self.ctx, g.cgroup, g.lmq, p.receipt_handle, 0)
                        continue
                    now = now_ms()
                    tracer = self.tracer
                    for p in got:
                        out = outgoing_from_stored(p.message.properties, p.message.body, p.message.topic)
                        q = min(out.qos, sub.qos)
                        expired = out.expired(now)
                        if tracer.on:  # the pop of the group's LMQ is this door's delivery
                            trace_delivered(tracer, s, sub.key(), trace_mark_read(out, p.message), q,
                                            "expired" if expired else "delivered")
                        if expired or q == 0:
                            if not expired:
                                conn.deliver(out, 0, False, [sub.sub_id] if sub.sub_id else None)
                            await self.processor.ack(self.ctx, g.cgroup, g.lmq, p.receipt_handle)
                            continue
                        pid = s.alloc_pid()
                        sids = [sub.sub_id] if sub.sub_id else None
                        s.inflight[pid] = Inflight(out, q, g.lmq, 0, p.receipt_handle, sids)
                        conn.send_publish(out, q, False, p.delivery_attempt > 1, pid, sids)
                    if got:
                        progressed = True
                if not progressed:
                    if g.pending == round_pending:
                        g.pending = 0
                        return
        finally:
            g.pumping = False

    async def ack(self, s: Session, f: Inflight) -> None:
        fp = self.fleet_pops.get(f.lmq) if f.lmq and f.receipt is not None else None
        if fp is not None:
            try:
                await self.processor.ack(self.ctx, fp[0], fp[1], f.receipt)  # type: ignore[arg-type]
            except UnimqError as e:
                log.debug("mqtt: shared ack failed: %s", e)
            return
        g = self.routing.group_of(f.lmq or "")
        if g is None or f.receipt is None:
            return
        try:
            await self.processor.ack(self.ctx, g.cgroup, g.lmq, f.receipt)
        except UnimqError as e:
            log.debug("mqtt: shared ack failed: %s", e)
        if g is not None:
            self.wake(g)

    async def release(self, s: Session, f: Inflight) -> None:
        fp = self.fleet_pops.get(f.lmq) if f.lmq and f.receipt is not None else None
        if fp is not None:  # back to the fleet's group at once
            try:
                await self.processor.change_invisible(self.ctx, fp[0], fp[1], f.receipt, 0)  # type: ignore[arg-type]
            except UnimqError as e:
                log.debug("mqtt: shared release failed: %s", e)
            return
        g = self.routing.group_of(f.lmq or "")
        if g is None or f.receipt is None:
            return
        try:
            await self.processor.change_invisible(self.ctx, g.cgroup, g.lmq, f.receipt, 0)
        except UnimqError as e:
            log.debug("mqtt: shared release failed: %s", e)
        g.pending += 1

    async def release_and_wake(self, s: Session, f: Inflight) -> None:
        await self.release(s, f)
        g = self.routing.group_of(f.lmq or "")
        if g is not None:
            self.wake(g)
