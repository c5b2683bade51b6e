"""Delivery from a session's LMQs: in-flight windows, the in-memory window, read-back, acknowledged floors.

How (README, "MQTT door"): a connected session reads each of its QoS 1/2
subscriptions' LMQs in order, through ``gateway.lmq_reader`` lanes (one per
broker storing its messages). A message just stored is sent at once when the
session is caught up and its window (v5 Receive Maximum, ``max_inflight``) has
room, else kept in memory under the door's byte budget, else left to a read-back
by offset. Why pull and not pop for these: an LMQ has exactly one reader, and
MQTT wants in-order delivery and, after a reconnect, the unacknowledged messages
again, first, in order -- exactly what "resume from the acknowledged floor"
gives. Progress is the floor, committed as consumer group ``mqtt``'s offset at
most every 0.2 s while some session has moved.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Coroutine

from core_broker.errors import TopicNotFoundError, UnimqError
from gateway.api import MessagingAPI
from gateway.context import RequestContext
from gateway.lmq_reader import LanePulls, LaneRuns, MemoryBudget, committed_floor

from . import codec as C
from .codec import encode_publish
from .config import MQTTConfig
from .mapping import Outgoing, now_ms, outgoing_from_stored
from .session import NONE, Cursor, Inflight, Session, Subscription
from .sys_topics import Counters
from .tracing import acked as trace_acked, delivered as trace_delivered, mark_read as trace_mark_read

from .shared import SharedDelivery

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("unimq.mqtt")

__all__ = ["Delivery", "OFFSET_GROUP", "MEM_ENTRY_OVERHEAD"]

OFFSET_GROUP = "mqtt"
# Per message kept in a session's in-memory window: the payload plus this much bookkeeping
# (the Outgoing, its topic bytes, the tuple and the deque slot), counted against
# MQTTConfig.mem_queue_bytes.
MEM_ENTRY_OVERHEAD = 256


class Delivery:
    """Every session's lanes: offering just-stored messages, pumping, acknowledging, committing."""

    def __init__(self, processor: MessagingAPI, ctx: RequestContext, config: MQTTConfig, counters: Counters,
                 spawn: Callable[[Coroutine[Any, Any, Any]], Any], save_session: Callable[[Session], Coroutine[Any, Any, None]],
                 sub_ids: Callable[[Session, str, Subscription], list[int] | None], shared: SharedDelivery) -> None:
        self.processor = processor
        self.ctx = ctx
        self.config = config
        self.counters = counters
        self.spawn = spawn
        self.save_session = save_session
        self.sub_ids = sub_ids
        self.shared = shared  # shared groups' in-flight messages are acknowledged there
        # a persistent session's record is written again when it gains a lane, for a restart to
        # read that lane back; with a fleet (fleet.py) a session's next owner reads every broker's
        # lane instead (adopt_owned), so the write, its replication and every other gateway's
        # copy refresh would be paid per first message for nothing (issue 21)
        self.save_lanes = True
        self.pulls = LanePulls(processor, ctx)  # lanes read back in the same turn: one call per broker
        self.mem = MemoryBudget(config.mem_queue_bytes)  # every cursor's in-memory window (_mem_push)
        self._dirty_sessions: set[Session] = set()
        self._dirty_wake = asyncio.Event()  # set when _dirty_sessions stops being empty
        self._gone_lanes: dict[str, list[str]] = {}  # LMQ being deleted -> brokers that held a lane
        # every broker any lane was made on: a session's lanes of one LMQ are found by looking
        # these up, not by scanning all its lanes (a client may hold thousands of subscriptions)
        self._lane_brokers: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        # Deliveries not read back from the store, per unified topic, since the last count_out
        self.out_counts: dict[str, int] = {}
        self.out_bytes: dict[str, int] = {}  # their payload bytes, likewise
        self.metrics = processor.metrics
        self.tracer = processor.tracer  # message traces (adapters/mqtt/tracing.py)

    def count_out(self) -> None:
        """Add the deliveries counted since the last call to the processor's ``messages_out``
        (by door and topic, as the processor counts pops and pulls): once per batch of
        publishes, pump round or subscription, not per message."""
        counts = self.out_counts
        if counts:
            count = self.metrics.count_out
            nbytes = self.out_bytes
            for ut, n in counts.items():
                count("mqtt", ut, n, nbytes.get(ut, 0))
            counts.clear()
            nbytes.clear()

    def start(self) -> None:
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="mqtt-offsets")

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass

    def dirty(self, s: Session, lanes: Any = None) -> None:
        """``s``'s lanes (all of them without ``lanes``) have a floor to commit."""
        if s.dirty is NONE:
            s.dirty = set()
        s.dirty.update(s.cursors if lanes is None else lanes)  # type: ignore[union-attr]
        if not self._dirty_sessions:
            self._dirty_wake.set()
        self._dirty_sessions.add(s)

    def drop_lanes(self, s: Session, lmq: str) -> None:
        """``s`` no longer reads ``lmq`` (its subscription is gone): forget its lanes, and
        remember their brokers for :meth:`delete_lmq`."""
        lanes = [k for k in ((lmq, b) for b in self._lane_brokers) if k in s.cursors]
        for key in lanes:
            self.drop_lane(s, key)
        self._gone_lanes[lmq] = [b for _, b in lanes]
        if len(self._gone_lanes) > 10_000:  # names whose deletion never ran
            self._gone_lanes.clear()

    async def restore_lanes(self, s: Session, sub: Subscription, saved: list[str]) -> None:
        """After a restart: ``sub``'s lanes, each read on from its committed floor -- the ones
        saved with the session and the LMQ's route broker (where the single cursor of the
        format before lanes was committed)."""
        lmq = sub.lmq
        assert lmq is not None
        brokers = set(saved)
        try:
            brokers.update((await self.processor.query_route(self.ctx, lmq)).brokers)
        except UnimqError:
            pass
        for b in sorted(brokers):
            key = (lmq, b)
            try:
                start = await committed_floor(self.processor, self.ctx, OFFSET_GROUP, lmq, b)
                hosted = True  # committed_floor hosted the LMQ there
            except UnimqError:
                start, hosted = 0, False
            cur = s.new_cursor(key, Cursor(b, start, must_pull=True))
            cur.hosted = hosted
            self._lane_brokers.add(b)
            s.pending[key] = 1

    def resume(self, s: Session) -> None:
        """A session is connected again: every lane may have something in the store."""
        for lmq, cur in s.cursors.items():
            cur.must_pull = True
            s.pending[lmq] = s.pending.get(lmq, 0) + 1
        self.wake(s)

    def offline(self, s: Session) -> None:
        """A session lost its connection: commit its floors; what it missed is read from the store later."""
        self.dirty(s)
        for cur in s.cursors.values():
            self._mem_clear(cur)

    async def _flush_loop(self) -> None:
        # Asleep while no session has anything to commit; then one commit per 0.2 s at most,
        # taking in everything that became dirty meanwhile.
        while True:
            await self._dirty_wake.wait()
            self._dirty_wake.clear()
            await asyncio.sleep(0.2)
            try:
                await self.commit_offsets()
            except Exception:  # pragma: no cover - keep committing
                log.exception("mqtt: committing offsets failed")

    async def commit_offsets(self) -> None:
        """Commit every dirty lane's floor that moved: one call per broker for all of them
        (``commit_lanes``), not one per lane (issue 21: a fleet's first messages each made a
        lane, and each lane's commit was a call and a journal record). A broker's call that
        failed leaves its lanes dirty for the next flush, and the first failure is raised."""
        sessions, self._dirty_sessions = self._dirty_sessions, set()
        per: dict[str, list[tuple[Session, str, Cursor, int]]] = {}  # broker -> lanes to commit
        for s in sessions:
            dirty, s.dirty = s.dirty, NONE
            for key in dirty:
                cur = s.cursors.get(key)
                if cur is not None and cur.floor != cur.committed:
                    per.setdefault(cur.broker, []).append((s, key[0], cur, cur.floor))
        failed: BaseException | None = None
        for broker, lanes in per.items():
            try:
                await self.processor.commit_lanes(self.ctx, OFFSET_GROUP, broker, [(lmq, f) for _, lmq, _, f in lanes])
            except BaseException as e:
                for s, lmq, _, _ in lanes:
                    self.dirty(s, [(lmq, broker)])
                if failed is None:
                    failed = e
                if not isinstance(e, Exception):
                    break  # cancelled: the rest stays dirty too
                continue
            for _, _, cur, f in lanes:
                cur.committed = f
        if failed is not None:
            raise failed

    def drop_lane(self, s: Session, key: tuple[str, str]) -> None:
        cur = s.cursors.pop(key, None)
        if cur is not None:
            self._mem_clear(cur)
        s.runs.pop(key[0], None)
        s.pending.pop(key, None)
        if key in s.dirty:
            s.dirty.discard(key)  # type: ignore[union-attr]

    async def delete_lmq(self, lmq: str) -> None:
        try:
            # every broker holding a lane must know the topic, so that deleting it reaches
            # that broker's part too (the name is used again by a later session of the client)
            for b in self._gone_lanes.pop(lmq, ()):
                await self.processor.host_lmq(self.ctx, lmq, b)
            await self.processor.delete_topic(self.ctx, lmq)
        except TopicNotFoundError:
            pass
        except UnimqError as e:  # pragma: no cover
            log.warning("mqtt: could not delete %s: %s", lmq, e)

    def wake(self, s: Session) -> None:
        conn = s.conn
        if s.pumping or conn is None or not s.pending:
            return
        # hysteresis: wait until an eighth of the window is free, so that the store is
        # read (and the task scheduled) once per batch, not once per acknowledgement
        if conn.window - s.outstanding() < (conn.window >> 3 or 1) and s.outstanding():
            return
        s.pumping = True
        self.spawn(self.pump(s))

    def lane(self, s: Session, sub: Subscription, broker: str) -> Cursor | None:
        """``sub``'s lane on ``broker``, made on the first message that broker stored for it.

        A new lane starts at offset 0: the LMQ's part on that broker began with this
        subscription (its LMQ name is new), and earlier entries sent by concurrent
        publishes the door has not seen yet must not be skipped. None: ``sub`` is gone.
        """
        key = (sub.lmq, broker)
        cur = s.cursors.get(key)  # type: ignore[arg-type]
        if cur is None and sub.lmq and not sub.group and s.subs.get(sub.filter) is sub:
            lmq = sub.lmq
            get = s.cursors.get
            others = [c for c in (get((lmq, b)) for b in self._lane_brokers) if c is not None]
            if others and lmq not in s.runs:
                # a second lane: from now on the order across lanes is recorded (see Session.runs);
                # what the first lane holds unread came before
                runs = s.runs[lmq] = LaneRuns()
                for c in others:
                    if c.end > c.read:
                        runs.note(c.broker, c.end - c.read)
            cur = s.new_cursor(key, Cursor(broker))  # type: ignore[arg-type]
            # made for an entry ``broker`` stored: that broker names the LMQ already, no
            # hosting call before the first pull (lmq_reader.pull_lane)
            cur.hosted = True
            self._lane_brokers.add(broker)
            if s.persistent and self.save_lanes:  # the lane list is part of the saved session
                self.spawn(self.save_session(s))
        return cur

    def must_pull(self, s: Session, sub: Subscription, broker: str) -> None:
        cur = self.lane(s, sub, broker)
        if cur is not None:
            cur.must_pull = True
            key = (sub.lmq, broker)
            s.pending[key] = s.pending.get(key, 0) + 1  # type: ignore[index, arg-type]

    def offer(self, s: Session, sub: Subscription, out: Outgoing, offset: int, broker: str) -> None:
        """A message was just stored at ``offset`` of ``sub``'s lane on ``broker``: send it, queue it,
        or leave it to a pull."""
        key = (sub.lmq, broker)
        cur = s.cursors.get(key)  # type: ignore[arg-type]
        if cur is None:
            cur = self.lane(s, sub, broker)
            if cur is None:
                return
        if offset >= cur.end:
            cur.end = offset + 1
        conn = s.conn
        mem = cur.window
        runs = s.runs.get(key[0]) if s.runs else None  # type: ignore[arg-type]
        if (conn is not None and not mem and cur.read == offset and not cur.must_pull and not s.pumping
                and conn.writable and s.outstanding() < conn.window and not conn.closed and not runs):
            self._deliver_lmq(s, conn, sub, cur, key, offset, out)  # type: ignore[arg-type]
            cur.read = offset + 1
            return
        if runs is not None:  # this LMQ has several lanes: remember the order across them
            runs.note(broker)
        if conn is None:
            return  # offline: it waits in the store
        if offset > mem[-1][0] if mem else offset >= cur.read:
            # a gap before it (messages past the budget) is read back from the store
            self._mem_push(cur, offset, out)
        s.pending[key] = s.pending.get(key, 0) + 1  # type: ignore[index, arg-type]
        self.wake(s)

    def _mem_push(self, cur: Cursor, offset: int, out: Outgoing) -> None:
        """Keep a just-stored message for a session that is behind, within the byte budget
        (past it, it stays in the store only; the pump reads it from there)."""
        cur.hold(self.mem, offset, out, len(out.payload) + MEM_ENTRY_OVERHEAD)

    def _mem_popleft(self, cur: Cursor) -> tuple[int, Outgoing]:
        item = cur.window.popleft()
        cur.release(self.mem, len(item[1].payload) + MEM_ENTRY_OVERHEAD)
        return item

    def _mem_clear(self, cur: Cursor) -> None:
        cur.clear_window(self.mem)

    def _deliver_lmq(self, s: Session, conn: Connection, sub: Subscription | None, cur: Cursor,
                     lmq: tuple[str, str], off: int, out: Outgoing) -> None:
        d = s.dirty
        if d is NONE:
            d = s.dirty = set()
        d.add(lmq)  # type: ignore[union-attr]
        if not self._dirty_sessions:
            self._dirty_wake.set()
        self._dirty_sessions.add(s)
        if out.expiry_at and out.expired(now_ms()):
            cur.settle(off)
            if self.tracer.on:
                trace_delivered(self.tracer, s, sub.filter if sub else "", out, 0, "expired")
            return
        q = out.qos if sub is None or sub.qos >= out.qos else sub.qos
        if self.tracer.on:
            trace_delivered(self.tracer, s, sub.filter if sub else "", out, q)
        retain = bool(sub is not None and sub.rap and out.retain)
        sids = self.sub_ids(s, out.topic, sub) if sub is not None and s.has_sub_ids else None
        if q == 0:
            conn.deliver(out, 0, retain, sids)
            cur.settle(off)
            return
        ut = out.ut
        if ut:  # a message from memory (one read back from the store was counted by the processor)
            counts = self.out_counts
            counts[ut] = counts.get(ut, 0) + 1
            nbytes = self.out_bytes
            nbytes[ut] = nbytes.get(ut, 0) + len(out.payload)
        pid = s.alloc_pid()
        s.inflight[pid] = Inflight(out, q, lmq, off, None, sids)
        if conn.version != C.MQTT_5:  # no properties, no packet size limit: the short way
            self.counters.pub_out += 1
            conn.send(encode_publish(out.tb, out.payload, q, retain, False, pid, None))
        else:
            conn.send_publish(out, q, retain, False, pid, sids)

    def direct(self, fast: list[tuple[Outgoing, tuple[Subscription, ...]]]) -> None:
        """QoS 0 deliveries of a publish batch straight from memory, in order per subscriber.

        A connection's plain ones (no retain flag, no subscription ids) go out together through
        :meth:`Connection.deliver_q0` (one write, each message encoded once); any other one first
        sends what is gathered for that connection, then goes through :meth:`Connection.deliver`.
        """
        runs: dict[Connection, list[Outgoing]] = {}
        tracer = self.tracer
        for out, direct in fast:
            for sub in direct:
                s = sub.session
                conn = s.conn
                if conn is None:
                    continue
                if out.retain or s.has_sub_ids:
                    run = runs.pop(conn, None)
                    if run:
                        conn.deliver_q0(run)
                    conn.deliver(out, 0, sub.rap and out.retain, self.sub_ids(s, out.topic, sub))
                else:
                    run = runs.get(conn)
                    if run is None:
                        runs[conn] = [out]
                    else:
                        run.append(out)
                if tracer.on:
                    trace_delivered(tracer, s, sub.filter, out, 0)
        for conn, run in runs.items():
            conn.deliver_q0(run)

    async def pump(self, s: Session) -> None:
        """Feed a connected session from its LMQs: in-memory queue first, then the store."""
        try:
            while True:
                conn = s.conn
                if conn is None or conn.closed or not s.pending:
                    return
                room = conn.window - s.outstanding()
                if room <= 0 or not conn.writable:
                    return  # an ack or resume_writing wakes us again
                progressed = False
                asked = False  # a lane was asked to read again while its pull was on the way
                by_lmq = None if len(s.subs) < 8 else {x.lmq: x for x in s.subs.values()}  # (no scan per lane)
                for lmq in list(s.pending):  # lanes (lmq, broker)
                    cur = s.cursors.get(lmq)
                    if cur is None:
                        s.pending.pop(lmq, None)
                        continue
                    sub = self._sub_of_lmq(s, lmq[0]) if by_lmq is None else by_lmq.get(lmq[0])
                    mem = cur.window
                    runs = s.runs.get(lmq[0]) if s.runs else None
                    limit = room
                    if runs:
                        head = self._run_head(s, lmq[0], runs)
                        if head is not None:
                            if head[0] != cur.broker:
                                continue  # another lane's messages were stored first
                            limit = min(room, head[1])
                    start = cur.read
                    if mem and room > 0:
                        took = 0
                        freed = 0
                        while mem and took < limit:
                            off, out = mem[0]
                            if off != cur.read:
                                if off > cur.read:
                                    break  # a gap: the store holds what comes before
                                mem.popleft()  # already delivered from the store
                                freed += len(out.payload) + MEM_ENTRY_OVERHEAD
                                continue
                            mem.popleft()
                            freed += len(out.payload) + MEM_ENTRY_OVERHEAD
                            self._deliver_lmq(s, conn, sub, cur, lmq, off, out)
                            cur.read = off + 1
                            took += 1
                        cur.release(self.mem, freed)
                        room -= took
                        if took or freed:
                            progressed = True
                    if runs:
                        runs.taken(cur.broker, cur.read - start)
                        limit -= cur.read - start
                    if room <= 0:
                        break
                    if (cur.must_pull or cur.read < cur.end) and limit > 0:
                        want = min(room, limit, 512)
                        if mem and mem[0][0] > cur.read:
                            want = min(want, mem[0][0] - cur.read)  # up to the in-memory part
                        start = cur.read
                        # cleared before the pull, not after: a wake-up arriving while the pull is
                        # on the way (a note from another gateway: fleet.py) sets it again and is
                        # not lost, though the store answered before that message was stored
                        cur.must_pull = False
                        try:
                            r = await self.pulls.pull(lmq[0], cur, cur.read, want, s.ctx)
                        except TopicNotFoundError:
                            cur.must_pull = False
                            cur.end = cur.read
                            s.pending.pop(lmq, None)
                            continue
                        except BaseException:
                            cur.must_pull = True  # still to read at the next wake
                            raise
                        if s.conn is not conn or conn.closed or s.cursors.get(lmq) is not cur:
                            return
                        if by_lmq is not None:  # subscriptions may have changed meanwhile
                            by_lmq = {x.lmq: x for x in s.subs.values()}
                            sub = by_lmq.get(lmq[0])
                        msgs = r.messages
                        if not msgs and r.next_offset > cur.read:
                            cur.skip_to(r.next_offset)  # retention removed what was never read
                            progressed = True
                        for m in msgs:
                            off = m.queue_offset
                            if off < cur.read:
                                continue
                            cur.skip_to(off)
                            out = outgoing_from_stored(m.properties, m.body, m.topic)
                            self._deliver_lmq(s, conn, sub, cur, lmq, off,
                                              trace_mark_read(out, m) if self.tracer.on else out)
                            cur.read = off + 1
                        while mem and mem[0][0] < cur.read:
                            self._mem_popleft(cur)
                        if msgs:
                            progressed = True
                            room -= len(msgs)
                        if len(msgs) < want:
                            if cur.must_pull:
                                asked = True
                            if cur.end < cur.read:
                                cur.end = cur.read
                        else:
                            cur.must_pull = True  # a full answer: there may be more
                        if runs:
                            runs.taken(cur.broker, cur.read - start)
                    if cur.caught_up():
                        s.pending.pop(lmq, None)
                    if room <= 0:
                        break
                if not progressed and not asked:
                    return
        finally:
            s.pumping = False
            self.count_out()

    @staticmethod
    def _run_head(s: Session, lmq: str, runs: LaneRuns[str]) -> list[Any] | None:
        """The oldest run whose lane still has something to read."""

        def live(broker: str) -> bool:
            key = (lmq, broker)
            c = s.cursors.get(key)
            return c is not None and key in s.pending and not c.caught_up()

        return runs.head(live)

    @staticmethod
    def _sub_of_lmq(s: Session, lmq: str) -> Subscription | None:
        for sub in s.subs.values():
            if sub.lmq == lmq:
                return sub
        return None

    def acked(self, s: Session, f: Inflight) -> None:
        """A QoS 1 PUBACK or QoS 2 PUBREC arrived for ``f``."""
        if self.tracer.on:  # (a shared group's too: its delivery was marked by shared.py)
            trace_acked(self.tracer, s, f)
        if f.receipt is not None:
            self.spawn(self.shared.ack(s, f))
        elif f.lmq is not None:
            cur = s.cursors.get(f.lmq)
            if cur is not None:
                cur.settle(f.offset)
                d = s.dirty
                if d is NONE:
                    d = s.dirty = set()
                d.add(f.lmq)  # type: ignore[union-attr]
                if not self._dirty_sessions:
                    self._dirty_wake.set()
                self._dirty_sessions.add(s)
