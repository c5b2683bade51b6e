"""PopService: message-level load balancing (RocketMQ 5 "pop" consumption).

Per (consumer group, topic, queue) a cursor remembers the next offset never
delivered, the messages in flight (hidden until their invisible time, each
with its delivery attempt and a receipt version), and, for FIFO topics, the
messages waiting because an earlier message of their message group is still
in flight. Every change is journaled (see ``journal.py``) and the whole table
is snapshotted, so an un-acked message comes back after a restart and an
acked one does not.

Normal topics: an expired in-flight message is moved (a link, body not copied)
to the group's retry topic after the back-off for its attempt, and after
``max_delivery_attempts`` to the group's dead-letter topic. FIFO topics: an
expired message is redelivered in place, so a message group never overtakes
itself; the next message of a group is not delivered before the previous one
is acked or dead-lettered, while other groups go on in parallel.

Message traces: a traced message's revival is recorded here (``retried``, invisible time
expired; ``dead_lettered``, attempts exhausted) into the broker's trace buffer
(``trace_log.py``), after one cheap check of its topic.
"""

from __future__ import annotations

import heapq
import time
from typing import Callable, NamedTuple

from .config import BrokerConfig
from .journal import Journal
from .message_store import MessageFilter, MessageStore
from .model import GetResult, GetStatus, PutResult, StoredMessage
from .record import P_BATCH_INDEX
from .receipt import InvalidReceiptHandleError, ReceiptHandle, handle_prefix
from .system_topics import P_ORIGIN_TOPIC, dlq_topic, is_system_topic, retry_topic
from .timer_service import TimerService
from .trace_log import BrokerTrace

# Per queue: (the offset a read started from, what it read): see PopService.pop
ReadAhead = dict[tuple[str, int], tuple[int, GetResult]]

_tuple_new = tuple.__new__

WAITING_LIMIT = 2048  # FIFO: messages parked behind busy groups before the queue stops advancing


def _nothing() -> None:
    pass


def now_ms() -> int:
    return int(time.time() * 1000)


class Inflight:
    __slots__ = ("visible_at", "attempt", "version", "mgroup", "released")

    def __init__(self, visible_at: int, attempt: int, version: int, mgroup: str | None) -> None:
        self.visible_at = visible_at
        self.attempt = attempt
        self.version = version
        self.mgroup = mgroup
        self.released = False  # made visible at once on purpose (a nack): no retry back-off


class Cursor:
    __slots__ = ("next", "inflight", "waiting", "fifo")

    def __init__(self, next_offset: int, fifo: bool) -> None:
        self.next = next_offset
        self.inflight: dict[int, Inflight] = {}
        self.waiting: dict[int, str] = {}  # FIFO only: offset -> message group
        self.fifo = fifo

    def floor(self) -> int:
        """Lowest offset not yet done: what the group's committed offset can safely be."""
        f = self.next
        if self.inflight:
            f = min(f, min(self.inflight))
        if self.waiting:
            f = min(f, min(self.waiting))
        return f


class PoppedMessage(NamedTuple):
    message: StoredMessage
    receipt_handle: str
    delivery_attempt: int
    invisible_until_ms: int


Key = tuple[str, str, int]  # (group, topic, queue id)


class PopService:
    def __init__(
        self,
        store: MessageStore,
        journal: Journal,
        timers: TimerService,
        config: BrokerConfig,
        notify: Callable[[str], None],
        ensure_topic: Callable[[str], None],
    ) -> None:
        self.store = store
        self.journal = journal
        self.timers = timers
        self.config = config
        self.notify = notify
        self.ensure_topic = ensure_topic
        self.cursors: dict[Key, Cursor] = {}
        self.trace = BrokerTrace(store, config.broker_name, ensure_topic)  # revivals of traced messages (trace_log.py)
        self._heap: list[tuple[int, str, str, int, int, int]] = []  # visible_at, g, t, q, offset, version
        self.broker = config.broker_name
        # Called when an invisible time is pushed that ends before every other one: the
        # revive loop sleeps until the earliest (BrokerController sets it to its wake()).
        self.wake_reviver: Callable[[], None] = _nothing
        # With tiered storage (``tier.cold_pops``): a queue's oldest readable offset may be in
        # the tier, and an in-flight message popped from there has no local queue entry, so
        # reviving it needs its record's offset looked up in the tier first: revive_due lists
        # such messages in ``cold_wanted`` (None: no tier) and leaves them due; the broker
        # resolves them into ``cold_phys`` (-1: not in the tier either) and revives again.
        self.min_offset: Callable[[str, int], int] = store.min_offset
        self.cold_wanted: list[tuple[str, int, int]] | None = None
        self.cold_phys: dict[tuple[str, int, int], int] = {}
        # ... and, for one message of a batch record there, its index in the batch (the link
        # that retries or dead-letters it names it, as ``batch_index_at`` does for local ones)
        self.cold_batch_index: dict[tuple[str, int, int], int] = {}
        # FIFO: messages redelivered in place (or parked) whose queue entry only the tier holds,
        # read before the pop by ``tier.cold_pops``; taken by ``_read_at`` when delivered.
        self.cold_messages: dict[tuple[str, int, int], StoredMessage] = {}

    # -- cursors -------------------------------------------------------------------

    def cursor(self, group: str, topic: str, queue_id: int, fifo: bool, from_latest: bool = False) -> Cursor:
        key = (group, topic, queue_id)
        c = self.cursors.get(key)
        if c is None:
            committed = self.store.offsets.get(group, topic, queue_id)
            if committed is not None:
                start = committed
            elif from_latest:
                start = self.store.max_offset(topic, queue_id)
            else:
                start = self.min_offset(topic, queue_id)
            c = self.cursors[key] = Cursor(start, fifo)
        return c

    # -- pop -----------------------------------------------------------------------

    def pop(
        self,
        group: str,
        queues: list[tuple[str, int]],
        max_count: int,
        invisible_ms: int,
        msg_filter: MessageFilter | None,
        fifo: bool,
        from_latest: bool = False,
        read_ahead: ReadAhead | None = None,
        scan_limits: dict[tuple[str, int], int] | None = None,
    ) -> tuple[list[PoppedMessage], PutResult | None]:
        """Take up to ``max_count`` messages from ``queues`` (rotating start); no waiting.

        ``read_ahead``: results read before the call (off the event loop: the tier's) to use
        instead of a local get, per queue, if its cursor is still at the offset they start from.
        ``scan_limits``: per FIFO queue, an offset new messages are not read (nor parked) from
        (a static topic's older part of a logic queue ends there, see gateway/static_topics.py).
        """
        out: list[PoppedMessage] = []
        last: PutResult | None = None
        now = now_ms()
        visible_at = now + invisible_ms
        for topic, qid in queues:
            need = max_count - len(out)
            if need <= 0:
                break
            c = self.cursor(group, topic, qid, fifo, from_latest)
            ahead = read_ahead.pop((topic, qid), None) if read_ahead else None
            if c.fifo:
                limit = scan_limits.get((topic, qid)) if scan_limits else None
                got, r = self._pop_fifo(group, topic, qid, c, need, visible_at, now, msg_filter, ahead, limit)
            else:
                got, r = self._pop_normal(group, topic, qid, c, need, visible_at, msg_filter, ahead)
            out.extend(got)
            last = r or last
        return out, last

    def _deliver(
        self, group: str, topic: str, qid: int, m: StoredMessage, inf: Inflight
    ) -> PoppedMessage:
        rh = f"{handle_prefix(self.broker, topic)}{qid}.{m.queue_offset}.{inf.version}.{inf.visible_at}"
        self._push(inf.visible_at, group, topic, qid, m.queue_offset, inf.version)
        if topic.startswith("%RETRY%"):
            origin = m.properties.get(P_ORIGIN_TOPIC)
            if origin:
                m.topic = origin  # a retried message is delivered as a message of its own topic
        m.reconsume_times = inf.attempt - 1
        return PoppedMessage(m, rh, inf.attempt, inf.visible_at)

    def _get(self, topic: str, qid: int, offset: int, need: int, msg_filter: MessageFilter | None,
             ahead: tuple[int, GetResult] | None) -> GetResult:
        if ahead is not None and ahead[0] == offset:
            r = ahead[1]
            if len(r.messages) > need:
                r = GetResult(r.status, r.messages[:need], r.messages[need - 1].queue_offset + 1, r.min_offset,
                              r.max_offset)
            return r
        return self.store.get(topic, qid, offset, need, msg_filter)

    def _pop_normal(self, group, topic, qid, c: Cursor, need, visible_at, msg_filter, ahead=None):
        start = c.next
        r = self._get(topic, qid, c.next, need, msg_filter, ahead)
        if r.status == GetStatus.OFFSET_MOVED:
            c.next = r.next_offset
            r = self.store.get(topic, qid, c.next, need, msg_filter)
        elif r.status == GetStatus.OFFSET_OVERFLOW_BADLY:
            c.next = r.next_offset
        out = []
        entries = []
        if not topic.startswith("%RETRY%"):
            # the common case, _deliver inlined: the handle prefix looked up once per call
            prefix = f"{handle_prefix(self.broker, topic)}{qid}."
            inflight = c.inflight
            heap = self._heap
            if r.messages and (not heap or visible_at < heap[0][0]):
                self.wake_reviver()
            push = heapq.heappush
            new = _tuple_new
            for m in r.messages:
                off = m.queue_offset
                attempt = m.reconsume_times + 1
                inflight[off] = Inflight(visible_at, attempt, 1, None)
                push(heap, (visible_at, group, topic, qid, off, 1))
                out.append(new(PoppedMessage, (m, f"{prefix}{off}.1.{visible_at}", attempt, visible_at)))
                entries.append([off, attempt, 1, None])
        else:
            for m in r.messages:
                inf = Inflight(visible_at, m.reconsume_times + 1, 1, None)
                c.inflight[m.queue_offset] = inf
                out.append(self._deliver(group, topic, qid, m, inf))
                entries.append([m.queue_offset, inf.attempt, 1, None])
        if r.messages or r.status == GetStatus.NO_MATCHED_MESSAGE:
            c.next = max(c.next, r.next_offset)
        if c.next == start and not entries:
            return out, None
        return out, self.journal.append("pop", {"g": group, "t": topic, "q": qid, "n": c.next, "v": visible_at, "m": entries})

    def _pop_fifo(self, group, topic, qid, c: Cursor, need, visible_at, now, msg_filter, ahead=None, limit=None):
        out: list[PoppedMessage] = []
        entries: list[list] = []
        parked: list[list] = []
        blocked = {inf.mgroup for inf in c.inflight.values() if inf.visible_at > now}
        start = c.next

        def take(m: StoredMessage, inf: Inflight) -> None:
            out.append(self._deliver(group, topic, qid, m, inf))
            entries.append([m.queue_offset, inf.attempt, inf.version, inf.mgroup])
            blocked.add(inf.mgroup)

        # 1. in-flight messages whose invisible time ran out come back first, in place
        for off in sorted(o for o, inf in c.inflight.items() if inf.visible_at <= now):
            if len(out) >= need:
                break
            inf = c.inflight[off]
            if inf.mgroup in blocked or inf.attempt >= self.config.max_delivery_attempts:
                continue  # exhausted ones are dead-lettered by revive()
            m = self._read_at(topic, qid, off)
            if m is None:
                del c.inflight[off]
                continue
            inf.attempt += 1
            inf.version += 1
            inf.visible_at = visible_at
            take(m, inf)
        # 2. messages parked behind a busy group, oldest first
        for off in sorted(c.waiting):
            if len(out) >= need:
                break
            g = c.waiting[off]
            if g in blocked:
                continue
            m = self._read_at(topic, qid, off)
            del c.waiting[off]
            if m is None:
                continue
            inf = c.inflight[off] = Inflight(visible_at, m.reconsume_times + 1, 1, g)
            take(m, inf)
        # 3. new messages
        while len(out) < need and len(c.waiting) < WAITING_LIMIT:
            if limit is not None and c.next >= limit:
                break
            r = self._get(topic, qid, c.next, 32, msg_filter, ahead)
            ahead = None
            if r.status in (GetStatus.OFFSET_MOVED, GetStatus.OFFSET_OVERFLOW_BADLY):
                c.next = r.next_offset
                continue
            if not r.messages:
                if r.status == GetStatus.NO_MATCHED_MESSAGE:
                    c.next = max(c.next, r.next_offset)
                    if r.next_offset < r.max_offset:
                        continue
                break
            stopped = False
            for m in r.messages:
                if limit is not None and m.queue_offset >= limit:
                    stopped = True
                    break
                g = m.message_group or ""
                if g in blocked:
                    c.waiting[m.queue_offset] = g
                    parked.append([m.queue_offset, g])
                else:
                    inf = c.inflight[m.queue_offset] = Inflight(visible_at, m.reconsume_times + 1, 1, g)
                    take(m, inf)
                c.next = m.queue_offset + 1
                if len(out) >= need or len(c.waiting) >= WAITING_LIMIT:
                    stopped = True
                    break
            if not stopped:
                c.next = max(c.next, r.next_offset if limit is None else min(r.next_offset, limit))
        if not entries and not parked and c.next == start:
            return out, None
        return out, self.journal.append(
            "pop", {"g": group, "t": topic, "q": qid, "n": c.next, "v": visible_at, "m": entries, "w": parked}
        )

    def _read_at(self, topic: str, qid: int, off: int) -> StoredMessage | None:
        """A FIFO message delivered again (or after parking): local, or read from the tier."""
        m = self.store.read_at(topic, qid, off)
        if m is None and self.cold_messages:
            m = self.cold_messages.pop((topic, qid, off), None)
        return m

    def fifo_due(self, group: str, topic: str, qid: int, limit: int) -> list[int]:
        """Offsets a FIFO pop of this queue would read again now (expired in-flight messages,
        then parked ones, of message groups not busy), at most ``limit`` of each."""
        c = self.cursors.get((group, topic, qid))
        if c is None or not c.fifo:
            return []
        now = now_ms()
        blocked = {inf.mgroup for inf in c.inflight.values() if inf.visible_at > now}
        due = sorted(o for o, inf in c.inflight.items() if inf.visible_at <= now and inf.mgroup not in blocked)
        parked = sorted(o for o, g in c.waiting.items() if g not in blocked)
        return due[:limit] + parked[:limit]

    # -- ack / change invisible / dead letter ------------------------------------------

    def _inflight(self, group: str, rh: ReceiptHandle) -> tuple[Cursor, Inflight]:
        c = self.cursors.get((group, rh.topic, rh.queue_id))
        inf = c.inflight.get(rh.offset) if c is not None else None
        if inf is None or inf.version != rh.version:
            raise InvalidReceiptHandleError(
                "receipt handle is expired or was already used (the message was acked, redelivered or re-hidden)"
            )
        return c, inf  # type: ignore[return-value]

    def ack(self, group: str, receipt_handle: str) -> PutResult:
        rh = ReceiptHandle.decode(receipt_handle)
        c, _inf = self._inflight(group, rh)
        # (an expired message not yet revived is still accepted: the revive finds it gone)
        del c.inflight[rh.offset]
        return self.journal.append_ack(group, rh.topic, rh.queue_id, rh.offset)

    def change_invisible(self, group: str, receipt_handle: str, invisible_ms: int) -> tuple[str, int, PutResult]:
        rh = ReceiptHandle.decode(receipt_handle)
        _, inf = self._inflight(group, rh)
        inf.version += 1
        inf.visible_at = now_ms() + invisible_ms
        inf.released = invisible_ms == 0
        self._push(inf.visible_at, group, rh.topic, rh.queue_id, rh.offset, inf.version)
        new = f"{handle_prefix(self.broker, rh.topic)}{rh.queue_id}.{rh.offset}.{inf.version}.{inf.visible_at}"
        r = self.journal.append(
            "chg",
            {"g": group, "t": rh.topic, "q": rh.queue_id, "o": rh.offset, "v": inf.visible_at, "r": inf.version,
             "z": int(inf.released)},
        )
        return new, inf.visible_at, r

    def forward_to_dlq(self, group: str, receipt_handle: str) -> PutResult:
        rh = ReceiptHandle.decode(receipt_handle)
        c, inf = self._inflight(group, rh)
        return self._dead_letter(group, rh.topic, rh.queue_id, rh.offset, c, inf)

    def _phys(self, topic: str, qid: int, off: int) -> int | None:
        """The record a queue entry points at, locally or (resolved by the broker) in the tier."""
        phys = self.store.phys_at(topic, qid, off)
        if phys is None and self.cold_phys:
            phys = self.cold_phys.pop((topic, qid, off), None)
            if phys is not None and phys < 0:
                phys = None
        return phys

    def _dead_letter(self, group, topic, qid, off, c: Cursor, inf: Inflight) -> PutResult:
        phys = self._phys(topic, qid, off)
        del c.inflight[off]
        data = {"g": group, "t": topic, "q": qid, "o": off}
        if phys is None:  # gone by retention: nothing left to dead-letter
            return self.journal.append("ack", data)
        dlq = dlq_topic(group)
        self.ensure_topic(dlq)
        props = self._link_props(topic, qid, off)
        r = self.journal.link(phys, dlq, 0, "rev", data, properties=props, reconsume_times=inf.attempt)
        self.notify(dlq)
        return r

    def _link_props(self, topic: str, qid: int, off: int) -> dict[str, str]:
        """Properties of the link that retries or dead-letters the message at ``off``: its
        topic, and its index when it is one message of a batch record."""
        props = {} if topic.startswith("%RETRY%") else {P_ORIGIN_TOPIC: topic}
        i = self.store.batch_index_at(topic, qid, off)
        cold_i = self.cold_batch_index.pop((topic, qid, off), None)
        if i is None:
            i = cold_i
        if i is not None:
            props[P_BATCH_INDEX] = str(i)
        return props

    # -- revive ----------------------------------------------------------------------

    def _push(self, visible_at: int, group: str, topic: str, qid: int, offset: int, version: int) -> None:
        heap = self._heap
        if not heap or visible_at < heap[0][0]:
            self.wake_reviver()
        heapq.heappush(heap, (visible_at, group, topic, qid, offset, version))

    def next_due_ms(self) -> int | None:
        """When the earliest invisible time ends (wall-clock ms); None: nothing in flight."""
        return self._heap[0][0] if self._heap else None

    def revive_due(self) -> PutResult | None:
        """Handle in-flight messages whose invisible time passed."""
        now = now_ms()
        heap = self._heap
        last = None
        cfg = self.config
        wanted, later = self.cold_wanted, []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            vis, group, topic, qid, off, version = entry
            c = self.cursors.get((group, topic, qid))
            inf = c.inflight.get(off) if c is not None else None
            if inf is None or inf.version != version or inf.visible_at != vis:
                continue  # acked, re-hidden or redelivered since
            if wanted is not None and (topic, qid, off) not in self.cold_phys and (
                    self.store.phys_at(topic, qid, off) is None):
                wanted.append((topic, qid, off))  # popped from the tier: the broker looks it up
                later.append(entry)
                continue
            traced = self.trace.traced(topic)
            if inf.attempt >= cfg.max_delivery_attempts:
                if traced:
                    self.trace.record(topic, qid, off, "dead_lettered", group=group, dlq=dlq_topic(group),
                                      attempts=inf.attempt, reason="max delivery attempts")
                last = self._dead_letter(group, topic, qid, off, c, inf)  # type: ignore[arg-type]
                continue
            if traced and not inf.released:  # (a release is the settling gateway's "retried")
                self.trace.record(topic, qid, off, "retried", group=group, attempt=inf.attempt,
                                  reason="invisible time expired")
            if c.fifo:  # type: ignore[union-attr]
                self.cold_phys.pop((topic, qid, off), None)  # looked up for a dead letter only
                self.cold_batch_index.pop((topic, qid, off), None)
                self.notify(topic)  # redelivered in place by the next pop
                continue
            phys = self._phys(topic, qid, off)
            del c.inflight[off]  # type: ignore[union-attr]
            data = {"g": group, "t": topic, "q": qid, "o": off}
            if phys is None:
                last = self.journal.append("ack", data)
                continue
            origin = topic if not topic.startswith("%RETRY%") else self._origin_of(topic, qid, off)
            rt = retry_topic(group, origin)
            self.ensure_topic(rt)
            props = self._link_props(topic, qid, off)
            backoff = 0 if inf.released else cfg.retry_backoff_ms[min(inf.attempt - 1, len(cfg.retry_backoff_ms) - 1)]
            if backoff <= 0:
                last = self.journal.link(phys, rt, 0, "rev", data, properties=props, reconsume_times=inf.attempt)
                self.notify(rt)
            else:
                last = self.timers.schedule_link(phys, rt, 0, now + backoff, "rev", data, props, inf.attempt)
        for entry in later:
            heapq.heappush(heap, entry)
        if self.trace.pending:
            self.trace.write()
        return last

    def _origin_of(self, topic: str, qid: int, off: int) -> str:
        """The user topic a retry-topic message was first sent to."""
        m = self.store.read_at(topic, qid, off)
        if m is not None and P_ORIGIN_TOPIC in m.properties:
            return m.properties[P_ORIGIN_TOPIC]
        return topic[len("%RETRY%"):].rpartition("+")[2]

    # -- journal replay and snapshot -------------------------------------------------

    def apply(self, op: str, d: dict) -> None:
        if op == "tdel":  # topics deleted (BrokerController.delete_topic)
            for t in d["t"]:
                self.drop_group_topic(t)
                self.store.offsets.delete_topic(t)
            return
        if op == "pop":
            key = (d["g"], d["t"], d["q"])
            c = self.cursors.get(key)
            fifo = "w" in d
            if c is None:
                c = self.cursors[key] = Cursor(d["n"], fifo)
            c.next = max(c.next, d["n"])
            for off, attempt, version, mgroup in d["m"]:
                c.waiting.pop(off, None)
                c.inflight[off] = Inflight(d["v"], attempt, version, mgroup)
            for off, g in d.get("w", ()):
                c.waiting[off] = g
        elif op == "rst":  # an admin's offset reset: the group starts again from offset o
            self.reset(d["g"], d["t"], d["q"], d["o"])
        elif op in ("ack", "rev"):
            c = self.cursors.get((d["g"], d["t"], d["q"]))
            if c is not None:
                c.inflight.pop(d["o"], None)
        elif op == "chg":
            c = self.cursors.get((d["g"], d["t"], d["q"]))
            inf = c.inflight.get(d["o"]) if c is not None else None
            if inf is not None:
                inf.visible_at, inf.version = d["v"], d["r"]
                inf.released = bool(d.get("z", 0))

    def snapshot(self) -> list:
        out = []
        for (g, t, q), c in self.cursors.items():
            out.append(
                {
                    "g": g, "t": t, "q": q, "n": c.next, "f": c.fifo,
                    "i": [[o, i.visible_at, i.attempt, i.version, i.mgroup] for o, i in c.inflight.items()],
                    "w": [[o, g2] for o, g2 in c.waiting.items()],
                }
            )
        return out

    def load(self, rows: list | None) -> None:
        self.cursors.clear()
        for r in rows or ():
            c = Cursor(r["n"], r["f"])
            for o, vis, att, ver, mg in r["i"]:
                c.inflight[o] = Inflight(vis, att, ver, mg)
            for o, g in r["w"]:
                c.waiting[o] = g
            self.cursors[(r["g"], r["t"], r["q"])] = c

    def rebuild_heap(self) -> None:
        self._heap = [
            (inf.visible_at, g, t, q, o, inf.version)
            for (g, t, q), c in self.cursors.items()
            for o, inf in c.inflight.items()
        ]
        heapq.heapify(self._heap)

    def commit_floors(self) -> None:
        """Publish each cursor's floor as the group's committed offset (for offset queries)."""
        for (g, t, q), c in self.cursors.items():
            if not is_system_topic(t) or t.startswith("%RETRY%") or t.startswith("%DLQ%"):
                self.store.offsets.commit(g, t, q, c.floor())

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Forget the group's cursor on this queue (its in-flight messages too: their receipt
        handles stop working) and commit ``offset``; the next pop starts there."""
        self.cursors.pop((group, topic, queue_id), None)
        self.store.offsets.commit(group, topic, queue_id, offset)

    def drop_group_topic(self, topic: str) -> None:
        for key in [k for k in self.cursors if k[1] == topic]:
            del self.cursors[key]
