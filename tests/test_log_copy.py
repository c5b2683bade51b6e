"""core_broker.log_copy on its own: what a master serves its replicas and how a replica takes it.

Regression: a segment may end in a tail shorter than a record prefix (12 bytes) with no BLANK
record (CommitLog.make_room only writes a filler that fits). read_log read a prefix across the
segment's end there and failed every fetch from that point: the replicas of a master whose
segment ended so never caught up again (seen in the Jepsen test, small segments).
"""

from __future__ import annotations

from pathlib import Path

from core_broker import record
from core_broker.log_copy import append_replicated, read_log
from core_broker.message_store import MessageStore
from core_broker.model import Message

from store_helpers import SEG, make_config


def _fill_leaving(store: MessageStore, tail: int) -> None:
    """Put messages so the current segment ends in a tail of ``tail`` bytes, then roll it."""
    overhead = record.HEADER_SIZE + len("t") + len("internal")
    while True:
        left = SEG - store.write_pos % SEG
        if left - overhead <= 1024:
            break
        store.put(Message("t", b"x" * 512, queue_id=0))
    body = left - tail - overhead
    assert body >= 0
    store.put(Message("t", b"y" * body, queue_id=0))
    assert SEG - store.write_pos % SEG == tail
    store.put(Message("t", b"next segment", queue_id=0))  # does not fit: the log rolls


def test_a_segment_tail_shorter_than_a_prefix_is_skipped_by_readers_and_replicas(tmp_path: Path) -> None:
    master = MessageStore(make_config(tmp_path / "m"))
    master.start()
    replica = MessageStore(make_config(tmp_path / "r"))
    replica.start()
    try:
        _fill_leaving(master, 4)
        end = master.write_pos
        assert end > SEG  # the last message went to the second segment
        pos = 0
        while pos < end:
            start, data = read_log(master, pos, 1 << 20)
            if not data:
                assert start == pos or start == SEG
                pos = start
                continue
            pos = append_replicated(replica, start, data)
        assert replica.write_pos == end
        assert [m.body for m in replica.get("g", "t", 0, 0, 1000).messages] == \
               [m.body for m in master.get("g", "t", 0, 0, 1000).messages]
    finally:
        master.shutdown()
        replica.shutdown()
