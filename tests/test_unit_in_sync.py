"""InSyncTracker: the master's view of its replicas, without a network or a controller.

Replicas' fetch reports are calls to ``report``; lag in time is made by moving
a replica's ``caught_up_at`` / ``reported_at`` into the past rather than by
sleeping. What is checked: who counts for an acknowledgement, when a put's
wait is released or fails, when writes are refused, and which in-sync set
the master would propose.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from core_broker.errors import NotEnoughInSyncReplicasError, NotMasterError, ReplicaAckTimeoutError
from core_broker.replication.in_sync import InSyncTracker, ReplicaProgress

pytestmark = pytest.mark.timeout(30)

MASTER = "m"


def tracker(min_insync: int = 2, *, sync_flush: bool = False, lag_max_ms: int = 5_000, lag_max_bytes: int = 1_000,
            ack_timeout_s: float = 30.0, async_replicas: frozenset[str] = frozenset(),
            in_sync: frozenset[str] = frozenset({MASTER, "r1", "r2"})) -> InSyncTracker:
    t = InSyncTracker(MASTER, min_insync, lag_max_ms, lag_max_bytes, sync_flush, ack_timeout_s, async_replicas)
    t.start_term(in_sync, epoch=1)
    return t


# --------------------------------------------------------------------------- progress


def test_lag_in_time_is_zero_while_caught_up_and_counts_from_the_last_catch_up() -> None:
    p = ReplicaProgress("r1", caught_up_at=100.0)
    assert p.lag_ms(105.0) == 0  # no bytes behind: no lag, however long ago
    p.lag_bytes = 10
    assert p.lag_ms(102.5) == 2500


def test_a_report_records_how_far_behind_the_masters_log_a_replica_is() -> None:
    t = tracker()
    t.report("r1", written=700, flushed=600, master_end=1000)
    p = t.progress["r1"]
    assert (p.written, p.flushed, p.lag_bytes) == (700, 600, 300)
    before = p.caught_up_at
    t.report("r1", written=1000, flushed=1000, master_end=1000)
    assert p.lag_bytes == 0 and p.caught_up_at >= before
    t.report("r1", written=1200, flushed=1200, master_end=1000)  # never negative
    assert p.lag_bytes == 0


def test_start_term_gives_every_in_sync_member_a_fresh_progress_and_makes_the_broker_writable() -> None:
    t = InSyncTracker(MASTER, 2, 5000, 1000, False, 30.0)
    t.writable = False
    t.report("old", written=5, flushed=5, master_end=5)
    t.start_term(frozenset({"r1", "r2"}), epoch=7)
    assert t.in_sync == {MASTER, "r1", "r2"}  # the master itself is always in the set
    assert t.in_sync_epoch == 7
    assert set(t.progress) == {"r1", "r2"}
    assert t.writable


# --------------------------------------------------------------------------- who counts for an ack


def test_acked_end_with_the_master_alone_needed_is_unbounded() -> None:
    t = tracker(min_insync=1)
    assert t.acked_end() >= 1 << 62


def test_acked_end_is_what_every_in_sync_replica_holds() -> None:
    t = tracker(min_insync=3)
    assert t.acked_end() == 0  # both replicas reported nothing yet
    t.report("r1", written=500, flushed=400, master_end=900)
    t.report("r2", written=300, flushed=300, master_end=900)
    assert t.acked_end() == 300
    # min_insync_replicas is the floor on the set's size, not how many must hold a put: the
    # controller may elect any member of the set, so every member must hold what was acked
    # (the fastest one alone lost acknowledged messages in tests/test_jepsen_replication.py)
    t2 = tracker(min_insync=2)
    t2.report("r1", written=500, flushed=400, master_end=900)
    t2.report("r2", written=300, flushed=300, master_end=900)
    assert t2.acked_end() == 300
    t2.set_in_sync(frozenset({MASTER, "r1"}), epoch=2)  # the controller took r2 out of the set
    assert t2.acked_end() == 500


def test_a_member_new_to_the_set_counts_once_it_reports() -> None:
    t = tracker(min_insync=2, in_sync=frozenset({MASTER, "r1"}))
    t.report("r1", written=500, flushed=500, master_end=500)
    t.set_in_sync(frozenset({MASTER, "r1", "r2"}), epoch=2)
    assert t.acked_end() == -1  # r2 is in the set and holds nothing this master knows of
    t.report("r2", written=450, flushed=450, master_end=500)
    assert t.acked_end() == 450


def test_under_sync_flush_only_what_a_replica_fdatasynced_counts() -> None:
    t = tracker(min_insync=2, sync_flush=True, in_sync=frozenset({MASTER, "r1"}))
    t.report("r1", written=500, flushed=200, master_end=500)
    assert t.acked_end() == 200


def test_replicas_outside_the_in_sync_set_and_async_replicas_do_not_count() -> None:
    t = tracker(min_insync=2, async_replicas=frozenset({"dr"}), in_sync=frozenset({MASTER, "r1", "dr"}))
    t.report("dr", written=900, flushed=900, master_end=900)  # a disaster-recovery copy
    t.report("r2", written=900, flushed=900, master_end=900)  # not in sync
    assert t.acked_end() == 0  # only r1 counts, and it has nothing yet
    t.progress.pop("r1")
    assert t.acked_end() == -1  # nobody who counts has reported


# --------------------------------------------------------------------------- refusing writes


def test_check_writable_refuses_with_fewer_in_sync_members_than_needed() -> None:
    t = tracker(min_insync=2, in_sync=frozenset({MASTER}))
    with pytest.raises(NotEnoughInSyncReplicasError, match="only 1 of the 2"):
        t.check_writable()
    t.set_in_sync(frozenset({MASTER, "r1"}), epoch=2)
    t.check_writable()


def test_async_replicas_do_not_make_a_group_writable() -> None:
    t = tracker(min_insync=2, async_replicas=frozenset({"dr"}), in_sync=frozenset({MASTER, "dr"}))
    with pytest.raises(NotEnoughInSyncReplicasError):
        t.check_writable()


def test_a_broker_that_is_not_master_refuses_every_write() -> None:
    t = tracker(min_insync=1)
    t.writable = False
    with pytest.raises(NotMasterError):
        t.check_writable()


# --------------------------------------------------------------------------- waiting for acks


async def test_wait_returns_at_once_when_every_in_sync_replica_already_holds_the_offset() -> None:
    t = tracker()
    t.report("r1", written=100, flushed=100, master_end=100)
    t.report("r2", written=100, flushed=100, master_end=100)
    await asyncio.wait_for(t.wait(100), 1)
    await asyncio.wait_for(tracker(min_insync=1).wait(10**12), 1)


async def test_waits_are_released_in_offset_order_as_replicas_report() -> None:
    t = tracker()
    waits = {end: asyncio.create_task(t.wait(end)) for end in (300, 100, 200)}
    await asyncio.sleep(0)
    t.report("r2", written=300, flushed=300, master_end=300)
    await asyncio.sleep(0)
    assert not any(w.done() for w in waits.values())  # r1 holds none of them yet
    t.report("r1", written=250, flushed=250, master_end=300)
    await asyncio.sleep(0)
    assert waits[100].done() and waits[200].done()
    assert not waits[300].done()
    t.report("r1", written=300, flushed=300, master_end=300)
    await asyncio.wait_for(waits[300], 5)


async def test_under_sync_flush_a_written_but_not_fdatasynced_offset_is_not_acked() -> None:
    t = tracker(sync_flush=True, in_sync=frozenset({MASTER, "r1"}))
    w = asyncio.create_task(t.wait(100))
    await asyncio.sleep(0)
    t.report("r1", written=100, flushed=50, master_end=100)
    await asyncio.sleep(0)
    assert not w.done()
    t.report("r1", written=100, flushed=100, master_end=100)
    await asyncio.wait_for(w, 5)


async def test_a_replica_joining_the_in_sync_set_releases_what_it_already_holds() -> None:
    t = tracker(min_insync=2, in_sync=frozenset({MASTER}))
    t.report("r2", written=500, flushed=500, master_end=500)  # holds it, but is not in sync
    w = asyncio.create_task(t.wait(500))
    await asyncio.sleep(0)
    assert not w.done()
    t.set_in_sync(frozenset({MASTER, "r2"}), epoch=2)
    await asyncio.wait_for(w, 5)


async def test_a_lagging_replica_leaving_the_in_sync_set_releases_what_the_rest_hold() -> None:
    t = tracker()
    t.report("r1", written=500, flushed=500, master_end=500)
    w = asyncio.create_task(t.wait(500))
    await asyncio.sleep(0)
    assert not w.done()  # r2 is in the set and silent
    t.set_in_sync(frozenset({MASTER, "r1"}), epoch=2)  # the controller agreed to drop it
    await asyncio.wait_for(w, 5)


def test_an_older_in_sync_set_is_ignored() -> None:
    t = tracker()
    t.set_in_sync(frozenset({MASTER, "r1"}), epoch=5)
    t.set_in_sync(frozenset({MASTER, "r1", "r2"}), epoch=4)  # a late answer to an old proposal
    assert t.in_sync == {MASTER, "r1"} and t.in_sync_epoch == 5
    t.set_in_sync(frozenset({MASTER}), epoch=5)  # the same epoch is the controller's word too
    assert t.in_sync == {MASTER}


async def test_a_put_not_acked_within_the_timeout_fails_retriably() -> None:
    t = tracker(ack_timeout_s=0.2)
    with pytest.raises(ReplicaAckTimeoutError) as e:
        await asyncio.wait_for(t.wait(100), 10)
    assert isinstance(e.value, NotEnoughInSyncReplicasError)  # clients retry it like a refused write
    assert t._waiters == []


async def test_the_timeout_fails_only_the_expired_waits() -> None:
    t = tracker(ack_timeout_s=0.2, in_sync=frozenset({MASTER, "r1"}))
    old = asyncio.create_task(t.wait(100))
    await asyncio.sleep(0)
    t.ack_timeout_s = 30.0  # a later put gets a deadline far away
    young = asyncio.create_task(t.wait(200))
    with pytest.raises(ReplicaAckTimeoutError):
        await asyncio.wait_for(old, 10)
    assert not young.done()
    t.report("r1", written=200, flushed=200, master_end=200)
    await asyncio.wait_for(young, 5)


async def test_fail_waiters_fails_every_pending_put_with_the_given_error() -> None:
    t = tracker()
    waits = [asyncio.create_task(t.wait(end)) for end in (1, 2, 3)]
    await asyncio.sleep(0)
    t.fail_waiters(NotMasterError("deposed"))
    for w in waits:
        with pytest.raises(NotMasterError):
            await asyncio.wait_for(w, 5)
    t.report("r1", written=10, flushed=10, master_end=10)  # nothing left to release


# --------------------------------------------------------------------------- proposing in-sync sets


MEMBERS = frozenset({MASTER, "r1", "r2"})


def caught_up(t: InSyncTracker, *ids: str, end: int = 1000) -> None:
    for b in ids:
        t.report(b, written=end, flushed=end, master_end=end)


def test_no_proposal_while_every_replica_keeps_up() -> None:
    t = tracker()
    caught_up(t, "r1", "r2")
    assert t.proposal(MEMBERS, master_end=1000) is None


def test_a_replica_too_many_bytes_behind_leaves() -> None:
    t = tracker(lag_max_bytes=1_000)
    caught_up(t, "r1")
    t.report("r2", written=0, flushed=0, master_end=1_001)
    assert t.proposal(MEMBERS, master_end=1_001) == {MASTER, "r1"}


def test_a_replica_within_the_byte_limit_stays_until_it_lags_too_long() -> None:
    t = tracker(lag_max_ms=5_000, lag_max_bytes=1_000)
    caught_up(t, "r1")
    t.report("r2", written=900, flushed=900, master_end=1000)
    assert t.proposal(MEMBERS, master_end=1000) is None  # 100 bytes behind, just now
    t.progress["r2"].caught_up_at = time.monotonic() - 6  # last held everything 6 s ago
    assert t.proposal(MEMBERS, master_end=1000) == {MASTER, "r1"}


def test_a_silent_replica_leaves_even_if_it_was_caught_up() -> None:
    t = tracker(lag_max_ms=5_000)
    caught_up(t, "r1", "r2")
    t.progress["r2"].reported_at = time.monotonic() - 6  # no fetch for 6 s: dead or cut off
    assert t.proposal(MEMBERS, master_end=1000) == {MASTER, "r1"}


def test_a_replica_that_caught_up_with_the_master_rejoins() -> None:
    t = tracker(in_sync=frozenset({MASTER, "r1"}))
    caught_up(t, "r1")
    t.report("r2", written=800, flushed=800, master_end=1000)
    assert t.proposal(MEMBERS, master_end=1000) is None  # still behind
    caught_up(t, "r2")
    assert t.proposal(MEMBERS, master_end=1000) == MEMBERS
    assert t.proposal(MEMBERS, master_end=1200) is None  # the master wrote more meanwhile: not yet


def test_under_sync_flush_a_replica_rejoins_only_once_it_fdatasynced_everything() -> None:
    t = tracker(sync_flush=True, in_sync=frozenset({MASTER, "r1"}))
    caught_up(t, "r1")
    t.report("r2", written=1000, flushed=900, master_end=1000)
    assert t.proposal(MEMBERS, master_end=1000) is None
    t.report("r2", written=1000, flushed=1000, master_end=1000)
    assert t.proposal(MEMBERS, master_end=1000) == MEMBERS


def test_a_member_that_never_reported_keeps_its_place() -> None:
    t = tracker(in_sync=frozenset({MASTER, "r1"}))
    t.progress.clear()
    assert t.proposal(MEMBERS | {"r3"}, master_end=1000) is None


def test_an_async_replica_is_never_proposed_in_sync() -> None:
    t = tracker(async_replicas=frozenset({"dr"}), in_sync=frozenset({MASTER, "r1", "dr"}))
    caught_up(t, "r1", "dr")
    assert t.proposal(frozenset({MASTER, "r1", "dr"}), master_end=1000) == {MASTER, "r1"}


# --------------------------------------------------------------------------- keeping pace (Kafka's rule)


def test_a_replica_that_keeps_pace_with_steady_writes_stays_in_sync() -> None:
    """Every report finds the master further on (it wrote meanwhile), but the replica holds what
    the master had when it answered the previous fetch: it keeps pace, long past lag_max_ms."""
    t = tracker(lag_max_ms=1000, lag_max_bytes=10_000)
    end = 1000
    t.report("r1", written=end, flushed=end, master_end=end)
    t.report("r2", written=end, flushed=end, master_end=end)
    for _ in range(5):
        for r in ("r1", "r2"):
            t.progress[r].caught_up_at -= 2.0  # a long while since the last report
            t.report(r, written=end, flushed=end, master_end=end + 100)  # 100 bytes came meanwhile
            assert t.progress[r].lag_bytes == 100
        end += 100
    assert t.proposal(frozenset({MASTER, "r1", "r2"}), end) is None  # both stay


def test_a_replica_that_falls_behind_the_previous_answer_leaves() -> None:
    t = tracker(lag_max_ms=1000, lag_max_bytes=10_000)
    t.report("r1", written=1000, flushed=1000, master_end=1000)
    t.report("r2", written=1000, flushed=1000, master_end=1000)
    t.report("r2", written=1000, flushed=1000, master_end=3000)
    t.report("r2", written=2000, flushed=2000, master_end=5000)  # has not reached 3000
    t.progress["r2"].caught_up_at -= 2.0
    t.report("r1", written=1000, flushed=1000, master_end=1000)
    assert t.proposal(frozenset({MASTER, "r1", "r2"}), 5000) == {MASTER, "r1"}


def test_a_replica_rejoins_under_steady_writes_once_it_holds_what_was_acknowledged() -> None:
    t = tracker(lag_max_ms=1000, lag_max_bytes=10_000, in_sync=frozenset({MASTER, "r1"}))

    async def ack(end: int) -> None:
        await t.wait(end)

    t.report("r1", written=5000, flushed=5000, master_end=5000)
    asyncio.run(ack(5000))
    assert t.acked_high == 5000
    # r2 keeps pace with the master's answers but does not yet hold what was acknowledged
    t.report("r2", written=3000, flushed=3000, master_end=4000)
    t.report("r2", written=4000, flushed=4000, master_end=5100)
    assert t.proposal(frozenset({MASTER, "r1", "r2"}), 5100) is None
    # now it holds the acknowledged end (and the previous answer's), though never the master's end
    t.report("r2", written=5100, flushed=5100, master_end=5200)
    assert t.progress["r2"].lag_bytes == 100
    assert t.proposal(frozenset({MASTER, "r1", "r2"}), 5200) == {MASTER, "r1", "r2"}
