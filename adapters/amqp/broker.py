"""The AMQP door's shared state: vhosts, durable definitions, cross-door routing, settling.

Why the door holds this state and not the store: AMQP's objects (exchanges,
bindings, queue arguments, consumers, prefetch windows) are protocol
concepts, so they live here; what must survive a restart goes through the
processor's durable key-value state (``kv_put`` namespace ``amqp``, laid out
by :mod:`~adapters.amqp.durable`), and messages live only in the store.

The parts, one per module: :mod:`~adapters.amqp.vhost` (exchanges, queues,
routing a publish), :mod:`~adapters.amqp.queue_state` (one queue: buffer,
pump, spill, durable cursor), :mod:`~adapters.amqp.lease` and
:mod:`~adapters.amqp.priority_buffer` (its messages), and per client
:mod:`~adapters.amqp.connection`, :mod:`~adapters.amqp.channel`,
:mod:`~adapters.amqp.consumer`. :class:`AmqpBroker` is what every
connection shares: declaring and deleting (and persisting) exchanges, queues
and bindings, loading them at start, sending to the store, dead-lettering,
x-expires, and the cross-door router that lands other doors' messages with an
MQTT topic in queues bound to ``amq.topic``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from pamqp import encode as pencode

from core_broker.deadline_loop import DeadlineLoop
from core_broker.errors import TopicNotFoundError, UnimqError
from core_broker.model import DispatchTarget, Message
from gateway.api import MessagingAPI, SendResult
from gateway.context import RequestContext

from .durable import KV_NS, SEP, args_decode, args_key, binding_key, exchange_key
from .lease import Lease
from .mapping import headers_of, route_of, set_route, with_headers
from .queue_state import QueueState
from .routing import Binding, Exchange
from .tracing import settled as trace_settled
from .vhost import VHost

if TYPE_CHECKING:
    from .connection import AmqpConnection

log = logging.getLogger("unimq.amqp")

__all__ = ["AmqpBroker", "MEM_LIMIT", "MEM_BYTES", "lmq_offsets"]

MEM_LIMIT = 20000  # ready messages a memory queue holds before it spills to its LMQ
MEM_BYTES = 64 * 1024 * 1024  # ... or this many body bytes
_FQ_CACHE_MAX = 65536  # distinct MQTT topics whose amq.topic route is kept (then the cache restarts)
# a foreign message's AMQP queues and the LMQ dispatch targets they add
_ForeignRoute = tuple[tuple[QueueState, ...], tuple[DispatchTarget, ...]]
_NO_ROUTE: _ForeignRoute = ((), ())


def lmq_offsets(m: Message, result: SendResult) -> dict[str, int]:
    """LMQ topic -> the offset a sent message got there (from its send result)."""
    return {t.topic: o for t, o in zip(m.extra_dispatch, result.extra_offsets)}


class AmqpBroker:
    """Door-wide AMQP state and the store operations every connection shares."""

    def __init__(self, processor: MessagingAPI, settings: Any, identities: Any = None) -> None:
        self.processor = processor
        self.settings = settings
        self.tracer = processor.tracer  # message traces (adapters/amqp/tracing.py)
        # The process's identity store (gateway.access.store.IdentityStore): with users in it,
        # logins are checked against it first and opening a vhost needs a permission in it.
        self.identities = identities
        self.access_enforced = False  # users in the store: exchange and queue operations are asked
        self.ctx = RequestContext(protocol="amqp", client_id="amqp-door", trusted=True)
        self.vhosts: dict[str, VHost] = {v: VHost(v) for v in settings.amqp_vhosts}
        self.connections: set[AmqpConnection] = set()
        self.stopping = False
        self.blocked: str | None = None
        self._known_topics: set[str] = set()
        # x-expires: asleep until the earliest unused queue's expiry (no wake-ups without one)
        self._expiry = DeadlineLoop("amqp-queue-expiry", self._expire_round, max_sleep_s=60.0)
        # cross-door amq.topic routes (see _foreign_queues): per MQTT topic, for one vhost version
        self._fq_vhost: VHost | None = None
        self._fq_version = -1
        self._fq_any = False
        self._fq_cache: dict[str, _ForeignRoute] = {}
        self._background: set[asyncio.Task[Any]] = set()
        # The door's own limit (amqp_max_message_size), within what the store holds.
        self.max_message_size: int = min(settings.amqp_max_message_size, settings.store.max_message_size)
        # A queue holds this many ready messages (or body bytes) in memory, then spills to its LMQ
        # (read when the broker is made, so a test may lower the module's values first).
        self.mem_limit = MEM_LIMIT
        self.mem_bytes_limit = MEM_BYTES

    # ------------------------------------------------------------------ lifecycle

    # -- cross-protocol routing (gateway.processor.Router) ------------------------------

    def _foreign_queues(self, m: Message) -> _ForeignRoute:
        """AMQP queues bound to ``amq.topic`` that a message from another door reaches.

        RabbitMQ's MQTT-plugin convention: MQTT topic a/b/c is routing key a.b.c on
        amq.topic of the default vhost, so an MQTT (or any door's) message carrying an
        ``mqtt_topic`` property lands in the AMQP queues bound there.

        Called twice per message of every other door (``route`` before the store,
        ``after_send`` after it), so it must be cheap: nothing bound on amq.topic (the
        common case) answers at once, else one full route per distinct MQTT topic, kept
        until the vhost's exchanges, bindings or queues change (``VHost.version``).
        """
        if m.protocol == "amqp":
            return _NO_ROUTE  # routed by the door itself at publish
        props = m.properties
        mqtt = props.get("mqtt_topic") if props else None
        if not mqtt:
            return _NO_ROUTE
        vh = self._fq_vhost
        if vh is None or vh.version != self._fq_version:
            vh = self._fq_reset()
            if vh is None:
                return _NO_ROUTE
        if not self._fq_any:
            return _NO_ROUTE
        cache = self._fq_cache
        hit = cache.get(mqtt)
        if hit is None:
            if len(cache) >= _FQ_CACHE_MAX:
                cache.clear()
            qs = tuple(vh.route("amq.topic", mqtt.replace("/", "."), None))
            hit = cache[mqtt] = (qs, tuple(DispatchTarget(q.topic, 0) for q in qs)) if qs else _NO_ROUTE
        return hit

    def _fq_reset(self) -> "VHost | None":
        """The default vhost changed (or first use): drop the cached amq.topic routes."""
        vh = self._fq_vhost = self.vhosts.get("/")
        self._fq_cache.clear()
        if vh is None:
            self._fq_any = False
            return None
        self._fq_version = vh.version
        ex = vh.exchanges.get("amq.topic")
        self._fq_any = ex is not None and bool(ex.bindings or ex.alternate)
        return vh

    def routes_from(self, protocol: str) -> bool:
        """Another door's messages reach AMQP queues only while something is bound on amq.topic."""
        if protocol == "amqp":
            return False  # routed by the door itself at publish
        vh = self._fq_vhost
        if vh is None or vh.version != self._fq_version:
            vh = self._fq_reset()
        return vh is not None and self._fq_any

    def route(self, m: Message) -> tuple[DispatchTarget, ...]:
        return self._foreign_queues(m)[1]

    def after_send(self, messages: Sequence[Message], results: Sequence[SendResult]) -> None:
        vh = self._fq_vhost
        if vh is not None and vh.version == self._fq_version and not self._fq_any:
            return  # nothing bound on amq.topic (decided when the vhost last changed): once per batch
        for m, r in zip(messages, results):
            qs = self._foreign_queues(m)[0]
            if qs:
                offsets = lmq_offsets(m, r)
                for q in qs:
                    q.on_enqueued(m, offsets.get(q.topic), r.broker)

    async def start(self) -> None:
        pencode.support_deprecated_rabbitmq(True)  # integers in tables as b/s/I/l, the types RabbitMQ sends
        if self.identities is not None:
            self.identities.listeners.append(self._identities_changed)
            self._identities_changed()
        self.processor.add_router(self)
        await self._load()
        self._expiry.start()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.count or q.ttl is not None:
                    q.wake()

    def _identities_changed(self) -> None:
        """Users or permissions changed: open connections ask again at their next operation."""
        self.access_enforced = self.identities.has_users
        for c in self.connections:
            c.access_cache.clear()
            c.may_publish.clear()

    async def stop(self) -> None:
        self.stopping = True
        if self.identities is not None and self._identities_changed in self.identities.listeners:
            self.identities.listeners.remove(self._identities_changed)
        self.processor.remove_router(self)
        await self._expiry.stop()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.task is not None:
                    q.task.cancel()
        await self._settle_background()
        for vh in self.vhosts.values():  # last, complete cursors (settled sets of any size)
            for q in vh.queues.values():
                if q.persist and not q.deleted:
                    try:
                        await self.processor.kv_put(self.ctx, KV_NS, q.cursor_key(), q.cursor_json(full=True))
                    except UnimqError as e:
                        log.warning("could not save the cursor of queue %r: %s", q.name, e)
        await self._settle_background()

    async def _settle_background(self) -> None:
        """Give the background tasks (cursor saves, queue loops) 5 s to end. ``asyncio.wait``
        rather than awaiting each under ``wait_for``: a task's own error or cancel is not this
        stop's, and a cancel of the stop itself is never swallowed."""
        if self._background:
            _, late = await asyncio.wait(list(self._background), timeout=5)
            for t in late:  # stuck past the bound: cancelled, as a stop must end
                t.cancel()

    async def _load(self) -> None:
        items = await self.processor.kv_items(self.ctx, KV_NS)
        durable_topics: set[str] = set()
        bindings: list[tuple[str, bytes]] = []
        cursors: dict[str, bytes] = {}
        for key, value in sorted(items.items()):
            parts = key.split(SEP)
            try:
                d = json.loads(value)
                kind = parts[0]
                vh = self.vhosts.get(parts[1])
                if vh is None:
                    continue
                if kind == "x":
                    vh.exchanges[parts[2]] = Exchange(parts[2], d["type"], True, d["auto_delete"], d["internal"],
                                                      args_decode(d["args"]))
                elif kind == "q":
                    q = QueueState(self, vh, parts[2], True, None, d["auto_delete"], args_decode(d["args"]))
                    vh.queues[q.name] = q
                    durable_topics.add(q.topic)
                elif kind == "b":
                    bindings.append((key, value))
                elif kind == "c":
                    cursors[key] = value
            except Exception:
                log.exception("ignoring unreadable AMQP state entry %r", key)
        for key, value in bindings:
            _, vname, src, kind, dest, rk, ak = key.split(SEP)
            vh = self.vhosts[vname]
            ex = vh.exchanges.get(src)
            if ex is None or (kind == "q" and dest not in vh.queues) or (kind == "e" and dest not in vh.exchanges):
                continue
            ex.add(Binding(src, dest, kind == "e", rk, ak), args_decode(ak))
        for vh in self.vhosts.values():
            vh.version += 1
        # transient queues of an earlier run are gone: drop their light queues
        try:
            topics = await self.processor.list_topics(self.ctx, include_system=True)
        except UnimqError:
            topics = []
        for t in topics:
            name = t.name
            if name.startswith("%LMQ%amqp/") and name not in durable_topics:
                try:
                    await self.processor.delete_topic(self.ctx, name)
                except UnimqError:
                    pass
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                await self.processor.create_topic(self.ctx, q.topic, queues=1, exist_ok=True)
                raw = cursors.get(q.cursor_key())
                q.restore(raw, await self._lmq_offsets(q, raw))

    async def _lmq_offsets(self, q: QueueState, raw: bytes | None) -> dict[str, tuple[int, int]]:
        """(min, max) offset of a queue's LMQ on every broker that holds part of it."""
        brokers: set[str] = set()
        try:
            brokers.update((await self.processor.query_route(self.ctx, q.topic)).brokers)
        except UnimqError:
            pass
        if raw:
            try:
                brokers.update(json.loads(raw).get("l", {}))
            except (ValueError, AttributeError):
                pass
        out: dict[str, tuple[int, int]] = {}
        for b in sorted(brokers):
            try:
                lo = await self.processor.query_offset(self.ctx, q.topic, 0, "begin", broker=b)
                hi = await self.processor.query_offset(self.ctx, q.topic, 0, "end", broker=b)
            except UnimqError as e:
                log.warning("queue %r: offsets on broker %r unknown (%s); its part waits", q.name, b, e)
                continue
            out[b] = (lo, hi)
        return out

    # ------------------------------------------------------------------ durable cursors

    def save_cursor(self, q: QueueState) -> None:
        """Write a durable queue's cursor soon (one write in flight per queue; settles coalesce)."""
        q.dirty = True
        if not q.saving and not self.stopping:
            q.saving = True
            self._spawn(self._save_cursor(q))

    async def _save_cursor(self, q: QueueState) -> None:
        try:
            await asyncio.sleep(0)  # let this loop turn's acks settle first
            while q.dirty and not q.deleted:
                q.dirty = False
                await self.processor.kv_put(self.ctx, KV_NS, q.cursor_key(), q.cursor_json())
        except UnimqError as e:
            log.warning("could not save the cursor of queue %r: %s", q.name, e)
        finally:
            q.saving = False

    # ------------------------------------------------------------------ durable state

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    async def save_exchange(self, vh: VHost, ex: Exchange) -> None:
        if ex.durable:
            v = json.dumps({"type": ex.type, "auto_delete": ex.auto_delete, "internal": ex.internal,
                            "args": args_key(ex.arguments)}).encode()
            await self.processor.kv_put(self.ctx, KV_NS, exchange_key(vh.name, ex.name), v)

    async def forget_exchange(self, vh: VHost, ex: Exchange) -> None:
        if ex.durable:
            await self.processor.kv_put(self.ctx, KV_NS, exchange_key(vh.name, ex.name), None)

    def _binding_durable(self, vh: VHost, b: Binding) -> bool:
        src = vh.exchanges.get(b.source)
        if src is None or not src.durable:
            return False
        if b.to_exchange:
            d = vh.exchanges.get(b.destination)
            return d is not None and d.durable
        q = vh.queues.get(b.destination)
        return q is not None and q.durable and q.exclusive is None

    def _binding_key(self, vh: VHost, b: Binding) -> str:
        return binding_key(vh.name, b)

    async def add_binding(self, vh: VHost, b: Binding, args: dict[str, Any]) -> None:
        ex = vh.exchanges[b.source]
        vh.version += 1
        if ex.add(b, args) and self._binding_durable(vh, b):
            await self.processor.kv_put(self.ctx, KV_NS, self._binding_key(vh, b), b"{}")

    async def remove_binding(self, vh: VHost, b: Binding) -> None:
        ex = vh.exchanges.get(b.source)
        if ex is None:
            return
        durable = self._binding_durable(vh, b)
        if ex.remove(b):
            vh.version += 1
            if durable:
                await self.processor.kv_put(self.ctx, KV_NS, self._binding_key(vh, b), None)
            if ex.auto_delete and not ex.bindings:
                await self.delete_exchange(vh, ex)

    async def delete_exchange(self, vh: VHost, ex: Exchange) -> None:
        if vh.exchanges.get(ex.name) is not ex:
            return
        for b in list(ex.bindings):
            await self.remove_binding(vh, b)
        del vh.exchanges[ex.name]
        vh.version += 1
        # bindings where it is the destination
        for other in list(vh.exchanges.values()):
            for b in [b for b in other.bindings if b.to_exchange and b.destination == ex.name]:
                await self.remove_binding(vh, b)
        await self.forget_exchange(vh, ex)

    async def declare_queue(self, vh: VHost, name: str, durable: bool, exclusive: "AmqpConnection | None",
                            auto_delete: bool, arguments: dict[str, Any]) -> QueueState:
        q = QueueState(self, vh, name, durable, exclusive, auto_delete, arguments)
        await self.processor.create_topic(self.ctx, q.topic, queues=1, exist_ok=True)
        vh.queues[name] = q
        vh.version += 1
        if q.expires is not None:
            self.expiry_changed()
        if durable and exclusive is None:  # an exclusive queue dies with its connection anyway
            await self.processor.kv_put(self.ctx, KV_NS, q.key(), q.to_json())
        if q.ttl is not None:
            q.wake()
        return q

    async def delete_queue(self, q: QueueState) -> int:
        vh = q.vhost
        if vh.queues.get(q.name) is not q:
            return 0
        n = q.ready()
        q.deleted = True
        del vh.queues[q.name]
        vh.version += 1
        for c in list(q.consumers):
            c.channel.server_cancel(c)
        q.consumers.clear()
        if q.task is not None:
            q.task.cancel()
            q.task = None
        q.buffer.clear()
        q.returned.clear()
        for ex in list(vh.exchanges.values()):
            for b in [b for b in ex.bindings if not b.to_exchange and b.destination == q.name]:
                await self.remove_binding(vh, b)
        if q.durable and q.exclusive is None:
            await self.processor.kv_put(self.ctx, KV_NS, q.key(), None)
            await self.processor.kv_put(self.ctx, KV_NS, q.cursor_key(), None)
        for topic in (q.topic, f"%RETRY%{q.group}+{q.topic}"):  # the pop service's retry topic for the queue
            try:
                await self.processor.delete_topic(self.ctx, topic)
            except UnimqError:
                pass
        return n

    # ------------------------------------------------------------------ publishing

    async def ensure_topics(self, topics: Iterable[str]) -> None:
        for t in topics:
            if t not in self._known_topics:
                await self.processor.create_topic(self.ctx, t, exist_ok=True)
                self._known_topics.add(t)

    async def send(self, ctx: RequestContext, msgs: list[Message]) -> list[Any]:
        """processor.send, creating unified topics when auto-creation is off; the send results."""
        try:
            results = await self.processor.send(ctx, msgs)
        except TopicNotFoundError:
            await self.ensure_topics({m.topic for m in msgs})
            results = await self.processor.send(ctx, msgs)
        if self.blocked is not None:
            self.set_blocked(None)
        return results

    def set_blocked(self, reason: str | None) -> None:
        if reason == self.blocked:
            return
        self.blocked = reason
        for c in list(self.connections):
            c.notify_blocked(reason)

    async def dead_letter(self, q: QueueState, lease: Lease, reason: str) -> None:
        """Dead-letter (or, without a DLX, drop) one message that left ``q``; then ack it in the store."""
        try:
            if q.dlx is not None:
                vh = q.vhost
                m = lease.msg
                headers = headers_of(m)
                exchange, rk = route_of(m)
                deaths = headers.get("x-death")
                if not isinstance(deaths, list):
                    deaths = []
                entry = None
                for d in deaths:
                    if isinstance(d, dict) and d.get("queue") == q.name and d.get("reason") == reason:
                        entry = d
                        break
                if entry is not None:
                    deaths.remove(entry)
                    entry["count"] = int(entry.get("count", 0)) + 1
                    entry["time"] = datetime.datetime.now(tz=datetime.timezone.utc).replace(microsecond=0)
                else:
                    entry = {
                        "count": 1, "reason": reason, "queue": q.name,
                        "time": datetime.datetime.now(tz=datetime.timezone.utc).replace(microsecond=0),
                        "exchange": exchange, "routing-keys": [rk],
                    }
                    exp = m.properties.get("amqp_expiration")
                    if exp is not None and reason == "expired":
                        entry["original-expiration"] = exp
                deaths.insert(0, entry)
                headers["x-death"] = deaths
                if "x-first-death-reason" not in headers:
                    headers["x-first-death-reason"] = reason
                    headers["x-first-death-queue"] = q.name
                    headers["x-first-death-exchange"] = exchange
                headers["x-last-death-reason"] = reason
                headers["x-last-death-queue"] = q.name
                headers["x-last-death-exchange"] = exchange
                props = with_headers(m, headers)
                props.pop("amqp_expiration", None)  # RabbitMQ drops it so the copy does not expire again
                new_rk = q.dlrk if q.dlrk is not None else rk
                dlx = vh.exchanges.get(q.dlx)
                if dlx is not None:
                    targets = vh.route(q.dlx, new_rk, headers)
                    targets = [t for t in targets if not t.rejects_publish()]
                    topic, mqtt = vh.unified_topic(q.dlx, new_rk)
                    tag = set_route(props, q.dlx, new_rk)
                    if mqtt is not None:
                        props["mqtt_topic"] = mqtt
                    msg = Message(topic, m.body, tag=tag, keys=m.keys, properties=props,
                                  protocol="amqp", extra_dispatch=[DispatchTarget(t.topic, 0) for t in targets])
                    res = await self.send(self.ctx, [msg])
                    offsets = lmq_offsets(msg, res[0])
                    for t in targets:
                        t.on_enqueued(msg, offsets.get(t.topic), res[0].broker)
                    for t in targets:
                        await t.enforce_max_length()
                    if self.tracer.on:
                        trace_settled(self.tracer, self.ctx, lease, "dead_lettered", reason=reason, dlx=q.dlx)
        except UnimqError:
            log.exception("dead-lettering a message of queue %r failed; it stays in the queue", q.name)
            self.release(lease)
            q.count += 1
            return
        self.ack_lease(lease)

    # ------------------------------------------------------------------ settling

    def ack_lease(self, lease: Lease) -> None:
        """Remove a message from its queue for good (ack, no-ack delivery, drop, dead-letter)."""
        q = lease.queue
        if not q.deleted:
            q.settle(lease)

    def release(self, lease: Lease) -> None:
        """Put a message back in its queue, at its position (nack/reject requeue, closed channel)."""
        q = lease.queue
        if not q.deleted:
            q.hold(lease)
            q.wake()

    # ------------------------------------------------------------------ background loops

    def expiry_changed(self) -> None:
        """A queue with x-expires appeared or lost its last consumer: its expiry may come first."""
        self._expiry.wake()

    async def _expire_round(self) -> float | None:
        """x-expires: delete queues unused (no consumers, no get, no redeclare) for that long.

        Returns seconds until the next unused queue would expire (None: none can yet).
        A use only moves a queue's expiry later, so it needs no wake-up.
        """
        now = time.monotonic()
        due: float | None = None
        for vh in self.vhosts.values():
            for q in list(vh.queues.values()):
                if q.expires is None or q.consumers:
                    continue
                at = q.last_used + q.expires / 1000.0
                if now > at:
                    await self.delete_queue(q)
                elif due is None or at < due:
                    due = at
        return None if due is None else max(due - now, 0.001)

    # ------------------------------------------------------------------ names

    @staticmethod
    def generated_name(prefix: str) -> str:
        return prefix + base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
