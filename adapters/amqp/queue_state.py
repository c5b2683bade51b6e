"""One AMQP queue: its definition, consumers, ready buffer, pump, spill to its LMQ and durable cursor.

Why the door holds a queue's state and not the store: a queue's arguments,
consumers and prefetch windows are AMQP concepts; what must survive a restart
(its definition, its cursor) goes through the processor's durable key-value
state (``kv_put`` namespace ``amqp``), and its messages live only in the store.

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
- past the broker's ``MEM_LIMIT`` ready messages (or ``MEM_BYTES`` of bodies)
  a queue stops holding new ones in memory ("spill") and reads them back later
  from its LMQ by offset (``processor.pull``), so a queue without consumers
  cannot eat the memory; per broker holding part of the LMQ it reads a
  ``gateway.lmq_reader.SpillLane`` (the reader the MQTT door uses too);
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
import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from core_broker.errors import UnimqError
from core_broker.model import DispatchTarget, Message, StoredMessage
from gateway.lmq_reader import LaneRuns, SpillLane, pull_lane

from . import codec
from .durable import args_key, cursor_key, queue_key
from .errors import AmqpError
from .lease import Lease
from .mapping import lmq_topic
from .tracing import settled as trace_settled
from .priority_buffer import PriorityBuffer, merge_back, offset_of

if TYPE_CHECKING:
    from .broker import AmqpBroker
    from .connection import AmqpConnection
    from .consumer import Consumer
    from .vhost import VHost

log = logging.getLogger("unimq.amqp")

__all__ = ["QueueState", "POP_BATCH", "UNBOUNDED_CREDIT", "now_ms"]

POP_BATCH = 256  # most messages one read-back from an LMQ asks for
BUFFER_SCAN = 64  # messages a TTL queue without consumers pulls forward to expire its head
IDLE_POLL_S = 1.0  # consumers with credit re-check the store this often (messages that came another way)
UNBOUNDED_CREDIT = 256  # window of a no-ack consumer or one with prefetch 0, per pump round


def now_ms() -> int:
    return int(time.time() * 1000)


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


def _spills(lane: SpillLane) -> bool:
    return lane.spill_next is not None


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
        self.mem_limit = broker.mem_limit  # past this many ready messages (or bytes) held, spill
        self.mem_bytes_limit = broker.mem_bytes_limit
        self.returned: list[Lease] = []  # released leases to merge back in offset order

    # -- definition ---------------------------------------------------------------

    def key(self) -> str:
        return queue_key(self.vhost.name, self.name)

    def to_json(self) -> bytes:
        return json.dumps({"auto_delete": self.auto_delete, "args": args_key(self.arguments)}).encode()

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

    def expiry_of(self, m: StoredMessage | Message) -> int | None:
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

    def count_out(self, n: int, nbytes: int) -> None:
        """Deliveries from memory into /metrics' messages_out and bytes_out{protocol="amqp"}, once
        per run of deliveries (read-backs are counted by the processor's pull, as for the MQTT door)."""
        if n:
            self.broker.processor.metrics.count_out("amqp", self.topic, n, nbytes)

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
                        mem = mem_bytes = 0
                        for _ in range(n):
                            lease = buf.popleft()
                            size = len(lease.msg.body)
                            self.mem_bytes -= size
                            deliver(c, lease)
                            if not lease.read_back:
                                mem += 1
                                mem_bytes += size
                        self.count_out(mem, mem_bytes)
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
                        self.count_out(1, len(lease.msg.body))
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
        return cursor_key(self.vhost.name, self.name)

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
        back = sorted(self.returned, key=offset_of)
        self.returned = []
        for lease in back:
            self.mem_bytes += len(lease.msg.body)
        if isinstance(self.buffer, PriorityBuffer):
            self.buffer.merge_back(back)
        else:
            merge_back(self.buffer, back)

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
        if self.broker.tracer.on:
            trace_settled(self.broker.tracer, self.broker.ctx, lease, "expired")
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
            if len(self.buffer) >= self.mem_limit or self.mem_bytes >= self.mem_bytes_limit or self.spill_runs.runs:
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
