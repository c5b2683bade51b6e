"""The AMQP door's server semantics: vhosts, exchanges, queues, consumers' queues.

Why the door holds this state and not the store: AMQP's objects (exchanges,
bindings, queue arguments, consumers, prefetch windows) are protocol
concepts, so they live here; what must survive a restart goes through the
processor's durable key-value state (``kv_put`` namespace ``amqp``), and
messages live only in the store.

Each AMQP queue is a light message queue (``%LMQ%amqp/<vhost>/<queue>``):
a publish is stored once, in its unified topic, and indexed into the LMQ of
every queue it reaches, so every other door and Spark see it. Consuming is
the door's own business, as in RabbitMQ, because every consumer of a queue
is a connection of this door:

- the store's ack of a send tells the door each message's LMQ offset; the
  message object the door sent is queued in memory and handed to a consumer
  with prefetch room at once (no read back, no pop round trip per message);
- a queue's pump hands ready messages out round-robin to consumers with
  credit, so a slow consumer never holds more than its window (fair dispatch);
- ack/nack/reject cost no store call; a requeued message (nack/reject with
  requeue, the unacked messages of a closed channel) goes back to its
  original position (LMQ offset order) with ``redelivered`` set;
- past ``MEM_LIMIT`` ready messages (or ``MEM_BYTES`` of bodies) a queue
  stops holding new ones in memory ("spill") and reads them back later from
  its LMQ by offset (``processor.pull``), so a queue without consumers
  cannot eat the memory;
- a durable queue keeps a cursor in the kv state (``c<SEP>vhost<SEP>queue``):
  the floor (lowest LMQ offset not settled), the offsets settled above it
  (acked out of order), and the delivered high-water mark. It is written
  after acks (coalesced, one write in flight per queue) and completely at a
  clean stop; after a restart the queue reads its LMQ from the floor, skips
  settled offsets and flags messages below the high-water mark redelivered.
  A message is settled only after its ack, so a confirmed persistent message
  is never lost; after a crash a message acked just before it may come back
  (at-least-once, as with RabbitMQ's classic queues);
- transient queues (non-durable or exclusive) keep no cursor: they die with
  the server or their connection;
- an ``x-max-priority`` queue keeps its ready messages in one offset-ordered
  deque per priority (:class:`PriorityBuffer`) and hands out the highest first;
- TTL, max-length (drop-head, or reject-publish) and dead-lettering (with
  the ``x-death`` header) are applied by the door: expiry at the head of the
  queue like RabbitMQ, dead-letter = publish a copy through the DLX, then
  settle the original.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import heapq
import json
import logging
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Iterable

from pamqp import decode as pdecode
from pamqp import encode as pencode

from core_broker.deadline_loop import DeadlineLoop
from core_broker.errors import TopicNotFoundError, UnimqError
from core_broker.model import DispatchTarget, Message, StoredMessage
from gateway.api import MessagingAPI
from gateway.context import RequestContext
from gateway.lmq_reader import LaneRuns, SpillLane, pull_lane

from . import codec
from .mapping import build_message, headers_of, lmq_topic, route_of, set_route, unified_topic, with_headers
from .routing import EXCHANGE_TYPES, PREDECLARED, Binding, Exchange, route

if TYPE_CHECKING:
    from .connection import AmqpConnection, Channel, Consumer

log = logging.getLogger("unimq.amqp")

KV_NS = "amqp"
_SEP = "\x1f"
POP_BATCH = 256  # most messages one read-back from an LMQ asks for
BUFFER_SCAN = 64  # messages a TTL queue without consumers pulls forward to expire its head
IDLE_POLL_S = 1.0  # consumers with credit re-check the store this often (messages that came another way)
UNBOUNDED_CREDIT = 256  # window of a no-ack consumer or one with prefetch 0, per pump round
MEM_LIMIT = 20000  # ready messages a memory queue holds before it spills to its LMQ
MEM_BYTES = 64 * 1024 * 1024  # ... or this many body bytes
_FQ_CACHE_MAX = 65536  # distinct MQTT topics whose amq.topic route is kept (then the cache restarts)
# a foreign message's AMQP queues and the LMQ dispatch targets they add
_ForeignRoute = tuple[tuple["QueueState", ...], tuple[DispatchTarget, ...]]
_NO_ROUTE: _ForeignRoute = ((), ())


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
    """A message of a queue: ready in the queue's buffer, or delivered and unacked."""

    __slots__ = ("queue", "msg", "attempt", "tag", "consumer", "channel", "expires_at", "offset", "tmpl", "priority",
                 "lane", "read_back")

    def __init__(self, queue: "QueueState", msg: StoredMessage | Message, attempt: int, offset: int,
                 lane: SpillLane, tmpl: Any = None, read_back: bool = False) -> None:
        self.queue = queue
        # read back from the store: the processor's pull counted it in messages_out already
        self.read_back = read_back
        self.msg = msg
        self.lane = lane
        self.priority = queue.priority_of(msg) if queue.max_priority else 0
        self.tmpl = tmpl  # (raw properties, exchange, routing key) for delivering it, or None: derive
        self.offset = offset  # the message's LMQ offset (requeue order, the durable cursor)
        self.attempt = attempt
        self.tag = 0
        self.consumer: "Consumer | None" = None
        self.channel: "Channel | None" = None
        self.expires_at = queue.expiry_of(msg) if queue.ttl is not None or queue.per_message_ttl else None


def _spills(lane: SpillLane) -> bool:
    return lane.spill_next is not None


def lmq_offsets(m: Message, result: Any) -> dict[str, int]:
    """LMQ topic -> the offset a sent message got there (from its send result)."""
    offs = getattr(result, "extra_offsets", None) or ()
    return {t.topic: o for t, o in zip(m.extra_dispatch, offs)}


def _offset_of(lease: Lease) -> int:
    return lease.offset


def _merge_back(d: "deque[Lease]", back: list[Lease]) -> None:
    """Put leases (sorted by offset) back into an offset-ordered deque, in place."""
    if not d or back[-1].offset <= d[0].offset:
        d.extendleft(reversed(back))
    else:  # in place: a pump iterating the deque keeps its reference
        merged = list(heapq.merge(back, d, key=_offset_of))
        d.clear()
        d.extend(merged)


class PriorityBuffer:
    """The ready messages of an ``x-max-priority`` queue: highest priority first, then LMQ offset.

    One offset-ordered deque per priority level, with the subset of the deque
    interface the queue's code uses (``popleft``, ``append``, ``[0]``, ``len``).
    """

    def __init__(self, max_priority: int) -> None:
        self.levels: list[deque[Lease]] = [deque() for _ in range(max_priority + 1)]
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def _top(self) -> "deque[Lease]":
        for d in reversed(self.levels):
            if d:
                return d
        raise IndexError("empty buffer")

    def __getitem__(self, i: int) -> Lease:
        if i != 0:
            raise IndexError("only the head of a priority buffer is addressable")
        return self._top()[0]

    def popleft(self) -> Lease:
        lease = self._top().popleft()
        self.n -= 1
        return lease

    def append(self, lease: Lease) -> None:
        self.levels[lease.priority].append(lease)
        self.n += 1

    def clear(self) -> None:
        for d in self.levels:
            d.clear()
        self.n = 0

    def merge_back(self, back: list[Lease]) -> None:
        for level, d in enumerate(self.levels):
            mine = [x for x in back if x.priority == level]
            if mine:
                _merge_back(d, mine)
        self.n += len(back)


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
        self.max_priority = _int_arg(a, "x-max-priority", 0)
        if self.max_priority is not None and self.max_priority > 255:
            raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg 'x-max-priority' for queue: {self.max_priority}",
                            50, 10)
        self.overflow = _str_arg(a, "x-overflow") or "drop-head"
        if self.overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
            raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg 'x-overflow' for queue: {self.overflow!r}", 50, 10)
        self.topic = lmq_topic(vhost.name, name)
        self.targets = (DispatchTarget(self.topic, 0),)  # a publish reaching only this queue
        self.solo = [self]  # VHost.route's answer for the default exchange (never mutated)
        self.group = name
        self.consumers: list[Consumer] = []
        self.rr = 0
        self.buffer: Any = PriorityBuffer(self.max_priority) if self.max_priority else deque()
        self.count = 0  # ready (in the store or the buffer) + unacked
        self.unacked = 0
        self.had_consumer = False
        self.per_message_ttl = False  # a message with an expiration was routed here
        self.last_used = time.monotonic()
        self.deleted = False
        self.event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.store_empty = False  # nothing left to read back from the LMQ
        # a durable queue's cursor over its LMQ, saved in the kv state (see ``settle``)
        self.persist = durable and exclusive is None
        # per broker holding part of the LMQ (one in merged mode), read through gateway.lmq_reader
        self.lanes: dict[str, SpillLane] = {}
        # The spilled messages' order across lanes: runs of [lane, how many LMQ offsets], oldest
        # first. Each lane's offsets keep its own order; these runs interleave the lanes as the
        # messages were enqueued, so a read-back is FIFO in separated mode too.
        self.spill_runs: LaneRuns[SpillLane] = LaneRuns()
        self.saving = False
        self.dirty = False
        self.mem_bytes = 0  # body bytes of the ready messages held
        self.returned: list[Lease] = []  # released leases to merge back in offset order

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

    def priority_of(self, m: StoredMessage | Message) -> int:
        """A message's priority in this queue (RabbitMQ: above the maximum counts as the maximum)."""
        v = m.properties.get("amqp_priority")
        if v is None:
            return 0
        try:
            p = int(v)
        except ValueError:
            return 0
        return min(max(p, 0), self.max_priority or 0)

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
        return (m.born_timestamp_ms or getattr(m, "store_timestamp_ms", 0) or now_ms()) + ttl

    # -- waking and consumers -------------------------------------------------------

    def wake(self) -> None:
        self.event.set()
        if self.task is None and not self.deleted:
            self.task = asyncio.get_running_loop().create_task(self._pump(), name=f"amqp-queue-{self.name}")

    def drop_consumer(self, c: "Consumer") -> None:
        """Forget a cancelled or closed consumer (an unused queue starts towards its x-expires)."""
        if c in self.consumers:
            self.consumers.remove(c)
            if not self.consumers and self.expires is not None:
                self.broker.expiry_changed()

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

    def count_out(self, n: int) -> None:
        """Deliveries from memory into /metrics' messages_out{protocol="amqp"}, once per run of
        deliveries (read-backs are counted by the processor's pull, as for the MQTT door)."""
        if n:
            metrics = self.broker.processor.metrics
            metrics.inc("messages_out", "amqp", n)
            metrics.inc_topic("messages_out", "amqp", self.topic, n)

    async def _pump(self) -> None:
        broker = self.broker
        try:
            while not self.deleted:
                self.event.clear()
                if self.returned:
                    self.merge_returned()
                if self.buffer and self.buffer[0].expires_at is not None:
                    await self._expire_head()
                # hand buffered messages to consumers with credit, round robin
                buf = self.buffer
                while buf and self.consumers:
                    if len(self.consumers) == 1 and not self.per_message_ttl and self.ttl is None:
                        # one consumer, nothing to expire (the common case): a run of deliveries
                        c = self.consumers[0]
                        n = min(c.credit(), len(buf))
                        if n <= 0:
                            break
                        deliver = c.channel.deliver
                        mem = 0
                        for _ in range(n):
                            lease = buf.popleft()
                            self.mem_bytes -= len(lease.msg.body)
                            deliver(c, lease)
                            mem += not lease.read_back
                        self.count_out(mem)
                        continue
                    c = self._next_consumer()
                    if c is None:
                        break
                    lease = buf.popleft()
                    self.mem_bytes -= len(lease.msg.body)
                    if lease.expires_at is not None and lease.expires_at <= now_ms():
                        await self._expired(lease)
                        continue
                    c.channel.deliver(c, lease)
                    if not lease.read_back:
                        self.count_out(1)
                want = self._credit() if self.consumers else 0
                if want > 0 and not buf:
                    got = await self._pull_spill(want)
                    if got:
                        continue
                elif not self.consumers and self._needs_scan() and len(buf) < BUFFER_SCAN and not self.store_empty:
                    if await self._pull_spill(BUFFER_SCAN - len(buf)):
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

    # -- the durable cursor --------------------------------------------------------------

    def lane(self, broker: str) -> SpillLane:
        ln = self.lanes.get(broker)
        if ln is None:
            ln = self.lanes[broker] = SpillLane(broker)
        return ln

    def settle(self, lease: Lease) -> None:
        """A message left the queue for good: advance its lane's floor past it (durable queues)."""
        if self.persist:
            lease.lane.settle(lease.offset)
            self.broker.save_cursor(self)

    def spilling(self) -> bool:
        return any(ln.spill_next is not None for ln in self.lanes.values())

    def cursor_key(self) -> str:
        return _SEP.join(("c", self.vhost.name, self.name))

    def cursor_json(self, full: bool = False) -> bytes:
        return json.dumps({"l": {b: ln.to_json(full) for b, ln in self.lanes.items()}},
                          separators=(",", ":")).encode()

    def restore(self, raw: bytes | None, offsets: dict[str, tuple[int, int]]) -> None:
        """After a restart: the cursor saved in kv and each broker's LMQ offsets give the ready messages."""
        saved: dict[str, Any] = {}
        if raw:
            try:
                saved = json.loads(raw).get("l", {})
            except (ValueError, AttributeError):
                log.warning("unreadable cursor of queue %r; redelivering it from its start", self.name)
        self.count = 0
        self.spill_runs.clear()
        for b, (lo, hi) in sorted(offsets.items()):
            lane = self.lane(b)
            self.count += lane.restore(saved.get(b) or {}, lo, hi)
            if lane.spill_next is not None:  # the order across brokers is not kept over a restart
                self.spill_runs.note(lane, lane.end - lane.spill_next)

    # -- memory queue ----------------------------------------------------------------------

    def merge_returned(self) -> None:
        """Put released memory-queue messages back at their original positions."""
        back = sorted(self.returned, key=_offset_of)
        self.returned = []
        for lease in back:
            self.mem_bytes += len(lease.msg.body)
        if isinstance(self.buffer, PriorityBuffer):
            self.buffer.merge_back(back)
        else:
            _merge_back(self.buffer, back)

    def hold(self, lease: Lease) -> None:
        """A released memory-queue lease comes back (merged in offset order before the next delivery)."""
        lease.attempt += 1
        lease.consumer = None
        lease.channel = None
        self.returned.append(lease)

    async def _pull_spill(self, n: int) -> int:
        """Read messages the queue did not hold back from its LMQ; returns how many it queued."""
        got = 0
        runs = self.spill_runs
        while got == 0:
            head = runs.head(_spills)
            if head is None:
                for ln in self.lanes.values():  # not expected: spilled offsets outside every run
                    if ln.spill_next is not None:
                        runs.note(ln, ln.end - ln.spill_next)
                head = runs.head(_spills)
                if head is None:
                    self.store_empty = True
                    return 0
            lane, left = head
            start = lane.spill_next
            assert start is not None
            try:
                # in separated mode the broker holding this lane may need the LMQ made known there first
                r = await pull_lane(self.broker.processor, self.topic, lane, start, max(1, min(n, left, POP_BATCH)),
                                    self.broker.ctx)
            except UnimqError:
                log.exception("reading queue %r back from the store failed", self.name)
                return 0
            if self.deleted or lane.spill_next != start:
                return 0  # purged or deleted meanwhile
            buf = self.buffer
            check = self.persist
            hw = lane.hw
            for m in r.messages:
                off = m.queue_offset
                if check and lane.is_settled(off):
                    continue  # acked out of order before a restart
                buf.append(Lease(self, m, 2 if off < hw else 1, off, lane, read_back=True))
                self.mem_bytes += len(m.body)
                got += 1
            nxt = max(r.next_offset, start)
            if not r.messages and nxt == start:
                nxt = lane.end  # nothing readable there any more (retention): give up on the rest
                self.count = max(self.count - (nxt - start), self.unacked + len(buf))
            lane.spill_next = nxt if nxt < lane.end else None
            runs.taken(lane, nxt - start)  # the offsets read off this lane's runs, oldest first
        self.store_empty = not self.spilling()
        return got

    async def take_one(self) -> Lease | None:
        """Basic.Get: the next ready message (the buffer first), expired ones dropped."""
        self.last_used = time.monotonic()
        while True:
            if self.returned:
                self.merge_returned()
            if not self.buffer:
                if await self._pull_spill(1) == 0:
                    return None
            if not self.buffer:
                return None
            lease = self.buffer.popleft()
            self.mem_bytes -= len(lease.msg.body)
            if lease.expires_at is not None and lease.expires_at <= now_ms():
                await self._expired(lease)
                continue
            return lease

    async def _expire_head(self) -> None:
        buf = self.buffer
        now = now_ms()
        while buf and buf[0].expires_at is not None and buf[0].expires_at <= now:
            lease = buf.popleft()
            self.mem_bytes -= len(lease.msg.body)
            await self._expired(lease)

    async def _expired(self, lease: Lease) -> None:
        self.count -= 1
        await self.broker.dead_letter(self, lease, "expired")

    def on_enqueued(self, msg: Message, offset: int | None, broker: str, tmpl: Any = None) -> None:
        """A message was stored into this queue's LMQ (at ``offset``, when known)."""
        self.count += 1
        if msg.properties.get("amqp_expiration") is not None:
            self.per_message_ttl = True
        lane = self.lanes.get(broker) or self.lane(broker)
        old = lane.end
        if offset is None:  # should not happen: read it (and what follows) back from the LMQ
            offset = old
        if offset > old and lane.spill_next is None:
            lane.spill_next = old  # messages the door did not see: read them back
        if offset + 1 > old:
            lane.end = offset + 1
        if lane.spill_next is None:
            if len(self.buffer) >= MEM_LIMIT or self.mem_bytes >= MEM_BYTES or self.spill_runs.runs:
                lane.spill_next = offset  # (spill_runs: another lane spills; this one waits behind it)
            else:
                self.buffer.append(Lease(self, msg, 1, offset, lane, tmpl))
                self.mem_bytes += len(msg.body)
                self.wake()
                return
        k = lane.end - old
        if k > 0:
            self.spill_runs.note(lane, k)
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
        if self.returned:
            self.merge_returned()
        while self.buffer:
            lease = self.buffer.popleft()
            self.broker.ack_lease(lease)
            n += 1
        self.mem_bytes = 0
        for lane in self.lanes.values():
            if lane.spill_next is not None:
                n += lane.end - lane.spill_next
                if self.persist:
                    lane.settle_range(lane.spill_next, lane.end)
                    self.broker.save_cursor(self)
                lane.spill_next = None
        self.spill_runs.clear()
        self.count = self.unacked
        return n


class VHost:
    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueState] = {}
        self._topics: dict[tuple[str, str], tuple[str, str | None]] = {}
        # bumped by every change of exchanges, bindings or queues: routing caches built
        # over this vhost (the cross-door amq.topic routes) drop their entries on a change
        self.version = 0
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
        if exchange == "":  # the default exchange: the queue named by the routing key (the hot path)
            q = self.queues.get(routing_key)
            return q.solo if q is not None else []
        names = route(self.exchanges, exchange, routing_key, headers, self.queues.__contains__)
        qs = self.queues
        return [qs[n] for n in names if n in qs]


class AmqpBroker:
    """Door-wide AMQP state and the store operations every connection shares."""

    def __init__(self, processor: MessagingAPI, settings: Any) -> None:
        self.processor = processor
        self.settings = settings
        self.ctx = RequestContext(protocol="amqp", client_id="amqp-door")
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

    def route(self, m: Message) -> tuple[DispatchTarget, ...]:
        return self._foreign_queues(m)[1]

    def after_send(self, messages: Any, results: Any) -> None:
        for m, r in zip(messages, results):
            qs = self._foreign_queues(m)[0]
            if qs:
                offsets = lmq_offsets(m, r)
                for q in qs:
                    q.on_enqueued(m, offsets.get(q.topic), getattr(r, "broker", ""))

    async def start(self) -> None:
        pencode.support_deprecated_rabbitmq(True)  # integers in tables as b/s/I/l, the types RabbitMQ sends
        if hasattr(self.processor, "add_router"):
            self.processor.add_router(self)
        await self._load()
        self._expiry.start()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.count or q.ttl is not None:
                    q.wake()

    async def stop(self) -> None:
        self.stopping = True
        if hasattr(self.processor, "remove_router"):
            self.processor.remove_router(self)
        await self._expiry.stop()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.task is not None:
                    q.task.cancel()
        for t in list(self._background):
            try:
                await asyncio.wait_for(t, 5)
            except BaseException:
                pass
        for vh in self.vhosts.values():  # last, complete cursors (settled sets of any size)
            for q in vh.queues.values():
                if q.persist and not q.deleted:
                    try:
                        await self.processor.kv_put(self.ctx, KV_NS, q.cursor_key(), q.cursor_json(full=True))
                    except UnimqError as e:
                        log.warning("could not save the cursor of queue %r: %s", q.name, e)
        for t in list(self._background):
            try:
                await asyncio.wait_for(t, 5)
            except BaseException:
                pass

    async def _load(self) -> None:
        items = await self.processor.kv_items(self.ctx, KV_NS)
        durable_topics: set[str] = set()
        bindings: list[tuple[str, bytes]] = []
        cursors: dict[str, bytes] = {}
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
                elif kind == "c":
                    cursors[key] = value
            except Exception:
                log.exception("ignoring unreadable AMQP state entry %r", key)
        for key, value in bindings:
            _, vname, src, kind, dest, rk, ak = key.split(_SEP)
            vh = self.vhosts[vname]
            ex = vh.exchanges.get(src)
            if ex is None or (kind == "q" and dest not in vh.queues) or (kind == "e" and dest not in vh.exchanges):
                continue
            ex.add(Binding(src, dest, kind == "e", rk, ak), _args_decode(ak))
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


__all__ = ["AmqpBroker", "AmqpError", "Lease", "QueueState", "VHost", "EXCHANGE_TYPES", "build_message"]
