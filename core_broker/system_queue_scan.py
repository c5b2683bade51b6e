"""Finding the unfinished entries of a system queue again after a restart.

The timer queue and the transaction half queue are both read the same way at
start-up: from the tracker's low-water mark (or the queue's first offset, if
retention removed more) to the end, skipping the entries the tracker marks
done. What is left are the timers still to fire and the halves still open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from .model import GetStatus, StoredMessage
from .system_queue_tracker import SystemQueueTracker

if TYPE_CHECKING:
    from .message_store import MessageStore

SCAN_BATCH = 512  # entries read per store.get


def unfinished(store: "MessageStore", topic: str, tracker: SystemQueueTracker) -> Iterator[StoredMessage]:
    """Every message of ``topic`` (queue 0) that ``tracker`` does not mark done, in queue order."""
    off = max(tracker.low_water, store.min_offset(topic, 0))
    while True:
        r = store.get(topic, 0, off, SCAN_BATCH)
        if r.status == GetStatus.OFFSET_MOVED:
            off = r.next_offset
            continue
        if not r.messages:
            return
        for m in r.messages:
            if not tracker.is_done(m.queue_offset):
                yield m
        off = r.next_offset
