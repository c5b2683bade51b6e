"""The next commitlog segment, prepared by the flush thread before the roll; message ids; group cancellation.

What must hold: a roll takes the segment the flush thread prepared (renamed into
place, its head already warm in sync mode) and every record survives it, in the
live store, after a clean restart and after a crash; a prepared file never
becomes part of the log by itself (a stray ``*.next`` file is deleted at start,
an unused one at a clean stop); server-assigned ids are the commitlog offset in
16 hex digits on every put path; a put_async cancelled before its group is
written is not stored.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from core_broker.config import FlushMode
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


def next_files(store) -> list[Path]:
    return sorted(p for p in store.commitlog.files.dir.iterdir() if p.name.endswith(".next"))


def fill_to_roll(store, topic: str, start: int) -> list[Message]:
    """Put messages until the commitlog rolls into its next segment; return them."""
    cl = store.commitlog
    first = cl.current
    sent = []
    i = start
    while cl.current is first:
        m = Message(topic, body_for(i, 900))
        assert store.put(m).status == PutStatus.PUT_OK
        sent.append(m)
        i += 1
    return sent


def test_sync_roll_takes_the_prepared_and_warmed_segment(stores) -> None:
    s = stores.open(flush=FlushMode.SYNC)
    cl = s.commitlog
    sent = [Message("N", b"first")]
    assert s.put(sent[0]).status == PutStatus.PUT_OK
    # The flush thread prepares the next segment, and warms its head once the current one is warm.
    assert wait_until(lambda: cl._next is not None and cl._next_warm > 0, timeout=20.0)
    prepared = cl._next
    assert prepared.base == cl.current.end and prepared.path.name.endswith(".next")
    assert bytes(prepared.mm[: cl._next_warm]) == bytes(cl._next_warm)
    sent += fill_to_roll(s, "N", 1)
    assert cl.current is prepared
    assert prepared.path.name == f"{prepared.base:020d}" and prepared.path.exists()
    assert cl.files.files[-1] is prepared
    assert cl.warm_end > prepared.base  # the warm head carried over
    assert s._flush.prepared >= 1
    sent += fill_to_roll(s, "N", 1000)  # and once more, with the segment prepared after this roll
    assert [m.body for m in read_all(s, "N", 0)] == [m.body for m in sent]
    c = stores.open(copy_config(s, crash_copy(s, stores.tmp_path / "c")))
    assert c.recovered_abnormally
    assert [m.body for m in read_all(c, "N", 0)] == [m.body for m in sent]
    assert not next_files(c)
    s2 = stores.reopen(s)
    assert not next_files(s2)  # the clean stop gave the unused prepared segment back
    assert [m.body for m in read_all(s2, "N", 0)] == [m.body for m in sent]
    more = fill_to_roll(s2, "N", 2000)
    assert [m.body for m in read_all(s2, "N", 0)] == [m.body for m in sent + more]


def test_async_mode_prepares_the_next_segment_too(stores) -> None:
    s = stores.open()
    cl = s.commitlog
    assert s.put(Message("A", b"x")).status == PutStatus.PUT_OK
    assert wait_until(lambda: cl._next is not None, timeout=20.0)
    prepared = cl._next
    assert cl._next_warm == 0  # no warm-up in async mode
    sent = [Message("A", b"x")] + fill_to_roll(s, "A", 0)
    assert cl.current is prepared
    assert [m.body for m in read_all(s, "A", 0)] == [m.body for m in sent]


def test_a_stray_next_file_is_deleted_at_start(stores) -> None:
    s = stores.open()
    sent = [Message("S", body_for(i, 500)) for i in range(200)]  # into the second segment
    assert all(r.status == PutStatus.PUT_OK for r in s.put_batch(sent))
    s.shutdown()
    cl_dir = s.commitlog.files.dir
    stray = cl_dir / f"{2 * SEG:020d}.next"  # as left by a crash while preparing
    stray.write_bytes(b"\x07" * 4096)
    s2 = stores.open(s.config)
    # the store's flush thread may prepare its own next segment under that name at once
    assert not stray.exists() or not stray.read_bytes().startswith(b"\x07" * 4096)
    assert [m.body for m in read_all(s2, "S", 0)] == [m.body for m in sent]
    more = fill_to_roll(s2, "S", 500)
    assert [m.body for m in read_all(s2, "S", 0)] == [m.body for m in sent + more]


def test_server_assigned_ids_are_the_offset_in_hex_on_every_put_path(stores) -> None:
    s = stores.open(flush=FlushMode.SYNC)
    prefix = s._id_prefix
    results = [s.put(Message("I", body_for(i, 700))) for i in range(120)]  # crosses 64 KiB steps
    results += s.put_batch([Message("I", body_for(i, 3000)) for i in range(60)])
    results += s.put_batch([Message("I", body_for(i, 100), tag="t") for i in range(10)])

    async def many():
        return await asyncio.gather(*(s.put_async(Message("I", body_for(i, 1500))) for i in range(80)))

    results += asyncio.run(many())
    assert all(r.status == PutStatus.PUT_OK for r in results)
    assert [r.message_id for r in results] == [f"{prefix}{r.commitlog_offset:016X}" for r in results]
    for r in results[::17]:
        assert s.query_by_id(r.message_id).commitlog_offset == r.commitlog_offset


async def test_a_put_async_cancelled_before_its_group_is_written_is_not_stored(stores) -> None:
    s = stores.open(flush=FlushMode.SYNC)
    keep = [asyncio.ensure_future(s.put_async(Message("X", b"keep-%d" % i))) for i in range(5)]
    gone = asyncio.ensure_future(s.put_async(Message("X", b"gone")))
    await asyncio.sleep(0)  # every put is queued; the group is written at the end of this iteration
    gone.cancel()
    results = await asyncio.gather(*keep)
    assert all(r.status == PutStatus.PUT_OK for r in results)
    assert gone.cancelled()
    assert [m.body for m in read_all(s, "X", 0)] == [b"keep-%d" % i for i in range(5)]
    assert (await s.put_async(Message("X", b"after"))).status == PutStatus.PUT_OK
    assert [m.body for m in read_all(s, "X", 0)][-1] == b"after"


async def test_writers_of_a_group_get_their_results_when_one_is_cancelled_after_the_write(stores) -> None:
    import threading

    s = stores.open(flush=FlushMode.SYNC, commitlog_warmup="off")  # only the gated fdatasync covers puts
    assert s.put(Message("Y", b"before")).status == PutStatus.PUT_OK
    gate = threading.Event()
    real = s._flush._sync_commitlog

    def gated_sync() -> None:
        gate.wait(30)
        real()

    s._flush._sync_commitlog = gated_sync
    futs = [asyncio.ensure_future(s.put_async(Message("Y", b"w-%d" % i))) for i in range(6)]
    await asyncio.sleep(0)  # queued
    await asyncio.sleep(0)  # the group is written (end of the previous iteration); the flush is held
    assert wait_until(lambda: s.commitlog.write_pos > 0 and s.max_offset("Y", 0) == 7)
    futs[2].cancel()
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(*(f for i, f in enumerate(futs) if i != 2)), 30)
    assert all(r.status == PutStatus.PUT_OK for r in results)
    assert s._flush.flushed >= max(r.commitlog_offset + r.store_size for r in results)
    assert futs[2].cancelled()
    # written before the cancel, so stored: the writer just did not wait for its answer
    assert [m.body for m in read_all(s, "Y", 0)] == [b"before"] + [b"w-%d" % i for i in range(6)]
