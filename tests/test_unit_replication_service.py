"""Unit tests of core_broker.replication.service.ReplicationService on real MessageStores.

Why: the service decides who may write (master vs replica) and what a replica
is told (``repl_hello`` / ``repl_fetch``); a replica copying from a non-master
would fork the log. Only ``controller.store`` is needed for these calls, so the
controller is a plain holder of a real store (module docstring: the service is
the store's ReplicaCondition).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import AsyncIterator

import pytest

from core_broker.errors import NotMasterError
from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker.replication.service import ReplicationConfig, ReplicationService
from core_broker.replication.tier_gate import ReplicaTierGate

from store_helpers import make_config

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def svc(tmp_path: Path) -> AsyncIterator[ReplicationService]:
    store = MessageStore(make_config(tmp_path / "m"))
    store.start()
    rs = ReplicationService(SimpleNamespace(store=store, tier=None), "b0", ReplicationConfig())  # type: ignore[arg-type]
    await rs.start()
    try:
        yield rs
    finally:
        await rs.stop()
        store.shutdown()


async def test_a_new_service_has_no_role_and_refuses_writes_and_replicas(svc: ReplicationService) -> None:
    assert svc.role == "none"
    with pytest.raises(NotMasterError):
        svc.check_writable()
    with pytest.raises(NotMasterError):
        svc.repl_hello("b1")
    with pytest.raises(NotMasterError):
        await svc.repl_fetch("b1", 0, 0, 0, 1 << 20, 0)
    with pytest.raises(NotMasterError):
        svc.repl_state()


async def test_become_master_records_epoch_and_allows_writes(svc: ReplicationService) -> None:
    assert await svc.become_master(1, frozenset({"b0"}), 1) is True
    assert svc.role == "master" and svc.epoch == 1 and svc.master_addr is None
    svc.check_writable()
    hello = svc.repl_hello("b1")
    assert hello["epochs"] == [[1, 0]]
    assert hello["end"] == svc.store.write_pos == 0
    assert hello["store_id"] == svc.store.store_id
    assert hello["segment_size"] == svc.store.commitlog.segment_size
    assert hello["min_offset"] == svc.store.commitlog.min_offset
    # the epoch history is durable
    saved = json.loads((svc.store.root / "epochs.json").read_text())
    assert [list(e) for e in saved["entries"]] == [[1, 0]]


async def test_become_master_again_same_epoch_is_no_change(svc: ReplicationService) -> None:
    assert await svc.become_master(3, frozenset({"b0"}), 1)
    assert await svc.become_master(3, frozenset({"b0", "b1"}), 2) is False
    assert svc.tracker.in_sync == frozenset({"b0", "b1"})  # only the in-sync set moves


async def test_new_epoch_starts_at_the_log_end(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0"}), 1)
    svc.store.put(Message("T", b"one"))
    end = svc.store.write_pos
    assert end > 0
    assert await svc.become_master(2, frozenset({"b0"}), 1) is True
    assert svc.repl_hello("b1")["epochs"] == [[1, 0], [2, end]]


async def test_a_master_never_becomes_a_replica_in_place(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0"}), 1)
    with pytest.raises(RuntimeError):
        await svc.become_replica(2, "127.0.0.1:1")
    assert svc.role == "master"


async def test_become_replica_refuses_writes_and_serving(svc: ReplicationService) -> None:
    # nothing listens on port 1: the copy loop just keeps retrying in the background
    await svc.become_replica(4, "127.0.0.1:1")
    assert svc.role == "replica" and svc.master_addr == "127.0.0.1:1" and svc.epoch == 4
    follower = svc._follower
    assert follower is not None
    with pytest.raises(NotMasterError):
        svc.check_writable()
    with pytest.raises(NotMasterError):
        svc.repl_hello("b1")
    with pytest.raises(NotMasterError):
        await svc.repl_fetch("b1", 0, 0, 0, 1024, 0)
    # same master again: nothing restarts; an older epoch never lowers ours
    await svc.become_replica(2, "127.0.0.1:1")
    assert svc._follower is follower and svc.epoch == 4
    # another master: a new copy loop
    await svc.become_replica(5, "127.0.0.1:2")
    assert svc._follower is not follower and svc.master_addr == "127.0.0.1:2" and svc.epoch == 5
    # a replica may be promoted
    assert await svc.become_master(6, frozenset({"b0"}), 1)
    assert svc._follower is None and svc.role == "master"
    svc.check_writable()


async def test_repl_fetch_returns_whole_records_and_reports_progress(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0", "b1"}), 1)
    for i in range(3):
        svc.store.put(Message("T", f"m{i}".encode()))
    end = svc.store.write_pos
    r = await svc.repl_fetch("b1", 0, 0, 0, 1 << 20, 0)
    assert r["start"] == 0 and r["end"] == end and len(r["data"]) == end
    assert r["epochs"] == [[1, 0]]
    assert r["data"] == svc.store.read_log(0, 1 << 20)[1]
    prog = {p.broker_id: p for p in svc.progress()}
    assert "b1" in prog
    # a small max_bytes still returns whole records only, never more than the log
    r2 = await svc.repl_fetch("b1", 0, 0, 0, 1, 0)
    assert 0 < len(r2["data"]) < end
    r3 = await svc.repl_fetch("b1", len(r2["data"]), len(r2["data"]), 0, 1 << 20, 0)
    assert r2["data"] + r3["data"] == r["data"]


async def test_repl_fetch_at_the_end_without_wait_returns_nothing(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0"}), 1)
    svc.store.put(Message("T", b"x"))
    end = svc.store.write_pos
    r = await svc.repl_fetch("b1", end, end, end, 1 << 20, 0)
    assert r["data"] == b"" and r["end"] == end


async def test_repl_fetch_long_poll_returns_when_data_arrives(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0"}), 1)
    end = svc.store.write_pos
    fetch = asyncio.create_task(svc.repl_fetch("b1", end, end, end, 1 << 20, 20_000))
    await asyncio.sleep(0.1)
    assert not fetch.done()  # waiting at the end of the log
    r = svc.store.put(Message("T", b"late"))
    svc.written(r.commitlog_offset + r.store_size)
    got = await asyncio.wait_for(fetch, 10)  # far below the 20 s poll: returned because data came
    assert got["start"] == end and len(got["data"]) == r.store_size


async def test_repl_fetch_long_poll_sees_unsignalled_writes(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0"}), 1)
    fetch = asyncio.create_task(svc.repl_fetch("b1", 0, 0, 0, 1 << 20, 20_000))
    await asyncio.sleep(0.1)
    svc.store.put(Message("T", b"quiet"))  # nobody calls written(): the periodic re-check finds it
    got = await asyncio.wait_for(fetch, 10)
    assert len(got["data"]) == svc.store.write_pos


async def test_stop_fails_puts_waiting_for_acknowledgement(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "m"))
    store.start()
    try:
        rs = ReplicationService(SimpleNamespace(store=store, tier=None),  # type: ignore[arg-type]
                                "b0", ReplicationConfig(min_insync_replicas=2, ack_timeout_ms=20_000))
        await rs.start()
        await rs.become_master(1, frozenset({"b0", "b1"}), 1)
        r = store.put(Message("T", b"x"))
        waiter = asyncio.create_task(rs.wait(r.commitlog_offset + r.store_size))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # b1 has not reported holding it
        await rs.stop()
        with pytest.raises(NotMasterError):
            await asyncio.wait_for(waiter, 10)
    finally:
        store.shutdown()


async def test_replica_report_acknowledges_waiting_put(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "m"))
    store.start()
    rs = ReplicationService(SimpleNamespace(store=store, tier=None),  # type: ignore[arg-type]
                            "b0", ReplicationConfig(min_insync_replicas=2, ack_timeout_ms=20_000))
    try:
        await rs.start()
        await rs.become_master(1, frozenset({"b0", "b1"}), 1)
        r = store.put(Message("T", b"x"))
        end = r.commitlog_offset + r.store_size
        waiter = asyncio.create_task(rs.wait(end))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await rs.repl_fetch("b1", end, end, end, 1 << 20, 0)  # b1 reports it holds everything
        await asyncio.wait_for(waiter, 10)
    finally:
        await rs.stop()
        store.shutdown()


# --------------------------------------------------------------------------- tier and replica retention


class _Confirmed:
    """The master's tier as retention sees it (TierService.may_delete): these bases are uploaded."""

    def __init__(self) -> None:
        self.bases: set[int] = set()

    def may_delete(self, segment) -> bool:  # type: ignore[no-untyped-def]
        return segment.base in self.bases


async def test_fetch_answers_say_how_far_the_masters_tier_holds_its_log(svc: ReplicationService) -> None:
    await svc.become_master(1, frozenset({"b0"}), 1)
    st = svc.store
    for i in range(300):  # several 64 KiB segments
        st.put(Message("T", b"x" * 900))
    files = list(st.commitlog.files.files)
    assert len(files) >= 4
    r = await svc.repl_fetch("b1", 0, 0, 0, 1 << 20, 0)
    assert r["tier_kept"] == 0  # no tier on this master: nothing may go from a replica for it
    tier = _Confirmed()
    svc.controller.tier = tier
    tier.bases = {files[0].base, files[1].base, files[3].base}  # the third not uploaded yet
    svc._tier_kept_at = -1e9
    r = await svc.repl_fetch("b1", 0, 0, 0, 1 << 20, 0)
    assert r["tier_kept"] == files[1].end  # only a contiguous run from the start counts


async def test_a_replicas_retention_deletes_only_what_its_masters_tier_holds(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "r", tier_enabled=True, tier_bucket="b", retention_hours=0.001))
    store.start()
    rs = ReplicationService(SimpleNamespace(store=store, tier=None), "b1", ReplicationConfig())  # type: ignore[arg-type]
    await rs.start()
    try:
        for _ in range(300):
            store.put(Message("T", b"y" * 900))
        files = list(store.commitlog.files.files)
        await rs.become_replica(1, "127.0.0.1:1")  # no master there: the copy loop just retries
        gate = store.tier
        assert isinstance(gate, ReplicaTierGate)
        assert store.run_retention(now=10**10) == 0  # its master said nothing yet: keep all
        gate.kept_below = files[1].end
        assert store.run_retention(now=10**10) == 2
        assert store.commitlog.min_offset == files[2].base
    finally:
        await rs.stop()
    rs2 = ReplicationService(SimpleNamespace(store=store, tier=None), "b1", ReplicationConfig())  # type: ignore[arg-type]
    await rs2.start()
    store.tier = ReplicaTierGate()
    await rs2.become_master(2, frozenset({"b1"}), 1)
    assert store.tier is None  # promoted: the broker's own tier service takes over
    await rs2.stop()
    store.shutdown()
