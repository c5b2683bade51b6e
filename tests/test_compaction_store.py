"""Compacted topics at the store: passes with a bounded key map, reads below the boundary,
delete markers and their retention, and local retention keeping what is not compacted yet.

Real stores in tmp_path (``store_helpers``); the HTTP and crash tests are in test_compaction.py.
"""

from __future__ import annotations

import time

from store_helpers import force_checkpoint, stores  # noqa: F401  (fixture)

from core_broker.message_store import iter_messages
from core_broker.model import Message, MessageType
from core_broker.topic_config import TopicConfig

KEYS = 30


def _fill(store, rounds: int = 4, deleted: range = range(0, 5)) -> dict[str, bytes]:
    """Write every key ``rounds`` times, then a delete marker for ``deleted``; the latest per key."""
    latest: dict[str, bytes] = {}
    for r in range(rounds):
        for k in range(KEYS):
            body = f"v{r}-{k}-".encode() + b"x" * 200
            store.put(Message("kv", body, keys=(f"k{k}",), queue_id=0))
            latest[f"k{k}"] = body
    for k in deleted:
        store.put(Message("kv", b"", keys=(f"k{k}",), queue_id=0))
        latest[f"k{k}"] = b""
    return latest


def _roll(store) -> None:
    """Seal the segment holding the compacted topic's records (the active one is never compacted)."""
    seg = store.commitlog.files.files[-1].base
    while store.commitlog.files.files[-1].base == seg:
        store.put(Message("filler", b"f" * 2000, queue_id=0))
    force_checkpoint(store)
    deadline = time.monotonic() + 10
    while store._flush.flushed < store.commitlog.files.files[-1].base and time.monotonic() < deadline:
        time.sleep(0.01)


def _open(stores, **kw):
    s = stores.open(compaction_check_interval_s=3600.0, **kw)
    s.topics.create(TopicConfig("kv", queues=1, message_type=MessageType.COMPACTED))
    return s


def test_passes_with_a_small_key_map_keep_the_latest_of_every_key_in_order(stores) -> None:
    s = _open(stores, compaction_map_entries=7)  # 30 keys: several passes, each stopping early
    latest = _fill(s)
    before = [(m.queue_offset, m.keys[0], m.body) for m in iter_messages(s, "kv", 0)]
    _roll(s)
    done = s.compaction.compact_now("kv")
    assert done["passes"] > 1 and done["removed"] > 0
    got = [(m.queue_offset, m.keys[0], m.body) for m in iter_messages(s, "kv", 0)]
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets))  # increasing, never renumbered
    assert {k: b for _, k, b in got} == latest  # markers kept: retention is 24 h by default
    assert len(got) == KEYS
    # every kept message is the very record that was at its offset before
    assert set(got) <= set(before)
    for o in range(s.max_offset("kv", 0)):  # a read from any offset, gaps too, starts at the next kept one
        r = s.get("kv", 0, o, 2)
        assert [m.queue_offset for m in r.messages] == [q for q in offsets if q >= o][:2]
    # ... and a restart reads the same from the compacted log
    s2 = stores.reopen(s)
    assert [(m.queue_offset, m.keys[0], m.body) for m in iter_messages(s2, "kv", 0)] == got


def test_delete_markers_go_after_their_retention(stores) -> None:
    s = _open(stores)
    s.topics.update(TopicConfig("kv", queues=1, message_type=MessageType.COMPACTED,
                                attributes={"delete_retention_ms": "1"}))
    latest = _fill(s)
    _roll(s)
    time.sleep(0.01)  # past the 1 ms the markers are kept
    s.compaction.compact_now("kv")
    got = {m.keys[0]: m.body for m in iter_messages(s, "kv", 0)}
    assert got == {k: v for k, v in latest.items() if v}


def test_retention_keeps_segments_a_compacted_queue_still_needs(stores) -> None:
    s = _open(stores)
    latest = _fill(s)
    _roll(s)
    later = time.time() + 10 * 24 * 3600  # every sealed segment is past retention_hours
    first = s.commitlog.files.files[0].base
    s.run_retention(now=later)
    assert s.commitlog.files.files[0].base == first  # the uncompacted records' segment stays
    s.compaction.compact_now("kv")
    assert s.run_retention(now=later) > 0  # compacted: the commitlog may let it go
    assert s.commitlog.min_offset > first
    got = {m.keys[0]: m.body for m in iter_messages(s, "kv", 0)}
    assert got == latest
    table = s.compaction.table("kv", 0, 0, 1000)
    assert {m.keys[0]: m.body for m in table.messages} == {k: v for k, v in latest.items() if v}


def test_the_table_sees_writes_newer_than_the_compacted_log(stores) -> None:
    s = _open(stores)
    latest = _fill(s)
    _roll(s)
    s.compaction.compact_now("kv")
    for k in range(10, 15):  # in the live range now: these win over the compacted values
        s.put(Message("kv", b"new", keys=(f"k{k}",), queue_id=0))
        latest[f"k{k}"] = b"new"
    s.put(Message("kv", b"", keys=("k20",), queue_id=0))
    latest["k20"] = b""
    rows, off = [], 0
    while True:  # small pages: the cursor must neither skip nor repeat
        r = s.compaction.table("kv", 0, off, 4)
        rows += r.messages
        if r.next_offset >= r.max_offset:
            break
        off = r.next_offset
    assert {m.keys[0]: m.body for m in rows} == {k: v for k, v in latest.items() if v}
    assert len(rows) == len({m.keys[0] for m in rows})


def test_the_cleaner_compacts_a_queue_once_its_dirty_share_passes_the_ratio(stores) -> None:
    s = stores.open(compaction_check_interval_s=0.05)
    s.topics.create(TopicConfig("kv", queues=1, message_type=MessageType.COMPACTED,
                                attributes={"min_cleanable_dirty_ratio": "0.5"}))
    latest = _fill(s, rounds=1, deleted=range(0))
    _roll(s)
    deadline = time.monotonic() + 30  # dirty share 1.0 > 0.5: the cleaner's thread takes it
    while s.compaction.boundary("kv", 0) < KEYS:
        assert time.monotonic() < deadline, "the cleaner never compacted the queue"
        time.sleep(0.05)
    passes = s.compaction.passes
    for k in range(10):  # 10 new values over 30 compacted ones: a share of 0.25, under the ratio
        s.put(Message("kv", b"again", keys=(f"k{k}",), queue_id=0))
        latest[f"k{k}"] = b"again"
    _roll(s)
    time.sleep(0.5)  # ten rounds of the cleaner's check
    assert s.compaction.passes == passes
    assert s.compaction.dirty_ratio("kv", 0) == 10 / 40
    assert {m.keys[0]: m.body for m in iter_messages(s, "kv", 0)} == latest
