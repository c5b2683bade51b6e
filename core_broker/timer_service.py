"""TimerService: delay / scheduled messages (and delayed retries).

A message with a future delivery time is stored once, in the system timer
queue, with its real destination in reserved properties. A heap of pending
(deliver_at, timer offset) drives one asyncio task that sleeps until the next
due time, or until woken while none is pending (see ``DeadlineLoop``); firing
writes a link record into the real queue (journaled in the same record), so
the body is never copied and a fire survives a crash. After
a restart the pending heap is rebuilt by scanning the timer queue from the
tracker's low-water mark, so a timer set before a restart still fires.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Callable

from .deadline_loop import DeadlineLoop
from .journal import Journal
from .message_store import MessageStore
from .model import Message, PutResult
from .system_queue import park, unfinished
from .system_queue_tracker import SystemQueueTracker
from .system_topics import P_DELIVER_AT, P_REAL_QUEUE, P_REAL_TOPIC, TIMER_TOPIC

log = logging.getLogger("unimq.timer")


def now_ms() -> int:
    return int(time.time() * 1000)


class TimerService:
    def __init__(self, store: MessageStore, journal: Journal, notify: Callable[[str], None]) -> None:
        self.store = store
        self.journal = journal
        self.notify = notify
        self.tracker = SystemQueueTracker()
        self._heap: list[tuple[int, int, int]] = []  # (deliver_at, timer queue offset, phys)
        # at most 1 s asleep while a timer is pending: bounds a wall-clock step's effect
        self._loop = DeadlineLoop("unimq-timer", self._round, max_sleep_s=1.0)

    # -- state ---------------------------------------------------------------------

    def apply(self, op: str, data: dict) -> None:
        if op == "tfire":
            self.tracker.mark_done(int(data["tq"]))

    def rebuild(self) -> None:
        """Find every timer not yet fired (after snapshot load and journal replay)."""
        self._heap.clear()
        for m in unfinished(self.store, TIMER_TOPIC, self.tracker):
            at = int(m.properties.get(P_DELIVER_AT, m.delivery_time_ms))
            phys = self.store.phys_at(TIMER_TOPIC, 0, m.queue_offset)  # the link, not its origin
            if phys is not None:
                self._heap.append((at, m.queue_offset, phys))
        heapq.heapify(self._heap)

    @property
    def pending(self) -> int:
        return len(self._heap)

    # -- scheduling ------------------------------------------------------------------

    def schedule(self, msg: Message, deliver_at: int) -> PutResult:
        """Store ``msg`` (destined for msg.topic/msg.queue_id) to be dispatched at ``deliver_at``."""
        timer_msg = park(msg, TIMER_TOPIC, {P_DELIVER_AT: str(deliver_at)}, delivery_time_ms=deliver_at,
                         reconsume_times=msg.reconsume_times)
        r = self.store.put_nowait(timer_msg)
        self._push(deliver_at, r.queue_offset, r.commitlog_offset)
        return r

    def schedule_link(
        self, phys: int, topic: str, queue_id: int, deliver_at: int, op: str, data: dict, properties: dict[str, str],
        reconsume_times: int,
    ) -> PutResult:
        """Delay an already stored message (a retry): link it into the timer queue."""
        props = dict(properties)
        props[P_REAL_TOPIC] = topic
        props[P_REAL_QUEUE] = str(queue_id)
        props[P_DELIVER_AT] = str(deliver_at)
        r = self.journal.link(phys, TIMER_TOPIC, 0, op, data, properties=props, reconsume_times=reconsume_times)
        self._push(deliver_at, r.queue_offset, r.commitlog_offset)
        return r

    def _push(self, deliver_at: int, tq: int, phys: int) -> None:
        first = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (deliver_at, tq, phys))
        if first is None or deliver_at < first:
            self._loop.wake()

    # -- firing ----------------------------------------------------------------------

    def fire_due(self) -> int:
        n = 0
        now = now_ms()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, tq, phys = heapq.heappop(heap)
            if self.tracker.is_done(tq):
                continue
            m = self.store.read_phys(phys)
            topic = m.properties.get(P_REAL_TOPIC)
            if topic is None:
                self.tracker.mark_done(tq)
                continue
            if self.store.topics.get(topic) is None:
                # its topic was deleted while it waited: dispatching would put it in a queue
                # no topic owns, where a topic created again under that name would find it
                self.journal.append("tfire", {"tq": tq})
                self.tracker.mark_done(tq)
                continue
            qid = int(m.properties.get(P_REAL_QUEUE, "0"))
            self.journal.link(phys, topic, qid, "tfire", {"tq": tq}, reconsume_times=m.reconsume_times)
            self.tracker.mark_done(tq)
            self.notify(topic)
            n += 1
        return n

    async def _round(self) -> float | None:
        """Fire what is due; seconds until the next timer, None when none is pending."""
        self.fire_due()
        if not self._heap:
            return None
        return max(0.0, (self._heap[0][0] - now_ms()) / 1000.0)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
