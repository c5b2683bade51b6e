"""ConsumeQueue's end after a crash between creating a segment and writing its entries.

`ensure` creates the segment a put needs before the commitlog write, so a SIGKILL (or a put
refused after it) can leave a trailing segment with no entry, and entries below it that were
never written. The crash test found the queue's end then jumped to that segment's first offset
(max offset 128 for 126 messages, with two zero "entries"); these pin the fix.
"""

from __future__ import annotations

from pathlib import Path

from core_broker.consume_queue import ConsumeQueue

PER_FILE = 64


def _queue(root: Path) -> ConsumeQueue:
    cq = ConsumeQueue(root, "T", 0, PER_FILE)
    cq.load()
    return cq


def _fill(cq: ConsumeQueue, n: int) -> None:
    for off in range(n):
        cq.put(off, 1000 + 100 * off, 100, 0)


def test_empty_trailing_segment_does_not_move_the_end(tmp_path: Path) -> None:
    cq = _queue(tmp_path)
    _fill(cq, 126)
    cq.ensure(128)  # a batch reserved 126..130: the segment for 128 exists, nothing written
    cq.sync()
    cq.close()
    again = _queue(tmp_path)
    assert again.max_offset == 126
    again.put(126, 99_000, 100, 0)  # the next put lands right after the last entry
    assert again.entry(126) == (99_000, 100, 0)
    assert again.max_offset == 127


def test_full_segment_then_empty_one(tmp_path: Path) -> None:
    cq = _queue(tmp_path)
    _fill(cq, 128)
    cq.ensure(128)
    cq.ensure(192)
    cq.close()
    again = _queue(tmp_path)
    assert again.max_offset == 128
    again.put(128, 5, 1, 0)
    assert again.max_offset == 129 and again.entry(128) == (5, 1, 0)


def test_recovery_truncation_cuts_holes_as_well_as_torn_entries(tmp_path: Path) -> None:
    cq = _queue(tmp_path)
    _fill(cq, 126)
    cq.put(128, 1000 + 100 * 128, 100, 0)  # an entry past a hole (126, 127 never written)
    assert cq.max_offset == 129
    cq.truncate_beyond_phys(1000 + 100 * 126)  # the log ends after entry 125's record
    assert cq.max_offset == 126
    assert cq.entry(125) == (1000 + 100 * 125, 100, 0)
    cq.close()
    assert _queue(tmp_path).max_offset == 126


def test_only_segment_empty(tmp_path: Path) -> None:
    cq = _queue(tmp_path)
    cq.ensure(0)
    cq.close()
    again = _queue(tmp_path)
    assert again.max_offset == 0 and again.min_offset == 0
