"""Commitlog warm-up (zeros written ahead of the writer) and the plain-batch fast path.

Warm-up: in sync flush mode the flush thread zero-fills the current segment a
little ahead of ``write_pos`` so that group-commit fdatasyncs do not also write
ext4's unwritten-extent conversions. What must hold: the zeros never land on a
record (a writer reaching a range being zero-filled waits for it), the warmed
range really is written zeros (FIEMAP shows no unwritten extent there, where
the filesystem reports extents), and recovery treats warmed-but-unused space
like any other empty tail.

Batches next to warm-up claims and rolls: a batch of bare messages stores
exactly what single puts store, and mixed batches (a tag, another queue, keys,
another protocol, a segment end in the middle) keep their order.
"""

from __future__ import annotations

import fcntl
import struct
import threading
from pathlib import Path

import pytest

from core_broker.config import FlushMode, StoreConfig, Warmup
from core_broker.model import Message, PutStatus
from store_helpers import (  # noqa: F401  (stores is a fixture)
    SEG,
    body_for,
    copy_config,
    crash_copy,
    read_all,
    stores,
    wait_until,
)

# ------------------------------------------------------------------------------------ helpers

_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_EXTENT_UNWRITTEN = 0x800
_FIEMAP_EXTENT_LAST = 0x1


def unwritten_ranges(path: Path) -> list[tuple[int, int]] | None:
    """(start, end) byte ranges of the file's unwritten (preallocated) extents; None if unknown."""
    n = 256
    req = bytearray(struct.pack("=QQLLLL", 0, 2**63 - 1, 1, 0, n, 0) + bytes(56 * n))  # FIEMAP_FLAG_SYNC
    with open(path, "rb") as f:
        try:
            fcntl.ioctl(f.fileno(), _FS_IOC_FIEMAP, req)
        except OSError:  # tmpfs and friends: no extent map
            return None
    mapped = struct.unpack_from("=L", req, 20)[0]
    out = []
    for i in range(mapped):
        logical, _phys, length, _r1, _r2, flags = struct.unpack_from("=QQQQQL", req, 32 + 56 * i)
        if flags & _FIEMAP_EXTENT_UNWRITTEN:
            out.append((logical, logical + length))
    return out


def sync_store(stores, **kw):
    return stores.open(flush=FlushMode.SYNC, **kw)


# ------------------------------------------------------------------------------------ config


def test_warmup_is_on_in_sync_mode_only_by_default(tmp_path: Path) -> None:
    assert StoreConfig(data_dir=tmp_path, flush=FlushMode.SYNC).warmup_enabled
    assert not StoreConfig(data_dir=tmp_path, flush=FlushMode.ASYNC).warmup_enabled
    assert StoreConfig(data_dir=tmp_path, flush=FlushMode.ASYNC, commitlog_warmup="on").warmup_enabled
    assert not StoreConfig(data_dir=tmp_path, flush=FlushMode.SYNC, commitlog_warmup=Warmup.OFF).warmup_enabled
    with pytest.raises(ValueError):
        StoreConfig(data_dir=tmp_path, commitlog_warmup="sometimes")


# ------------------------------------------------------------------------------------ warm-up


def test_sync_store_warms_the_segment_ahead_of_the_writer(stores) -> None:
    s = sync_store(stores, commitlog_segment_size=4 << 20)
    r = s.put(Message("W", b"first"))
    assert r.status == PutStatus.PUT_OK
    cl = s.commitlog
    # The flush thread keeps written zeros ahead of the writer (here: to the segment's end).
    assert wait_until(lambda: cl.warm_end >= cl.current.end, timeout=20.0), (cl.warm_end, cl.current.end)
    assert s._flush.warm_syncs >= 1
    seg = cl.current
    tail = bytes(seg.mm[cl.write_pos - seg.base :])
    assert tail == bytes(len(tail)), "the warmed tail must be zeros"
    holes = unwritten_ranges(seg.path)
    if holes is not None:  # ext4/xfs: the warmed range holds no unwritten extent any more
        page_after = (cl.write_pos - seg.base + 4095) & ~4095
        assert not [h for h in holes if h[1] > page_after], holes
    # ... and puts keep working in the warmed range, across the next roll
    sent = [Message("W", body_for(i, 3000)) for i in range(1600)]
    for m in sent:
        assert s.put(m).status == PutStatus.PUT_OK
    assert len(cl.files.files) == 2
    assert [m.body for m in read_all(s, "W", 0)] == [b"first"] + [m.body for m in sent]


def test_async_store_does_not_warm_by_default(stores) -> None:
    s = stores.open()
    s.put(Message("W", b"x"))
    assert s._flush._warm is None


def test_zeros_never_overwrite_records_written_while_warming(stores) -> None:
    """A warmer thread claims ranges right at the write position while writers append.

    Tiny pieces and segments make writers run into claims and rolls all the time; every
    record must survive byte for byte, in the live store and after a crash.
    """
    s = stores.open(commitlog_warmup="off")  # drive warm_step by hand, as fast as possible
    cl = s.commitlog
    stop = threading.Event()
    steps = [0]

    def warmer() -> None:
        while not stop.is_set():
            if cl.warm_step(s._lock, 64 * 1024, 4096) is not None:
                steps[0] += 1

    t = threading.Thread(target=warmer, daemon=True)
    t.start()
    sent: list[Message] = []
    try:
        for i in range(20_000):  # until the warmer has done enough pieces (each one fdatasyncs)
            if i >= 600 and steps[0] >= 40:
                break
            if i % 3 == 0:
                batch = [Message("Z", body_for(i * 10 + k, 200 + 37 * k)) for k in range(8)]
                assert all(r.status == PutStatus.PUT_OK for r in s.put_batch(batch))
                sent += batch
            else:
                m = Message("Z", body_for(i, 50 + (i * 7) % 900), tag="t" if i % 2 else None)
                assert s.put(m).status == PutStatus.PUT_OK
                sent.append(m)
    finally:
        stop.set()
        t.join()
    assert steps[0] >= 40
    assert len(cl.files.files) > 3
    end = cl.scan(cl.first_record_offset())
    assert end == cl.write_pos
    assert [m.body for m in read_all(s, "Z", 0)] == [m.body for m in sent]
    c = stores.open(copy_config(s, crash_copy(s, stores.tmp_path / "c")))
    assert c.recovered_abnormally
    assert [m.body for m in read_all(c, "Z", 0)] == [m.body for m in sent]


def test_crash_with_a_warmed_but_unused_tail_recovers(stores) -> None:
    s = sync_store(stores, checkpoint_interval_ms=3_600_000)
    sent = [Message("R", body_for(i, 700)) for i in range(150)]  # into the second segment
    for m in sent:
        assert s.put(m).status == PutStatus.PUT_OK
    cl = s.commitlog
    assert wait_until(lambda: cl.warm_end >= cl.current.end, timeout=20.0)
    c = stores.open(copy_config(s, crash_copy(s, stores.tmp_path / "c")))
    assert c.recovered_abnormally
    assert c.commitlog.write_pos == cl.write_pos
    assert [m.body for m in read_all(c, "R", 0)] == [m.body for m in sent]
    more = [Message("R", body_for(1000 + i, 900)) for i in range(120)]  # rolls again after recovery
    for m in more:
        assert c.put(m).status == PutStatus.PUT_OK
    c2 = stores.reopen(c)
    assert not c2.recovered_abnormally
    assert [m.body for m in read_all(c2, "R", 0)] == [m.body for m in sent + more]


async def test_group_commit_with_warmup_across_rolls(stores) -> None:
    import asyncio

    s = sync_store(stores)
    msgs = [Message("G", body_for(i, 400)) for i in range(900)]  # several 64 KiB segments
    results = await asyncio.gather(*(s.put_async(m) for m in msgs))
    assert all(r.status == PutStatus.PUT_OK for r in results)
    assert s._flush.flushed >= s.commitlog.write_pos
    assert [m.body for m in read_all(s, "G", 0)] == [m.body for m in msgs]


# ------------------------------------------------------------------------------------ batches


def test_plain_batch_stores_what_single_puts_store(stores) -> None:
    fast = stores.open(stores.config("fast"))
    slow = stores.open(stores.config("slow"))
    batch = [Message("P", body_for(i, (i * 53) % 700), queue_id=1, born_timestamp_ms=(1000 + i) * (i % 2))
             for i in range(40)]
    got = fast.put_batch(batch)
    ref = [slow.put(m) for m in batch]
    assert [(r.status, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_size) for r in got] == [
        (r.status, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_size) for r in ref
    ]
    assert all(r.message_id.startswith(fast._id_prefix) for r in got)
    for r in got:
        assert fast.query_by_id(r.message_id).commitlog_offset == r.commitlog_offset
    a, b = read_all(fast, "P", 1), read_all(slow, "P", 1)
    assert [m.body for m in a] == [m.body for m in batch]
    for x, y, m in zip(a, b, batch):
        assert (x.topic, x.queue_offset, x.protocol, x.flags, x.delivery_time_ms) == (
            y.topic, y.queue_offset, y.protocol, y.flags, y.delivery_time_ms)
        if m.born_timestamp_ms:
            assert x.born_timestamp_ms == m.born_timestamp_ms
        else:
            assert x.born_timestamp_ms == x.store_timestamp_ms
    c = stores.open(copy_config(fast, crash_copy(fast, stores.tmp_path / "c")))
    assert [m.body for m in read_all(c, "P", 1)] == [m.body for m in batch]


@pytest.mark.parametrize("odd", ["tag", "queue", "keys", "protocol", "too_big_for_segment"])
def test_mixed_batches_fall_back_and_keep_order(stores, odd: str) -> None:
    s = stores.open()
    batch = [Message("M", body_for(i, 300)) for i in range(30)]
    if odd == "tag":
        batch[7] = Message("M", b"tagged", tag="T")
    elif odd == "queue":
        batch[7] = Message("M", b"other queue", queue_id=1)
    elif odd == "keys":
        batch[7] = Message("M", b"keyed", keys=("k1",))
    elif odd == "protocol":
        batch[7] = Message("M", b"amqp", protocol="amqp")
    else:  # the batch runs past the segment's end: the general loop rolls in the middle
        batch = [Message("M", body_for(i, 3000)) for i in range(30)]
    results = s.put_batch(batch)
    assert all(r.status == PutStatus.PUT_OK for r in results)
    offsets = [r.commitlog_offset for r in results]
    assert offsets == sorted(offsets)
    for q in (0, 1):
        assert [m.body for m in read_all(s, "M", q)] == [m.body for m in batch if m.queue_id == q]
    if odd == "keys":
        assert [m.body for m in s.query_by_key("M", "k1")] == [b"keyed"]
    if odd == "too_big_for_segment":
        assert len(s.commitlog.files.files) >= 2 and SEG < s.commitlog.write_pos
