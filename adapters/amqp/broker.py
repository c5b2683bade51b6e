"""The AMQP door's server semantics: vhosts, exchanges, queues, consumers' queues.

Why the door holds this state and not the store: AMQP's objects (exchanges,
bindings, queue arguments, consumers, prefetch windows) are protocol
concepts, so they live here; what must survive a restart goes through the
processor's durable key-value state (``kv_put`` namespace ``amqp``), and
messages live only in the store. Each AMQP queue is a light message queue
(``%LMQ%amqp/<vhost>/<queue>``) consumed with the pop API, the queue's name
as consumer group:

- a delivery is a pop with a lease (``amqp_lease_ms``) renewed while the
  message stays unacked; ack -> ``processor.ack``; nack/reject with requeue
  and the unacked messages of a closed channel -> ``change_invisible(0)``;
  the redelivered flag is "delivery attempt > 1";
- a queue's pump pops only as many messages as its consumers have prefetch
  credit for, into a small buffer it then hands out round-robin, so a slow
  consumer never holds more than its window (fair dispatch);
- TTL, max-length (drop-head, or reject-publish) and dead-lettering (with
  the ``x-death`` header) are applied by the door: expiry at the head of the
  queue like RabbitMQ, dead-letter = publish a copy through the DLX, then
  ack the original.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pamqp import decode as pdecode
from pamqp import encode as pencode

from core_broker.errors import TopicNotFoundError, UnimqError
from core_broker.model import DispatchTarget, Message, StoredMessage
from gateway.context import RequestContext

from . import codec
from .mapping import build_message, headers_of, lmq_topic, route_of, set_route, unified_topic, with_headers
from .routing import EXCHANGE_TYPES, PREDECLARED, Binding, Exchange, route

if TYPE_CHECKING:
    from .connection import AmqpConnection, Channel, Consumer

log = logging.getLogger("unimq.amqp")

KV_NS = "amqp"
_SEP = "\x1f"
POP_BATCH = 256  # most messages one pop asks for
BUFFER_SCAN = 64  # messages a TTL queue without consumers pulls forward to expire its head
IDLE_POLL_S = 1.0  # consumers with credit re-check the store this often (messages that came another way)
UNBOUNDED_CREDIT = 256  # window of a no-ack consumer or one with prefetch 0, per pump round


class AmqpError(Exception):
    """A protocol error: ``hard`` ones close the connection, the others the channel."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0, hard: bool = False) -> None:
        name = codec.REPLY_TEXT.get(code, "ERROR")
        super().__init__(f"{name} - {text}")
        self.code = code
        self.text = f"{name} - {text}"[:255]
        self.class_id = class_id
        self.method_id = method_id
        self.hard = hard or code in (501, 502, 503, 504, 505, 530, 540, 541)


def now_ms() -> int:
    return int(time.time() * 1000)


def _args_key(args: dict[str, Any] | None) -> str:
    if not args:
        return ""
    return base64.b64encode(pencode.field_table(args)).decode("ascii")


def _args_decode(s: str) -> dict[str, Any]:
    if not s:
        return {}
    return pdecode.field_table(base64.b64decode(s))[1]


def _int_arg(args: dict[str, Any], name: str, minimum: int) -> int | None:
    v = args.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg '{name}' for queue: {v!r}", 50, 10)
    return v


def _str_arg(args: dict[str, Any], name: str) -> str | None:
    v = args.get(name)
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).decode("utf-8", "replace")
    if not isinstance(v, str):
        raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg '{name}' for queue: {v!r}", 50, 10)
    return v


class Lease:
    """A message popped from a queue's LMQ: in the queue's buffer, or delivered and unacked."""

    __slots__ = ("queue", "msg", "handle", "attempt", "leased_at", "renewing", "pending", "tag", "consumer",
                 "channel", "expires_at")

    def __init__(self, queue: "QueueState", msg: StoredMessage, handle: str, attempt: int) -> None:
        self.queue = queue
        self.msg = msg
        self.handle = handle
        self.attempt = attempt
        self.leased_at = time.monotonic()
        self.renewing = False
        self.pending: str | None = None  # "ack" / "release" arriving while the lease was being renewed
        self.tag = 0
        self.consumer: "Consumer | None" = None
        self.channel: "Channel | None" = None
        self.expires_at = queue.expiry_of(msg)


class QueueState:
    """One AMQP queue: its definition (durable in kv) and its runtime (consumers, buffer, pump)."""

    def __init__(self, broker: "AmqpBroker", vhost: "VHost", name: str, durable: bool, exclusive: "AmqpConnection | None",
                 auto_delete: bool, arguments: dict[str, Any]) -> None:
        self.broker = broker
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive = exclusive
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        a = self.arguments
        self.ttl = _int_arg(a, "x-message-ttl", 0)
        self.expires = _int_arg(a, "x-expires", 1)
        self.max_length = _int_arg(a, "x-max-length", 0)
        self.dlx = _str_arg(a, "x-dead-letter-exchange")
        self.dlrk = _str_arg(a, "x-dead-letter-routing-key")
        self.overflow = _str_arg(a, "x-overflow") or "drop-head"
        if self.overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
            raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg 'x-overflow' for queue: {self.overflow!r}", 50, 10)
        self.topic = lmq_topic(vhost.name, name)
        self.group = name
        self.consumers: list[Consumer] = []
        self.rr = 0
        self.buffer: deque[Lease] = deque()
        self.count = 0  # ready (in the store or the buffer) + unacked
        self.unacked = 0
        self.had_consumer = False
        self.per_message_ttl = False  # a message with an expiration was routed here
        self.last_used = time.monotonic()
        self.deleted = False
        self.event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.store_empty = False

    # -- definition ---------------------------------------------------------------

    def key(self) -> str:
        return _SEP.join(("q", self.vhost.name, self.name))

    def to_json(self) -> bytes:
        return json.dumps({"auto_delete": self.auto_delete, "args": _args_key(self.arguments)}).encode()

    def equivalent(self, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]) -> str | None:
        if durable != self.durable:
            return f"inequivalent arg 'durable' for queue '{self.name}' in vhost '{self.vhost.name}': received '{str(durable).lower()}' but current is '{str(self.durable).lower()}'"
        if auto_delete != self.auto_delete:
            return f"inequivalent arg 'auto_delete' for queue '{self.name}' in vhost '{self.vhost.name}': received '{str(auto_delete).lower()}' but current is '{str(self.auto_delete).lower()}'"
        if exclusive != (self.exclusive is not None):
            return f"inequivalent arg 'exclusive' for queue '{self.name}' in vhost '{self.vhost.name}': received '{str(exclusive).lower()}' but current is '{str(self.exclusive is not None).lower()}'"
        for k in ("x-message-ttl", "x-expires", "x-max-length", "x-dead-letter-exchange",
                  "x-dead-letter-routing-key", "x-overflow", "x-max-priority", "x-queue-type"):
            mine, theirs = self.arguments.get(k), (arguments or {}).get(k)
            if isinstance(mine, (bytes, bytearray)):
                mine = bytes(mine).decode("utf-8", "replace")
            if isinstance(theirs, (bytes, bytearray)):
                theirs = bytes(theirs).decode("utf-8", "replace")
            if k == "x-queue-type" and theirs is None:
                continue
            if mine != theirs:
                return f"inequivalent arg '{k}' for queue '{self.name}' in vhost '{self.vhost.name}': received {theirs!r} but current is {mine!r}"
        return None

    # -- counts -------------------------------------------------------------------

    def ready(self) -> int:
        return max(self.count - self.unacked, 0)

    def expiry_of(self, m: StoredMessage) -> int | None:
        ttl = self.ttl
        e = m.properties.get("amqp_expiration")
        if e is not None:
            try:
                v = int(e)
                ttl = v if ttl is None else min(ttl, v)
            except ValueError:
                pass
        if ttl is None:
            return None
        return (m.born_timestamp_ms or m.store_timestamp_ms) + ttl

    # -- waking and consumers -------------------------------------------------------

    def wake(self) -> None:
        self.event.set()
        if self.task is None and not self.deleted:
            self.task = asyncio.get_running_loop().create_task(self._pump(), name=f"amqp-queue-{self.name}")

    def _needs_scan(self) -> bool:
        return (self.ttl is not None or self.per_message_ttl) and self.ready() > len(self.buffer)

    def _credit(self) -> int:
        total = 0
        for c in self.consumers:
            total += c.credit()
            if total >= POP_BATCH:
                return POP_BATCH
        return total

    def _next_consumer(self) -> "Consumer | None":
        cs = self.consumers
        n = len(cs)
        for i in range(n):
            c = cs[(self.rr + i) % n]
            if c.credit() > 0:
                self.rr = (self.rr + i + 1) % n
                return c
        return None

    async def _pump(self) -> None:
        broker = self.broker
        try:
            while not self.deleted:
                self.event.clear()
                if self.buffer and self.buffer[0].expires_at is not None:
                    await self._expire_head()
                # hand buffered messages to consumers with credit, round robin
                buf = self.buffer
                while buf and self.consumers:
                    c = self._next_consumer()
                    if c is None:
                        break
                    lease = buf.popleft()
                    if lease.expires_at is not None and lease.expires_at <= now_ms():
                        await self._expired(lease)
                        continue
                    c.channel.deliver(c, lease)
                want = self._credit() if self.consumers else 0
                if want > 0 and not buf:
                    got = await self._pop(want)
                    if got:
                        continue
                elif not self.consumers and self._needs_scan() and len(buf) < BUFFER_SCAN and not self.store_empty:
                    if await self._pop(BUFFER_SCAN - len(buf)):
                        continue
                timeout: float | None = None
                if want > 0:
                    timeout = IDLE_POLL_S
                if buf and buf[0].expires_at is not None:
                    t = max((buf[0].expires_at - now_ms()) / 1000.0, 0.0) + 0.005
                    timeout = t if timeout is None else min(timeout, t)
                elif not self.consumers and self._needs_scan():
                    timeout = IDLE_POLL_S if timeout is None else min(timeout, IDLE_POLL_S)
                if timeout is None:
                    await self.event.wait()
                else:
                    try:
                        await asyncio.wait_for(self.event.wait(), timeout)
                    except asyncio.TimeoutError:
                        self.store_empty = False
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("queue %r pump failed", self.name)
        finally:
            if self.task is asyncio.current_task():
                self.task = None
            if not self.deleted and not broker.stopping and self.event.is_set():
                self.wake()

    async def _pop(self, n: int) -> int:
        try:
            popped = await self.broker.processor.pop(
                self.broker.ctx, self.group, self.topic, max_count=max(1, min(n, POP_BATCH)),
                invisible_ms=self.broker.lease_ms,
            )
        except TopicNotFoundError:
            return 0
        except UnimqError:
            log.exception("pop from queue %r failed", self.name)
            return 0
        if self.deleted:
            for p in popped:
                self.broker.release_handle(self, p.receipt_handle)
            return 0
        self.store_empty = not popped
        buf = self.buffer
        for p in popped:
            buf.append(Lease(self, p.message, p.receipt_handle, p.delivery_attempt))
        return len(popped)

    async def take_one(self) -> Lease | None:
        """Basic.Get: the next ready message (the buffer first), expired ones dropped."""
        self.last_used = time.monotonic()
        while True:
            if not self.buffer:
                if await self._pop(1) == 0:
                    return None
            if not self.buffer:
                return None
            lease = self.buffer.popleft()
            if lease.expires_at is not None and lease.expires_at <= now_ms():
                await self._expired(lease)
                continue
            return lease

    async def _expire_head(self) -> None:
        buf = self.buffer
        now = now_ms()
        while buf and buf[0].expires_at is not None and buf[0].expires_at <= now:
            await self._expired(buf.popleft())

    async def _expired(self, lease: Lease) -> None:
        self.count -= 1
        await self.broker.dead_letter(self, lease, "expired")

    def on_enqueued(self, msg: Message) -> None:
        """A message was stored into this queue's LMQ."""
        self.count += 1
        if msg.properties.get("amqp_expiration") is not None:
            self.per_message_ttl = True
        self.store_empty = False
        self.wake()

    # -- max length ------------------------------------------------------------------

    def rejects_publish(self) -> bool:
        return self.max_length is not None and self.overflow != "drop-head" and self.ready() >= self.max_length

    async def enforce_max_length(self) -> None:
        if self.max_length is None or self.overflow != "drop-head":
            return
        while self.ready() > self.max_length and not self.deleted:
            lease = await self.take_one()
            if lease is None:
                break
            self.count -= 1
            await self.broker.dead_letter(self, lease, "maxlen")

    # -- purge / delete ------------------------------------------------------------------

    async def purge(self) -> int:
        n = 0
        while self.buffer:
            lease = self.buffer.popleft()
            self.broker.ack_lease(lease)
            n += 1
        while not self.deleted:
            try:
                popped = await self.broker.processor.pop(
                    self.broker.ctx, self.group, self.topic, max_count=1024, invisible_ms=self.broker.lease_ms
                )
            except UnimqError:
                break
            if not popped:
                break
            await asyncio.gather(*(self.broker.processor.ack(self.broker.ctx, self.group, self.topic, p.receipt_handle)
                                   for p in popped), return_exceptions=True)
            n += len(popped)
        self.count = self.unacked
        return n


class VHost:
    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueState] = {}
        self._topics: dict[tuple[str, str], tuple[str, str | None]] = {}
        for ex_name, ex_type in PREDECLARED:
            self.exchanges[ex_name] = Exchange(ex_name, ex_type, durable=True)

    def unified_topic(self, exchange: str, routing_key: str) -> tuple[str, str | None]:
        key = (exchange, routing_key)
        t = self._topics.get(key)
        if t is None:
            if len(self._topics) > 65536:
                self._topics.clear()
            t = self._topics[key] = unified_topic(self.name, exchange, routing_key)
        return t

    def route(self, exchange: str, routing_key: str, headers: dict[str, Any] | None) -> list[QueueState]:
        names = route(self.exchanges, exchange, routing_key, headers, self.queues.__contains__)
        qs = self.queues
        return [qs[n] for n in names if n in qs]


class AmqpBroker:
    """Door-wide AMQP state and the store operations every connection shares."""

    def __init__(self, processor: Any, settings: Any) -> None:
        self.processor = processor
        self.settings = settings
        self.ctx = RequestContext(protocol="amqp", client_id="amqp-door")
        self.lease_ms: int = settings.amqp_lease_ms
        self.vhosts: dict[str, VHost] = {v: VHost(v) for v in settings.amqp_vhosts}
        self.connections: set[AmqpConnection] = set()
        self.stopping = False
        self.blocked: str | None = None
        self._known_topics: set[str] = set()
        self._ops: list[Callable[[], Any]] = []
        self._acks: dict[QueueState, list[str]] = {}  # handles to ack, batched per queue per loop turn
        self._ops_scheduled = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        max_size = getattr(getattr(settings, "store", None), "max_message_size", 4 * 1024 * 1024)
        self.max_message_size: int = max_size

    # ------------------------------------------------------------------ lifecycle

    # -- cross-protocol routing (gateway.processor.Router) ------------------------------

    def _foreign_queues(self, m: Message) -> list["QueueState"]:
        """AMQP queues bound to ``amq.topic`` that a message from another door reaches.

        RabbitMQ's MQTT-plugin convention: MQTT topic a/b/c is routing key a.b.c on
        amq.topic of the default vhost, so an MQTT (or any door's) message carrying an
        ``mqtt_topic`` property lands in the AMQP queues bound there.
        """
        if m.protocol == "amqp":
            return []  # routed by the door itself at publish
        mqtt = m.properties.get("mqtt_topic") if m.properties else None
        vh = self.vhosts.get("/")
        if not mqtt or vh is None:
            return []
        return vh.route("amq.topic", mqtt.replace("/", "."), None)

    def route(self, m: Message) -> list[DispatchTarget]:
        return [DispatchTarget(q.topic, 0) for q in self._foreign_queues(m)]

    def after_send(self, messages: Any, results: Any) -> None:
        for m in messages:
            for q in self._foreign_queues(m):
                q.on_enqueued(m)

    async def start(self) -> None:
        pencode.support_deprecated_rabbitmq(True)  # integers in tables as b/s/I/l, the types RabbitMQ sends
        if hasattr(self.processor, "add_router"):
            self.processor.add_router(self)
        await self._load()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._lease_loop(), name="amqp-leases"),
            loop.create_task(self._expires_loop(), name="amqp-queue-expiry"),
        ]
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.count or q.ttl is not None:
                    q.wake()

    async def stop(self) -> None:
        self.stopping = True
        if hasattr(self.processor, "remove_router"):
            self.processor.remove_router(self)
        for t in self._tasks:
            t.cancel()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.task is not None:
                    q.task.cancel()
        # leases held in buffers go back at once, so a restart finds them ready
        ops = []
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                while q.buffer:
                    lease = q.buffer.popleft()
                    ops.append(self._release(lease.queue, lease.handle))
        if ops:
            await asyncio.gather(*ops, return_exceptions=True)
        await self.flush_ops()
        for t in list(self._background):
            try:
                await asyncio.wait_for(t, 5)
            except BaseException:
                pass

    async def _load(self) -> None:
        items = await self.processor.kv_items(self.ctx, KV_NS)
        durable_topics: set[str] = set()
        bindings: list[tuple[str, bytes]] = []
        for key, value in sorted(items.items()):
            parts = key.split(_SEP)
            try:
                d = json.loads(value)
                kind = parts[0]
                vh = self.vhosts.get(parts[1])
                if vh is None:
                    continue
                if kind == "x":
                    vh.exchanges[parts[2]] = Exchange(parts[2], d["type"], True, d["auto_delete"], d["internal"],
                                                      _args_decode(d["args"]))
                elif kind == "q":
                    q = QueueState(self, vh, parts[2], True, None, d["auto_delete"], _args_decode(d["args"]))
                    vh.queues[q.name] = q
                    durable_topics.add(q.topic)
                elif kind == "b":
                    bindings.append((key, value))
            except Exception:
                log.exception("ignoring unreadable AMQP state entry %r", key)
        for key, value in bindings:
            _, vname, src, kind, dest, rk, ak = key.split(_SEP)
            vh = self.vhosts[vname]
            ex = vh.exchanges.get(src)
            if ex is None or (kind == "q" and dest not in vh.queues) or (kind == "e" and dest not in vh.exchanges):
                continue
            ex.add(Binding(src, dest, kind == "e", rk, ak), _args_decode(ak))
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
                q.count = await self._backlog(q)

    async def _backlog(self, q: QueueState) -> int:
        """Messages left in a durable queue after a restart (from its offsets; approximate)."""
        try:
            stats = await self.processor.describe_topic(self.ctx, q.topic)
            top = stats.queues[0].max_offset
            low = stats.queues[0].min_offset
            done = await self.processor.get_offset(self.ctx, q.group, q.topic, 0)
            return max(top - (low if done is None else max(done, low)), 0)
        except (UnimqError, IndexError, AttributeError):
            return 0

    # ------------------------------------------------------------------ durable state

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    async def save_exchange(self, vh: VHost, ex: Exchange) -> None:
        if ex.durable:
            v = json.dumps({"type": ex.type, "auto_delete": ex.auto_delete, "internal": ex.internal,
                            "args": _args_key(ex.arguments)}).encode()
            await self.processor.kv_put(self.ctx, KV_NS, _SEP.join(("x", vh.name, ex.name)), v)

    async def forget_exchange(self, vh: VHost, ex: Exchange) -> None:
        if ex.durable:
            await self.processor.kv_put(self.ctx, KV_NS, _SEP.join(("x", vh.name, ex.name)), None)

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
        return _SEP.join(("b", vh.name, b.source, b.kind, b.destination, b.routing_key, b.arguments_key))

    async def add_binding(self, vh: VHost, b: Binding, args: dict[str, Any]) -> None:
        ex = vh.exchanges[b.source]
        if ex.add(b, args) and self._binding_durable(vh, b):
            await self.processor.kv_put(self.ctx, KV_NS, self._binding_key(vh, b), b"{}")

    async def remove_binding(self, vh: VHost, b: Binding) -> None:
        ex = vh.exchanges.get(b.source)
        if ex is None:
            return
        durable = self._binding_durable(vh, b)
        if ex.remove(b):
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
        for c in list(q.consumers):
            c.channel.server_cancel(c)
        q.consumers.clear()
        if q.task is not None:
            q.task.cancel()
            q.task = None
        q.buffer.clear()
        for ex in list(vh.exchanges.values()):
            for b in [b for b in ex.bindings if not b.to_exchange and b.destination == q.name]:
                await self.remove_binding(vh, b)
        if q.durable and q.exclusive is None:
            await self.processor.kv_put(self.ctx, KV_NS, q.key(), None)
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

    async def send(self, ctx: RequestContext, msgs: list[Message]) -> None:
        """processor.send, creating unified topics when auto-creation is off."""
        try:
            await self.processor.send(ctx, msgs)
        except TopicNotFoundError:
            await self.ensure_topics({m.topic for m in msgs})
            await self.processor.send(ctx, msgs)
        for m in msgs:
            self._known_topics.add(m.topic)
        if self.blocked is not None:
            self.set_blocked(None)

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
                    await self.send(self.ctx, [msg])
                    for t in targets:
                        t.on_enqueued(msg)
                    for t in targets:
                        await t.enforce_max_length()
        except UnimqError:
            log.exception("dead-lettering a message of queue %r failed; it stays in the queue", q.name)
            self.release(lease)
            q.count += 1
            return
        self.ack_lease(lease)

    # ------------------------------------------------------------------ store operations (acks, releases)

    def _queue_op(self, op: Callable[[], Any]) -> None:
        self._ops.append(op)
        if not self._ops_scheduled:
            self._ops_scheduled = True
            asyncio.get_running_loop().call_soon(self._run_ops)

    def _run_ops(self) -> None:
        self._ops_scheduled = False
        ops, self._ops = self._ops, []
        if self._acks:
            acks, self._acks = self._acks, {}
            ops.extend(self._ack_op(q, hs) for q, hs in acks.items())
        if ops:
            self._spawn(self._gather(ops))

    def _ack_op(self, q: QueueState, handles: list[str]) -> Callable[[], Any]:
        return lambda: self.processor.ack_batch(self.ctx, q.group, q.topic, handles)

    async def _gather(self, ops: list[Callable[[], Any]]) -> None:
        res = await asyncio.gather(*(op() for op in ops), return_exceptions=True)
        for r in res:
            if isinstance(r, BaseException) and not isinstance(r, UnimqError):
                log.error("store operation failed: %r", r)

    async def flush_ops(self) -> None:
        if self._ops or self._acks:
            self._ops_scheduled = False
            ops, self._ops = self._ops, []
            acks, self._acks = self._acks, {}
            ops.extend(self._ack_op(q, hs) for q, hs in acks.items())
            await self._gather(ops)

    def ack_lease(self, lease: Lease) -> None:
        """Remove a message from its queue for good (ack, no-ack delivery, drop, dead-letter)."""
        if lease.renewing:
            lease.pending = "ack"
            return
        q = lease.queue
        if q.deleted:
            return
        pending = self._acks.get(q)
        if pending is None:
            pending = self._acks[q] = []
        pending.append(lease.handle)
        if not self._ops_scheduled:
            self._ops_scheduled = True
            asyncio.get_running_loop().call_soon(self._run_ops)

    def release(self, lease: Lease) -> None:
        """Put a message back in its queue at once (nack/reject requeue, closed channel)."""
        if lease.renewing:
            lease.pending = "release"
            return
        self.release_handle(lease.queue, lease.handle)

    def release_handle(self, q: QueueState, handle: str) -> None:
        if q.deleted:
            return
        self._queue_op(lambda: self._release(q, handle))

    async def _release(self, q: QueueState, handle: str) -> None:
        try:
            await self.processor.change_invisible(self.ctx, q.group, q.topic, handle, 0)
        except UnimqError:
            pass
        q.store_empty = False
        if not self.stopping:
            q.wake()

    # ------------------------------------------------------------------ background loops

    def _leases(self) -> Iterable[Lease]:
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                yield from q.buffer
        for c in self.connections:
            for ch in c.channels.values():
                yield from ch.unacked.values()

    async def _lease_loop(self) -> None:
        """Renew the store lease of messages held (buffered or unacked) for over half of it."""
        period = max(self.lease_ms / 4000.0, 0.25)
        while True:
            await asyncio.sleep(period)
            limit = time.monotonic() - self.lease_ms / 2000.0
            due = [lease for lease in self._leases() if lease.leased_at < limit and not lease.renewing]
            for lease in due:
                await self._renew(lease)

    async def _renew(self, lease: Lease) -> None:
        q = lease.queue
        if q.deleted:
            return
        lease.renewing = True
        try:
            lease.handle, _ = await self.processor.change_invisible(self.ctx, q.group, q.topic, lease.handle,
                                                                    self.lease_ms)
            lease.leased_at = time.monotonic()
        except UnimqError as e:
            log.warning("could not renew the lease of a message of queue %r: %s", q.name, e)
        finally:
            lease.renewing = False
        if lease.pending == "ack":
            lease.pending = None
            self.ack_lease(lease)
        elif lease.pending == "release":
            lease.pending = None
            self.release(lease)

    async def _expires_loop(self) -> None:
        """x-expires: delete queues unused (no consumers, no get, no redeclare) for that long."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for vh in self.vhosts.values():
                for q in list(vh.queues.values()):
                    if q.expires is not None and not q.consumers and now - q.last_used > q.expires / 1000.0:
                        await self.delete_queue(q)

    # ------------------------------------------------------------------ names

    @staticmethod
    def generated_name(prefix: str) -> str:
        return prefix + base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")


__all__ = ["AmqpBroker", "AmqpError", "Lease", "QueueState", "VHost", "EXCHANGE_TYPES", "build_message"]
