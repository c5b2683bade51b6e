"""DurabilityPolicy: when a put may be acknowledged, with and without replicas.

The local flush is a coroutine the test provides and the replica condition a
recording implementation of the ``ReplicaCondition`` protocol, so the order
of the three steps (replicas told, local flush awaited, replicas awaited) is
visible. The last test installs a condition on a real sync-flush store and
checks the replicas are awaited only after the local fdatasync.
"""

from __future__ import annotations

import asyncio

import pytest

from core_broker.config import FlushMode
from core_broker.durability import DurabilityPolicy, ReplicaCondition
from core_broker.errors import NotEnoughInSyncReplicasError, NotMasterError
from core_broker.model import Message
from store_helpers import make_config, stores  # noqa: F401  (stores is a fixture)

pytestmark = pytest.mark.timeout(30)


class Steps:
    """Records each step of a wait, in order; each await can be held open by the test."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.flush_gate: asyncio.Event | None = None
        self.replica_gate: asyncio.Event | None = None
        self.refuse: BaseException | None = None
        self.flush_error: BaseException | None = None

    async def flush_wait(self, end: int) -> None:
        self.log.append(("flush", end))
        if self.flush_gate is not None:
            await self.flush_gate.wait()
        if self.flush_error is not None:
            raise self.flush_error
        self.log.append(("flushed", end))


class RecordingReplicas:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def check_writable(self) -> None:
        self.steps.log.append(("check", 0))
        if self.steps.refuse is not None:
            raise self.steps.refuse

    def written(self, end_offset: int) -> None:
        self.steps.log.append(("written", end_offset))

    async def wait(self, end_offset: int) -> None:
        self.steps.log.append(("replicas", end_offset))
        if self.steps.replica_gate is not None:
            await self.steps.replica_gate.wait()
        self.steps.log.append(("replicated", end_offset))


def policy(sync: bool, replicas: bool) -> tuple[DurabilityPolicy, Steps]:
    steps = Steps()
    p = DurabilityPolicy(sync, steps.flush_wait)
    if replicas:
        cond: ReplicaCondition = RecordingReplicas(steps)
        p.set_replica_condition(cond)
    return p, steps


@pytest.mark.parametrize(
    "sync, replicas, waits",
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_waits_only_when_an_acknowledgement_needs_something_after_the_write(sync: bool, replicas: bool,
                                                                               waits: bool) -> None:
    p, _ = policy(sync, replicas)
    assert p.waits is waits


async def test_async_flush_without_replicas_acknowledges_at_once() -> None:
    p, steps = policy(False, False)
    await p.wait(100)
    assert steps.log == []
    p.check_writable()  # nothing can refuse a write


async def test_sync_flush_without_replicas_waits_for_the_flush_of_that_offset() -> None:
    p, steps = policy(True, False)
    steps.flush_gate = asyncio.Event()
    w = asyncio.create_task(p.wait(4096))
    await asyncio.sleep(0)
    assert steps.log == [("flush", 4096)]
    assert not w.done()
    steps.flush_gate.set()
    await asyncio.wait_for(w, 5)
    assert steps.log == [("flush", 4096), ("flushed", 4096)]


async def test_with_replicas_they_are_told_first_then_the_local_flush_then_their_acks() -> None:
    p, steps = policy(True, True)
    steps.flush_gate = asyncio.Event()
    steps.replica_gate = asyncio.Event()
    w = asyncio.create_task(p.wait(800))
    await asyncio.sleep(0)
    # replicas start copying before the master's own fdatasync is done
    assert steps.log == [("written", 800), ("flush", 800)]
    steps.flush_gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert steps.log[-1] == ("replicas", 800)
    assert not w.done(), "acknowledged before enough replicas hold the record"
    steps.replica_gate.set()
    await asyncio.wait_for(w, 5)
    assert steps.log == [("written", 800), ("flush", 800), ("flushed", 800), ("replicas", 800), ("replicated", 800)]


async def test_with_replicas_under_async_flush_there_is_no_local_flush_wait() -> None:
    p, steps = policy(False, True)
    await p.wait(64)
    assert steps.log == [("written", 64), ("replicas", 64), ("replicated", 64)]


async def test_a_failed_local_flush_is_not_acknowledged_by_the_replicas() -> None:
    p, steps = policy(True, True)
    steps.flush_error = OSError("EIO")
    with pytest.raises(OSError, match="EIO"):
        await p.wait(10)
    assert ("replicas", 10) not in steps.log


@pytest.mark.parametrize("error", [NotMasterError("not master"), NotEnoughInSyncReplicasError("1 of 2")])
def test_check_writable_raises_what_the_replica_condition_raises(error: Exception) -> None:
    p, steps = policy(True, True)
    p.check_writable()
    steps.refuse = error
    with pytest.raises(type(error)):
        p.check_writable()
    assert steps.log == [("check", 0), ("check", 0)]


async def test_removing_the_replica_condition_goes_back_to_local_durability() -> None:
    p, steps = policy(False, True)
    steps.refuse = NotMasterError("deposed")
    p.set_replica_condition(None)
    assert p.waits is False
    p.check_writable()
    await p.wait(5)
    assert steps.log == []


async def test_a_stores_replicas_are_awaited_only_after_its_own_fdatasync(stores) -> None:  # noqa: F811
    s = stores.open(flush=FlushMode.SYNC)
    seen: list[tuple[str, int, int]] = []

    class Replicas:
        def check_writable(self) -> None:
            pass

        def written(self, end_offset: int) -> None:
            seen.append(("written", end_offset, s.flushed_pos()))

        async def wait(self, end_offset: int) -> None:
            seen.append(("wait", end_offset, s.flushed_pos()))

    s.durability.set_replica_condition(Replicas())
    r = s.put_nowait(Message("d", b"payload"))
    end = r.commitlog_offset + r.store_size
    await asyncio.wait_for(s.wait_durable(r), 10)
    assert [(k, e) for k, e, _ in seen] == [("written", end), ("wait", end)]
    assert seen[1][2] >= end  # the local fdatasync covered the record before the replicas were awaited


async def test_a_merged_single_send_waits_again_once_a_replica_condition_is_installed(tmp_path) -> None:
    """The processor's short single send (gateway/send_now.py) applies only while nothing needs
    waiting: with a replica condition installed, the next send is checked, told and awaited."""
    from core_broker.config import BrokerConfig
    from gateway.context import RequestContext
    from gateway.deployment import merged_processor

    p = merged_processor(make_config(tmp_path), BrokerConfig())
    await p.start()
    try:
        ctx = RequestContext("test")
        for i in range(3):  # the first send plans the topic; the next ones take the short path
            await p.send(ctx, [Message("d", b"%d" % i)])
        steps = Steps()
        p.broker.broker.durability.set_replica_condition(RecordingReplicas(steps))  # type: ignore[attr-defined]
        [r] = await asyncio.wait_for(p.send(ctx, [Message("d", b"replicated")]), 10)
        assert [k for k, _ in steps.log] == ["check", "written", "replicas", "replicated"]
        assert steps.log[1][1] == steps.log[2][1] > 0 and r.message_id  # that record's end, awaited
        steps.refuse = NotMasterError("deposed")
        with pytest.raises(NotMasterError):
            await p.send(ctx, [Message("d", b"refused")])
        p.broker.broker.durability.set_replica_condition(None)  # type: ignore[attr-defined]
        await p.send(ctx, [Message("d", b"local again")])
        assert p.metrics.get("messages_in", "test") == 5  # counted on either path; not the refused one
        assert [k for k, _ in steps.log] == ["check", "written", "replicas", "replicated", "check"]
    finally:
        await p.stop()
