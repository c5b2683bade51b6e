"""MessageStore retention: time-based and disk-pressure deletion, and what readers see after it.

Segment ages are set with ``os.utime`` (retention reads a segment's mtime), so
no test waits for wall-clock time to pass; ``run_retention`` is called
directly (the housekeeping thread is pushed out to an hour by the helpers).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from core_broker.errors import StoreFullError
from core_broker.message_store import MessageStore
from core_broker.model import GetStatus, Message

from store_helpers import SEG, body_for, read_all, segment_paths, stores  # noqa: F401


def _age(paths: list[Path], hours: float) -> None:
    t = time.time() - hours * 3600
    for p in paths:
        os.utime(p, (t, t))


def _cq_files(s: MessageStore, topic: str, q: int) -> list[Path]:
    d = s.root / "consumequeue" / topic / str(q)
    return sorted(p for p in d.iterdir() if p.name.isdigit())


def _fill(s: MessageStore, n: int, size: int = 1000, start: int = 0):
    out = []
    for i in range(start, start + n):
        m = Message("R", body_for(i, size), queue_id=i % 2, keys=(f"k{i}",), message_id=f"cid-{i}" if i % 3 == 0 else "")
        out.append((m, s.put(m)))
    return out


def test_time_based_retention_deletes_oldest_segments_and_queues_follow(stores) -> None:
    s = stores.open(retention_hours=1.0, index_entries_per_file=32)
    sent = _fill(s, 400)  # ~6 segments, ~3 consume-queue files per queue, ~17 index files
    segs = segment_paths(s.root)
    assert len(segs) >= 6
    cq_before = {q: _cq_files(s, "R", q) for q in (0, 1)}
    assert all(len(v) >= 3 for v in cq_before.values())
    index_before = len(s.index.files)

    assert s.run_retention() == 0  # nothing is old yet
    _age(segs[:4], hours=2)
    assert s.run_retention() == 4
    new_min = 4 * SEG
    assert s.commitlog.min_offset == new_min
    assert [int(p.name) for p in segment_paths(s.root)] == [int(p.name) for p in segs[4:]]
    assert s.run_retention() == 0  # idempotent

    for q in (0, 1):
        in_q = [(m, r) for m, r in sent if m.queue_id == q]
        first_kept = next(r.queue_offset for _, r in in_q if r.commitlog_offset >= new_min)
        # get below the new minimum: a clear OFFSET_MOVED naming the new minimum
        g = s.get("R", q, 0, 10)
        assert g.status == GetStatus.OFFSET_MOVED and g.messages == []
        assert g.next_offset == g.min_offset == first_kept == s.min_offset("R", q)
        assert g.max_offset == len(in_q)
        g = s.get("R", q, first_kept, 10)
        assert g.status == GetStatus.FOUND and g.messages[0].body == in_q[first_kept][0].body
        assert [m.body for m in read_all(s, "R", q)] == [m.body for m, _ in in_q[first_kept:]]
        assert s.read_at("R", q, first_kept - 1) is None
        # consume-queue files wholly below the new minimum are gone from disk
        after = _cq_files(s, "R", q)
        assert len(after) < len(cq_before[q])
        assert int(after[0].name) // 20 <= first_kept
    # indexes follow: removed messages are not found by key or id, kept ones are
    gone_m, gone_r = sent[0]
    assert s.query_by_key("R", gone_m.keys[0]) == []
    assert s.query_by_id(gone_r.message_id) is None
    assert s.query_by_id(sent[3][1].message_id) is None  # a client id
    kept_m, kept_r = sent[-3]
    assert [m.body for m in s.query_by_key("R", kept_m.keys[0])] == [kept_m.body]
    assert s.query_by_id(kept_r.message_id).body == kept_m.body
    assert len(s.index.files) < index_before
    # writing goes on, and a restart keeps the new minimum
    more = _fill(s, 10, start=400)
    s2 = stores.reopen(s)
    for q in (0, 1):
        g = s2.get("R", q, 0, 10)
        assert g.status == GetStatus.OFFSET_MOVED and g.next_offset == s2.min_offset("R", q) > 0
        assert [m.body for m in read_all(s2, "R", q)][-5:] == [m.body for m, _ in more if m.queue_id == q]


def test_retention_never_deletes_the_segment_being_written(stores) -> None:
    s = stores.open(retention_hours=1.0)
    _fill(s, 300)
    segs = segment_paths(s.root)
    _age(segs, hours=10)  # every segment, the current one too, is old
    assert s.run_retention() == len(segs) - 1
    assert segment_paths(s.root) == segs[-1:]
    assert s.run_retention() == 0
    # the current segment keeps taking writes and everything in it is readable
    r = s.put(Message("R", b"still here", queue_id=0))
    assert s.read_at("R", 0, r.queue_offset).body == b"still here"
    assert read_all(s, "R", 0)[-1].body == b"still here"


def test_a_queue_whose_messages_all_expired(stores) -> None:
    s = stores.open(retention_hours=1.0)
    for i in range(30):
        s.put(Message("old", body_for(i, 2000)))  # ~1 segment of "old" only
    _fill(s, 200)
    _age(segment_paths(s.root)[:-1], hours=5)
    assert s.run_retention() >= 1
    g = s.get("old", 0, 0, 10)
    assert g.status == GetStatus.OFFSET_MOVED and g.min_offset == g.max_offset == 30 == g.next_offset
    assert s.get("old", 0, 30, 10).status == GetStatus.OFFSET_OVERFLOW_ONE
    r = s.put(Message("old", b"new"))
    assert r.queue_offset == 30
    assert [m.body for m in read_all(s, "old", 0)] == [b"new"]


def test_link_whose_origin_expired_is_skipped_not_an_error(stores) -> None:
    s = stores.open(retention_hours=1.0)
    ro = s.put(Message("orig", b"origin body"))
    _fill(s, 100)  # pushes the origin's segment into the past
    s.put_link(ro.commitlog_offset, "DELAY", 0)
    s.put(Message("DELAY", b"plain"))
    _age(segment_paths(s.root)[:1], hours=5)
    assert s.run_retention() == 1
    g = s.get("DELAY", 0, 0, 10)
    assert [m.body for m in g.messages] == [b"plain"] and g.next_offset == 2
    assert s.read_at("DELAY", 0, 0) is None


def test_low_disk_deletes_early_one_segment_per_round(stores) -> None:
    s = stores.open(retention_hours=72.0, disk_min_free_ratio=0.10, disk_refuse_free_ratio=0.02)
    sent = _fill(s, 400)
    segs = segment_paths(s.root)
    s.disk_free_ratio = lambda: 0.05  # type: ignore[method-assign]  # under min, over refuse
    assert s.run_retention() == 1
    assert s.run_retention() == 1
    assert segment_paths(s.root) == segs[2:]
    s.put(Message("R", b"accepted while low", queue_id=0))  # low is not yet refusing
    s.disk_free_ratio = lambda: 0.5  # type: ignore[method-assign]
    assert s.run_retention() == 0
    assert [m.body for m in read_all(s, "R", 1)] == [m.body for m, r in sent if m.queue_id == 1 and
                                                       r.commitlog_offset >= 2 * SEG]


async def test_nearly_full_disk_refuses_puts_until_space_returns(stores) -> None:
    s = stores.open(retention_hours=72.0, disk_min_free_ratio=0.10, disk_refuse_free_ratio=0.02)
    sent = _fill(s, 200)
    s.disk_free_ratio = lambda: 0.01  # type: ignore[method-assign]
    s.run_retention()
    pos = s.commitlog.write_pos
    with pytest.raises(StoreFullError) as ei:
        s.put(Message("R", b"refused"))
    assert ei.value.code == "STORE_FULL"
    with pytest.raises(StoreFullError):
        s.put_batch([Message("R", b"refused")])
    with pytest.raises(StoreFullError):
        await s.put_async(Message("R", b"refused"))
    with pytest.raises(StoreFullError):
        await s.put_batch_async([Message("R", b"refused")])
    assert s.commitlog.write_pos == pos
    # reads go on while writes are refused
    kept = [m.body for m, r in sent if m.queue_id == 0 and r.commitlog_offset >= s.commitlog.min_offset]
    assert [m.body for m in read_all(s, "R", 0)] == kept
    s.disk_free_ratio = lambda: 0.5  # type: ignore[method-assign]
    s.run_retention()
    r = await asyncio.wait_for(s.put_async(Message("R", b"accepted again")), 10)
    assert s.read_at("R", 0, r.queue_offset).body == b"accepted again"


def test_housekeeping_thread_runs_retention(stores) -> None:
    from store_helpers import wait_until

    s = stores.open(retention_hours=1.0, retention_check_interval_s=0.02, consumer_offset_persist_interval_s=0.02)
    _fill(s, 300)
    segs = segment_paths(s.root)
    _age(segs[:2], hours=3)
    assert wait_until(lambda: s.commitlog.min_offset == 2 * SEG, timeout=10)
    s.offsets.commit("g", "R", 0, 5)
    assert wait_until(lambda: (s.root / "config" / "consumer_offsets.json").exists(), timeout=10)


@pytest.mark.parametrize("damage", ["crash", "crash-without-consume-queues", "clean-without-consume-queues"])
def test_recovery_after_retention(stores, damage: str) -> None:
    """The log no longer starts at 0: recovery and consume-queue rebuilds start at its first segment."""
    import shutil

    from store_helpers import copy_config, crash_copy

    s = stores.open(retention_hours=1.0, checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 400)
    _age(segment_paths(s.root)[:3], hours=2)
    assert s.run_retention() == 3
    more = _fill(s, 50, start=400)
    if damage == "clean-without-consume-queues":
        s.shutdown()
        d, cfg = s.root, s.config
    else:
        d = crash_copy(s, stores.tmp_path / "c")
        cfg = copy_config(s, d)
    if damage.endswith("without-consume-queues"):
        shutil.rmtree(d / "consumequeue")
    c = stores.open(cfg)
    for q in (0, 1):
        kept = [m.body for m, r in sent + more if m.queue_id == q and r.commitlog_offset >= 3 * SEG]
        assert [m.body for m in read_all(c, "R", q)] == kept
        g = c.get("R", q, 0, 5)
        assert g.status == GetStatus.OFFSET_MOVED and c.get("R", q, g.next_offset, 1).messages[0].body == kept[0]
        assert c.max_offset("R", q) == len([1 for m, _ in sent + more if m.queue_id == q])
    r = c.put(Message("R", b"after", queue_id=0))
    assert r.queue_offset == c.max_offset("R", 0) - 1 == 225
    assert c.read_at("R", 0, 225).body == b"after"
