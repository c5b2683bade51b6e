"""BrokerController: one broker — the store plus the services that give it RocketMQ 5 semantics.

It is the boundary the gateway's broker client talks to: in merged mode by
in-process calls, in separated mode over RPC. Every method speaks domain types
only. All state outside the store is owned by the event loop the broker was
started on; store writes are memory copies, and fsync waits are awaited, never
blocked on.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from . import consumer_stats
from .config import BrokerConfig, StoreConfig
from .deadline_loop import DeadlineLoop
from .door_feed import DoorFeed
from .errors import BadRequestError, IllegalFilterExpressionError, TopicNotFoundError, UnimqError
from .filter import compile_filter
from .journal import Journal
from .json_file import read_json, write_json_atomic
from .door_kv import DoorStateKv, kv_version  # noqa: F401  (kv_version: imported from here too)
from .message_query import MessageQueries
from .message_store import MessageStore
from .model import FilterExpression, FilterType, GetResult, GetStatus, Message, MessageType, PutResult
from .pop_service import PoppedMessage, PopService
from .receipt import ReceiptHandle
from .system_topics import (
    DLQ_PREFIX,
    JOURNAL_TOPIC,
    RETRY_PREFIX,
    is_lmq,
    is_system_topic,
    public_properties,
    retry_topic,
)
from .timer_service import TimerService
from .topic_config import TopicConfig
from .transaction_service import TransactionChecker, TransactionService

if TYPE_CHECKING:
    from .tier import TierService
    from .tier.cold_pops import ColdPops

log = logging.getLogger("unimq.broker")

# A delivery time closer than this is delivered at once (clock granularity).
DELAY_THRESHOLD_MS = 50
_delay_of = attrgetter("delivery_time_ms")


@dataclass
class QueueStats:
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass
class TopicStats:
    config: TopicConfig
    queues: list[QueueStats]


class BrokerController(MessageQueries, DoorStateKv):
    def __init__(self, store_config: StoreConfig, config: BrokerConfig | None = None) -> None:
        self.config = config or BrokerConfig()
        self.name = self.config.broker_name
        self.store = MessageStore(store_config)
        # When a put may be acknowledged (store.durability): under async flush and without
        # replicas a write is done once in the mapping, and the hot paths skip the wait.
        self.durability = self.store.durability
        self.journal = Journal(self.store)
        self.timers = TimerService(self.store, self.journal, self.notify)
        self.transactions = TransactionService(self.store, self.journal, self.config, self.notify)
        self.pops = PopService(self.store, self.journal, self.timers, self.config, self.notify, self.ensure_system_topic)
        # sleeps until the earliest invisible time ends; a pop pushing an earlier one wakes it
        self._reviver = DeadlineLoop("unimq-revive", self._revive_round, max_sleep_s=self.config.revive_interval_ms / 1000)
        self.pops.wake_reviver = self._reviver.wake
        self._state_path = store_config.data_dir / "config" / "broker_state.json"
        self._snap_lock = threading.Lock()
        self._snap_seq = 0
        self._snap_written = 0
        self._snap_last: dict | None = None  # the last snapshot handed to a writer, without "ts"
        self._waiters: dict[str, set[asyncio.Future]] = {}
        self._tasks: list[asyncio.Task] = []
        self._rr: dict[tuple[str, str], int] = {}
        # Small durable state for the doors (MQTT sessions and retained messages, AMQP
        # exchanges/queues/bindings, HTTP push subscriptions): journaled + snapshotted.
        # the values as base64 text, as the journal and the snapshot hold them (door_kv.py: the
        # only copy; a read decodes)
        self.kv_text: dict[str, dict[str, str]] = {}
        self.kv_versions: dict[str, dict[str, int]] = {}  # tombstones of deleted entries too
        self._kv_last = 0
        self.door_feed = DoorFeed()  # gateways long-poll it for each other's door-state writes (door_feed.py)
        # Called when the broker creates a topic itself (retry and dead-letter topics).
        self.on_topics_changed: Callable[[], None] | None = None
        # Tiered storage, when the store's config turns it on (attached at start).
        self.tier: TierService | None = None
        self.cold_pops: ColdPops | None = None  # pops of what only the tier holds (tier on)
        self.started = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self.store.running:  # a promoted replica's store is open already
            await asyncio.to_thread(self.store.start)
        if self.store.config.tier_enabled and self.store.tier is None:
            from .tier import TierService  # late: boto3 is needed only with the tier on

            # boto3 builds its client from JSON models (tens of ms): off the event loop
            self.tier = self.store.tier = tier = await asyncio.to_thread(TierService, self.store)
            try:  # an empty local log continues after the tier's end: before any put (the journal's too)
                await asyncio.to_thread(tier.continue_empty_log)
            except BaseException:
                await asyncio.to_thread(tier.stop)
                self.tier = self.store.tier = None
                await asyncio.to_thread(self.store.shutdown)
                raise
            tier.start()
            from .tier.cold_pops import ColdPops

            self.cold_pops = ColdPops(tier, self.pops)
        state = await asyncio.to_thread(read_json, self._state_path, {})
        self.pops.load(state.get("pop"))
        self.timers.tracker = type(self.timers.tracker).from_json(state.get("timer"))
        self.transactions.load(state.get("txn"))
        self.kv_text = {ns: dict(items) for ns, items in state.get("kv", {}).items()}
        # snapshots before versions: every entry is at version 0 (older than any versioned write)
        self.kv_versions = state.get("kvv") or {ns: {k: 0 for k in items} for ns, items in self.kv_text.items()}
        self._kv_last = max((v for items in self.kv_versions.values() for v in items.values()), default=0)
        replayed = 0
        start = int(state.get("journal", 0))
        entries: Iterable[tuple[str, dict]] = self.journal.replay(start)
        if self.tier is not None and start < self.store.min_offset(JOURNAL_TOPIC, 0):
            # after a restart with an empty disk the entries since the snapshot are in the tier
            entries = await self.tier.run_cold(list, self.journal.replay(start, self.tier.reader.get))
        for op, data in entries:
            if op == "kv":
                self._apply_kv(data)
                continue
            if op == "kvs":  # kv_put_many: several writes of one namespace in one record
                n = data["n"]
                for k, v, ver in data["e"]:
                    self._apply_kv_raw(n, k, v, ver)
                continue
            if op == "topic":  # topic configs follow the journal (a promoted replica has them)
                self.store.topics.put(TopicConfig(**data))
                continue
            if op == "tdel":
                for t in data["t"]:
                    self.store.topics.discard(t)
            if op == "off":
                self.store.offsets.commit(data["g"], data["t"], data["q"], data["o"])
                continue
            if op == "offs":  # commit_offsets: several queues of one group in one record
                for t, q, o in data["o"]:
                    self.store.offsets.commit(data["g"], t, q, o)
                continue
            if op == "acks":  # ack_batch: several acks in one record
                for t, q, o in data["a"]:
                    self.pops.apply("ack", {"g": data["g"], "t": t, "q": q, "o": o})
                replayed += 1
                continue
            self.pops.apply(op, data)
            self.timers.apply(op, data)
            self.transactions.apply(op, data)
            replayed += 1
        self.timers.rebuild()
        self.transactions.rebuild()
        self.pops.rebuild_heap()
        if replayed:
            log.info("replayed %d journal entries", replayed)
        loop = asyncio.get_running_loop()
        self.timers.start()
        self.transactions.start()
        self._reviver.start()
        self._tasks = [loop.create_task(self._snapshot_loop(), name="unimq-snapshot")]
        self.started = True

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        await self._reviver.stop()
        await self.timers.stop()
        await self.transactions.stop()
        for futs in self._waiters.values():
            for f in futs:
                if not f.done():
                    f.set_result(None)
        await self.write_snapshot()
        tier = self.tier
        if tier is not None:  # its workers read segment files: stop them before they close
            await asyncio.to_thread(tier.stop)
            self.tier = self.store.tier = self.cold_pops = None
        await asyncio.to_thread(self.store.shutdown)

    def _snapshot(self) -> dict:
        self.pops.commit_floors()
        self.prune_tombstones()
        return {
            "journal": self.journal.next_offset,
            "pop": self.pops.snapshot(),
            "timer": self.timers.tracker.to_json(),
            "txn": self.transactions.snapshot(),
            "kv": {ns: dict(items) for ns, items in self.kv_text.items()},
            "kvv": {ns: dict(items) for ns, items in self.kv_versions.items()},
            "ts": int(time.time() * 1000),
        }

    async def write_snapshot(self) -> None:
        # Built on the loop (consistent with the journal offset it names), written on a thread.
        snap = self._snapshot()
        # An idle broker's snapshot does not change: skip rewriting (and fsyncing) the same
        # state. Compared with the last one handed to a writer: the journal offset it names
        # only grows, so an equal snapshot cannot be older than one written since.
        ts = snap.pop("ts")
        if snap == self._snap_last:
            return
        self._snap_last = snap
        self._snap_seq += 1
        try:
            await asyncio.to_thread(self._write_state, self._snap_seq, {**snap, "ts": ts})
        except BaseException:
            self._snap_last = None  # not known to be on disk: the next round writes it
            raise

    def _write_state(self, seq: int, snap: dict) -> None:
        # A cancelled snapshot loop leaves its writer thread running, and stop() then
        # writes the final snapshot: writers take turns (they share the temp file), and
        # an older snapshot never replaces a newer one.
        with self._snap_lock:
            if seq > self._snap_written:
                # offsets first: the journal after this snapshot replays only later commits
                self.store.offsets.persist()
                write_json_atomic(self._state_path, snap)
                self._snap_written = seq

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.state_snapshot_interval_s)
            try:
                await self.write_snapshot()
            except Exception:
                log.exception("broker state snapshot failed")

    async def _revive(self) -> None:
        self.pops.revive_due()
        if self.cold_pops is not None and await self.cold_pops.resolve():
            self.pops.revive_due()  # what was popped from the tier, its records now looked up

    async def _revive_round(self) -> float | None:
        """Revive what is due; seconds until the next invisible time ends (None: none in flight)."""
        await self._revive()
        due = self.pops.next_due_ms()
        return None if due is None else max(0.0, (due - int(time.time() * 1000)) / 1000)

    # ------------------------------------------------------------------ arrivals (long polling)

    def notify(self, topic: str) -> None:
        futs = self._waiters.pop(topic, None)
        if futs:
            for f in futs:
                if not f.done():
                    f.set_result(None)

    async def _wait_arrival(self, topics: Sequence[str], timeout: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        for t in topics:
            self._waiters.setdefault(t, set()).add(fut)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns normally when
            # the task is cancelled just as the future completes, losing the cancellation.
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:
            for t in topics:
                s = self._waiters.get(t)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        self._waiters.pop(t, None)

    # ------------------------------------------------------------------ topics

    def create_topic(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig:
        self.durability.check_writable()
        r = self.store.topics.create(tc, exist_ok=exist_ok)
        if r is tc:  # new: journaled, so replicas (and a promoted replica) have it
            self.journal.append("topic", tc.to_json())
        return r

    def update_topic(self, tc: TopicConfig) -> TopicConfig:
        self.durability.check_writable()
        r = self.store.topics.update(tc)
        self.journal.append("topic", tc.to_json())
        return r

    def delete_topic(self, name: str) -> None:
        self.store.topics.delete(name)
        doomed = [name]
        if not name.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            # Each group's retries of the topic go with it: a topic created again under
            # the same name must not redeliver the old topic's messages.
            for g in sorted({g for (g, t, _) in self.pops.cursors if t == name}):
                rt = retry_topic(g, name)
                if self.store.topics.get(rt) is not None:
                    self.store.topics.delete(rt)
                    doomed.append(rt)
        for t in doomed:
            self.store.delete_topic_queues(t)
            self.pops.drop_group_topic(t)
        # Journaled, so a restart that replays pops of the old topic drops them again
        # (otherwise a group's cursor would skip the new topic's first messages).
        self.journal.append("tdel", {"t": doomed})

    def get_topic(self, name: str) -> TopicConfig | None:
        """A topic's config; an LMQ's only where it was created (hosted) or holds entries."""
        topics = self.store.topics
        if is_lmq(name):
            return topics.hosted(name) or (topics.lmq(name) if self.store.has_queue(name, 0) else None)
        return topics.get(name)

    def route_config(self, name: str) -> TopicConfig | None:
        """:meth:`get_topic`, but every LMQ exists on every broker (routes and reads never miss one)."""
        return self.store.topics.get(name)

    def list_topics(self, include_system: bool = False) -> list[TopicConfig]:
        """The topic table; with ``include_system`` also the LMQs this broker holds entries of."""
        topics = self.store.topics
        out = [t for t in topics.topics.values() if include_system or not is_system_topic(t.name)]
        if include_system:
            out += [topics.lmq(t) for t in sorted(self.store.queued_topics()) if is_lmq(t)]
        return out

    def describe_topic(self, name: str) -> TopicStats:
        tc = self.store.topics.require(name)
        qs = [QueueStats(q, self._min_offset(name, q), self.store.max_offset(name, q)) for q in tc.queue_ids]
        return TopicStats(tc, qs)

    def ensure_system_topic(self, name: str) -> None:
        if self.store.topics.get(name) is None:
            tc = TopicConfig(name, queues=1, system=True)
            if self.store.topics.create(tc, exist_ok=True) is tc:
                self.journal.append("topic", tc.to_json())
            if self.on_topics_changed is not None:
                self.on_topics_changed()  # separated mode: the nameservers learn of it now

    # ------------------------------------------------------------------ produce

    async def send(
        self, msgs: Sequence[Message], *, transactional: bool = False, producer_group: str = ""
    ) -> list[tuple[PutResult, str | None]]:
        """Store messages whose queue the caller chose. Returns (result, transaction id)."""
        durability = self.durability
        if durability.waits:  # only then can anything refuse a write (a replica condition)
            durability.check_writable()  # a replica, or too few in-sync replicas: refused unwritten
        if not transactional:
            for m in msgs:
                if m.delivery_time_ms:  # maybe one to schedule: the general path decides
                    break
            else:  # the common case: nothing to schedule, one store call for all
                store = self.store
                if len(msgs) == 1:
                    r = store.put_nowait(msgs[0])
                    if self._waiters:
                        self._notify_sent(msgs)
                    if durability.waits:
                        await store.wait_durable(r)
                    return [(r, None)]
                results = store.put_batch_nowait(msgs)
                if self._waiters:
                    self._notify_sent(msgs)
                if durability.waits:
                    # written in order under the store lock: the last record ends furthest
                    await store.wait_durable(results[-1])
                return [(r, None) for r in results]
        now = int(time.time() * 1000)
        out: list[tuple[PutResult, str | None]] = []
        plain: list[Message] = []
        last: PutResult | None = None
        for m in msgs:
            if transactional:
                r, tid = self.transactions.prepare(m, producer_group)
                out.append((r, tid))
                last = r
            elif m.delivery_time_ms > now + DELAY_THRESHOLD_MS:
                r = self.timers.schedule(m, m.delivery_time_ms)
                out.append((r, None))
                last = r
            else:
                plain.append(m)
                out.append((None, None))  # type: ignore[arg-type]
        if plain:
            results = self.store.put_batch_nowait(plain) if len(plain) > 1 else [self.store.put_nowait(plain[0])]
            it = iter(results)
            out = [(next(it), None) if r is None else (r, t) for r, t in out]
            last = max((r for r, _ in out), key=lambda r: r.commitlog_offset + r.store_size)
            if self._waiters:
                self._notify_sent(plain)
        if last is not None:
            await self.store.wait_durable(last)
        return out

    def put_nowait(self, msg: Message) -> PutResult:
        """One plain message stored at once, for callers in this process whose send waits for nothing
        (``durability.waits`` false: async flush, no replica condition; so nothing can refuse the
        write either). A delayed message is scheduled by :meth:`send` instead."""
        if self.durability.waits or msg.delivery_time_ms:
            raise BadRequestError("a delayed message, or a write that must wait, goes through send()")
        r = self.store.put_nowait(msg)
        if self._waiters:
            self._notify_sent((msg,))
        return r

    def put_batch_nowait(self, msgs: Sequence[Message]) -> list[PutResult]:
        """:meth:`put_nowait` for a run of plain messages: one store call (``put_batch_nowait``,
        whose compiled encoder takes each run of one queue), under the same conditions."""
        if self.durability.waits or any(map(_delay_of, msgs)):
            raise BadRequestError("a delayed message, or a write that must wait, goes through send()")
        results = self.store.put_batch_nowait(msgs)
        if self._waiters:
            self._notify_sent(msgs)
        return results

    def _notify_sent(self, msgs: Sequence[Message]) -> None:
        """Wake long polls on the topics just written (multi-dispatch queues too)."""
        for m in msgs:
            self.notify(m.topic)
            for t in m.extra_dispatch:
                self.notify(t.topic)

    async def end_transaction(self, transaction_id: str, commit: bool, source: str = "client") -> None:
        r = self.transactions.end(transaction_id, commit, source)
        if r is not None:
            await self.store.wait_durable(r)

    def set_transaction_checker(self, checker: TransactionChecker | None) -> None:
        self.transactions.checker = checker

    # ------------------------------------------------------------------ pop consumption

    def _pop_queues(self, group: str, topic: str, tc: TopicConfig) -> list[tuple[str, int]]:
        key = (group, topic)
        n = tc.queues
        start = self._rr.get(key, 0)
        self._rr[key] = (start + 1) % max(n, 1)
        queues = [(topic, tc.queue_base + (start + i) % n) for i in range(n)]
        if tc.message_type != MessageType.FIFO and not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            rt = retry_topic(group, topic)
            if self.store.topics.get(rt) is not None:
                # retries first on alternate rounds so they are not starved by a busy topic
                queues = [(rt, 0)] + queues if start % 2 == 0 else queues + [(rt, 0)]
        return queues

    async def pop(
        self,
        group: str,
        topic: str,
        max_count: int,
        invisible_ms: int,
        filter_expression: FilterExpression | None = None,
        wait_ms: int = 0,
        from_latest: bool = False,
        fifo: bool | None = None,
        skip_queues: Sequence[int] = (),
        scan_limits: Sequence[tuple[int, int]] = (),
    ) -> list[PoppedMessage]:
        tc = self.store.topics.get(topic)
        if tc is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        if max_count < 1 or max_count > 1024:
            raise BadRequestError("max_count must be between 1 and 1024")
        if invisible_ms < 0:
            raise BadRequestError("invisible time must not be negative")
        flt = None
        if filter_expression is not None and not filter_expression.matches_all:
            flt = compile_filter(filter_expression)
            refuse_batch_sql(tc, filter_expression)
        is_fifo = tc.message_type == MessageType.FIFO if fifo is None else fifo
        wait_ms = min(max(wait_ms, 0), self.config.max_long_poll_ms)
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            queues = self._pop_queues(group, topic, tc)
            if skip_queues:  # a static FIFO topic's queues whose older part elsewhere is not consumed yet
                queues = [(t, q) for t, q in queues if t != topic or q not in skip_queues]
            ahead = None
            if self.cold_pops is not None:
                ahead = await self.cold_pops.read_ahead(group, queues, max_count, flt, is_fifo, from_latest)
            msgs, last = self.pops.pop(group, queues, max_count, invisible_ms, flt, is_fifo, from_latest, ahead,
                                       {(topic, q): end for q, end in scan_limits} if scan_limits else None)
            if msgs or time.monotonic() >= deadline:
                break
            left = deadline - time.monotonic()
            # wake on arrival; re-poll at least every 500 ms (retries and in-place FIFO redelivery)
            await self._wait_arrival((topic, retry_topic(group, topic)), min(left, 0.5))
        for p in msgs:
            m = p.message
            if m.properties:
                m.properties = public_properties(m.properties)
        return msgs

    async def ack(self, group: str, receipt_handle: str) -> None:
        r = self.pops.ack(group, receipt_handle)
        if self.durability.waits:
            await self.store.wait_durable(r)

    async def ack_batch(self, group: str, receipt_handles: Sequence[str]) -> list[str | None]:
        """Ack several popped messages with one journal record (doors that settle in bulk).

        Returns, per handle, None or the error code of a handle that could not be acked.
        """
        out: list[str | None] = []
        done: list[list] = []
        inflight = self.pops._inflight
        for h in receipt_handles:
            try:
                rh = ReceiptHandle.decode(h)  # base64 parts cached: cheap per handle
                c, _inf = inflight(group, rh)
                del c.inflight[rh.offset]
                done.append([rh.topic, rh.queue_id, rh.offset])
                out.append(None)
            except UnimqError as e:
                out.append(e.code)
        if done:
            r = self.journal.append("acks", {"g": group, "a": done})
            await self.store.wait_durable(r)
        return out

    async def change_invisible(self, group: str, receipt_handle: str, invisible_ms: int) -> tuple[str, int]:
        if invisible_ms < 0:
            raise BadRequestError("invisible time must not be negative")
        handle, visible_at, r = self.pops.change_invisible(group, receipt_handle, invisible_ms)
        if invisible_ms == 0:
            await self._revive()  # a release (nack/requeue) is handed back at once, not next round
        await self.store.wait_durable(r)
        return handle, visible_at

    async def forward_to_dlq(self, group: str, receipt_handle: str) -> None:
        r = self.pops.forward_to_dlq(group, receipt_handle)
        await self.store.wait_durable(r)

    # ------------------------------------------------------------------ pull consumption

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        filter_expression: FilterExpression | None = None,
        wait_ms: int = 0,
    ) -> GetResult:
        tc = self.store.topics.get(topic)
        if tc is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        if queue_id not in tc.queue_ids:
            raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")
        if max_count < 1:
            raise BadRequestError("max_count must be positive")
        flt = None
        if filter_expression is not None and not filter_expression.matches_all:
            flt = compile_filter(filter_expression)
            refuse_batch_sql(tc, filter_expression)
        deadline = time.monotonic() + min(max(wait_ms, 0), self.config.max_long_poll_ms) / 1000.0
        while True:
            if self.tier is None:
                r = self.store.get(topic, queue_id, offset, max_count, flt)
            else:  # local links whose origin only the tier holds are delivered, not skipped
                r = await self.tier.get_local_async(topic, queue_id, offset, max_count, flt)
            caught_up = r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
            if not caught_up or time.monotonic() >= deadline:
                break
            await self._wait_arrival((topic,), min(deadline - time.monotonic(), 0.5))
        if r.status == GetStatus.OFFSET_MOVED and self.tier is not None:  # gone locally: try the tier
            cold = await self.tier.get_async(topic, queue_id, offset, max_count, flt)
            if cold is not None:
                r = cold
        for m in r.messages:
            m.properties = public_properties(m.properties)
        return r

    def _compacted(self, topic: str, queue_id: int | None = None) -> None:
        tc = self.store.topics.get(topic)
        if tc is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        if tc.message_type != MessageType.COMPACTED:
            raise BadRequestError(f"topic {topic!r} is {tc.message_type.value}, not COMPACTED")
        if queue_id is not None and queue_id not in tc.queue_ids:
            raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")

    async def read_table(self, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        """A compacted queue read as a table: the latest message of each key from ``offset``."""
        self._compacted(topic, queue_id)
        r = await asyncio.to_thread(self.store.compaction.table, topic, queue_id, offset, max(1, max_count))
        for m in r.messages:
            m.properties = public_properties(m.properties)
        return r

    async def compact_topic(self, topic: str) -> dict:
        """Compact a compacted topic's queues now, as far as they can go (the admin trigger)."""
        self._compacted(topic)
        return await asyncio.to_thread(self.store.compaction.compact_now, topic)

    def pull_raw(
        self, topic: str, queue_id: int, offset: int, max_count: int
    ) -> tuple[bytes, memoryview, int, str, int, int] | None:
        """Undecoded consume-queue entries and commitlog bytes for columnar readers (see
        MessageStore.get_raw); None: use pull()."""
        tc = self.store.topics.get(topic)
        if tc is None or queue_id not in tc.queue_ids or max_count < 1:
            return None
        return self.store.get_raw(topic, queue_id, offset, max_count)

    def pull_batches(self, topic: str, queue_id: int, offset: int, max_count: int) -> tuple[list, int, int] | None:
        """A batch queue's records, whole (see MessageStore.get_batches); None: use pull()."""
        tc = self.store.topics.get(topic)
        if tc is None or queue_id not in tc.queue_ids or max_count < 1:
            return None
        return self.store.get_batches(topic, queue_id, offset, max_count)

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit a pull consumer's offset; journaled, so a crash does not roll it back."""
        if offset < 0:
            raise BadRequestError("offset must not be negative")
        r = self.journal.append("off", {"g": group, "t": topic, "q": queue_id, "o": offset})
        self.store.offsets.commit(group, topic, queue_id, offset)
        await self.store.wait_durable(r)

    async def commit_offsets(self, group: str, offsets: list[tuple[str, int, int]]) -> None:
        """Commit many queues' offsets of one group, (topic, queue id, offset) each, in one journal
        record per 500: a door committing the floors of thousands of lanes per flush (the MQTT
        door's LMQ lanes) paid one call and one record per lane."""
        if any(o < 0 for _, _, o in offsets):
            raise BadRequestError("offset must not be negative")
        if not offsets:
            return
        for i in range(0, len(offsets), 500):  # records of a few dozen KiB (a test store's segments are small)
            r = self.journal.append("offs", {"g": group, "o": [[t, q, o] for t, q, o in offsets[i:i + 500]]})
        commit = self.store.offsets.commit
        for t, q, o in offsets:
            commit(group, t, q, o)
        await self.store.wait_durable(r)

    async def pull_lanes(self, reads: list[tuple[str, int, int, int]]) -> list[GetResult | None]:
        """Several queues read at once, (topic, queue id, offset, max count) each, without a long
        poll: one answer per read, None where the topic does not exist (the others are still read).
        Why: a door reading the LMQ lanes of many sessions that were just woken (MQTT notes) paid
        one call per lane."""
        out: list[GetResult | None] = []
        for topic, queue_id, offset, max_count in reads:
            try:
                out.append(await self.pull(topic, queue_id, offset, max_count))
            except TopicNotFoundError:
                out.append(None)
        return out

    async def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """Move a consumer group (pop or pull) on one queue to ``offset`` (clamped to the queue's
        bounds); in-flight messages are dropped, so what follows is delivered again. Journaled."""
        offset = min(max(offset, self.store.min_offset(topic, queue_id)), self.store.max_offset(topic, queue_id))
        r = self.journal.append("rst", {"g": group, "t": topic, "q": queue_id, "o": offset})
        self.pops.reset(group, topic, queue_id, offset)
        await self.store.wait_durable(r)
        return offset

    def get_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.store.offsets.get(group, topic, queue_id)

    def _min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest offset a pull can read: in the tier when it is on, else on local disk."""
        if self.tier is not None:
            return self.tier.min_offset(topic, queue_id)
        return self.store.min_offset(topic, queue_id)

    def query_offset(self, topic: str, queue_id: int, policy: str = "end", timestamp_ms: int = 0) -> int:
        """'begin' (earliest retained), 'end' (next to be written) or 'timestamp'."""
        if policy == "begin":
            return self._min_offset(topic, queue_id)
        if policy == "end":
            return self.store.max_offset(topic, queue_id)
        if policy == "timestamp":
            return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)
        raise BadRequestError(f"unknown offset policy {policy!r}")

    async def query_offset_async(self, topic: str, queue_id: int, policy: str = "end", timestamp_ms: int = 0) -> int:
        """:meth:`query_offset`, with 'timestamp' searching the tier too when it is on (what the
        doors call: a read "from a time" may start in data only the object store holds)."""
        if policy == "timestamp" and self.tier is not None:
            return await self.tier.offset_for_timestamp_async(topic, queue_id, timestamp_ms)
        return self.query_offset(topic, queue_id, policy, timestamp_ms)

    # ------------------------------------------------------------------ observability

    def consumer_lag(self) -> list[tuple[str, str, int]]:
        """(group, topic, backlog) of every consumer group (see ``consumer_stats``)."""
        return consumer_stats.consumer_lag(self.pops, self.store)

    def group_queues(self) -> list[tuple[str, str, int, str, int, int, int]]:
        """Every consumer group's queues with offsets and in-flight counts (see ``consumer_stats``)."""
        return consumer_stats.group_queues(self.pops, self.store, self.name)

    def store_stats(self) -> dict:
        """Bytes held by the commitlog, the flush thread's fdatasync timings, the tier's backlog."""
        cl = self.store.commitlog
        flush = getattr(self.store, "_flush", None)
        stats = {
            "commitlog_bytes": max(cl.write_pos - cl.min_offset, 0),
            "flush_buckets": tuple(getattr(flush, "SYNC_BUCKETS_S", ())),
            "flush_counts": list(getattr(flush, "sync_counts", ())),
            "flush_seconds_sum": float(getattr(flush, "sync_seconds", 0.0)),
        }
        try:  # disk headroom of the store's file system
            du = shutil.disk_usage(self.store.config.data_dir)
            stats.update(disk_total_bytes=du.total, disk_free_bytes=du.free)
        except OSError:
            pass
        if self.tier is not None:  # the upload backlog: what a slow or absent object store leaves waiting
            segments, nbytes = self.tier.backlog()
            stats.update(tier_backlog_segments=segments, tier_backlog_bytes=nbytes,
                         tier_uploaded_segments=len(self.tier.uploader.in_tier),
                         tier_upload_failures=self.tier.uploader.failed_attempts)
        return stats


def refuse_batch_sql(tc: TopicConfig, expr: FilterExpression) -> None:
    """SQL92 filters read a message's properties, which the broker never sees inside a batch
    record (it does not unpack): refused on batch topics. Tag filters work (a batch has one tag)."""
    if expr.type == FilterType.SQL92 and tc.attributes.get("batch") == "true":
        raise IllegalFilterExpressionError(
            f"topic {tc.name!r} is a batch topic: SQL92 filters are refused (the broker does not open batches); "
            "filter by tag, a batch's messages share one")
