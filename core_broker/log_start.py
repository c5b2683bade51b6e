"""Where an empty local log continues when another tier holds its past.

Why this exists: a broker restarted with an empty local disk (the disk replaced,
or wiped on purpose, its segments all in the tier) must not start its commitlog
at offset 0 nor its queues at 0 again: the tier's objects are named by commitlog
offset and the queues' offsets are what consumers hold, so a reused offset would
shadow or overwrite messages the tier still serves. The tier (which the store
must not import, see ``segment_keeper``) reads where its data ends and hands that
here before the first put; the commitlog then starts at the next segment after
the tier's last, and every queue at the tier's end of it (``ConsumeQueue.start_at``,
kept in a file, so a later restart keeps it even for a queue never written again).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .message_store import MessageStore

log = logging.getLogger("unimq.store")


def continue_after(store: "MessageStore", phys_end: int, queue_ends: dict[tuple[str, int], int]) -> None:
    """Make new writes go after ``phys_end`` (the commitlog, if nothing of it is local) and
    after each queue's end in ``queue_ends`` (queues behind it). Before the first put."""
    cl = store.commitlog
    with store._lock:
        if not cl.files.files and phys_end > cl.write_pos:
            seg = cl.segment_size
            start = phys_end + (-phys_end % seg)  # a segment boundary: rolls never round down into the tier
            cl.set_write_pos(start)
            log.warning("the local commitlog is empty: it continues at %d, after the tier's last segment", start)
        moved = 0
        for (topic, qid), end in queue_ends.items():
            cq = store._cq(topic, qid)
            if cq.max_offset < end:
                cq.start_at(end)
                moved += 1
        if moved:
            log.warning("%d queue(s) continue after their offsets in the tier (none of those is local)", moved)
