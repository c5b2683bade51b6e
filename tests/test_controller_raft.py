"""The controller on pysyncobj: three real Raft nodes over 127.0.0.1 TCP in one test process
(separate processes and SIGKILL come with the controller server)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from core_broker.errors import StaleEpochError
from nameserver.controller import NotLeaderError, RaftController
from nameserver.controller_state import GroupNotFoundError


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _nodes(tmp: Path, addrs: list[str], lease_ms: int = 1500) -> list[RaftController]:
    return [RaftController(str(tmp / f"n{i}"), a, addrs, secret="s3cret", lease_ms=lease_ms) for i, a in enumerate(addrs)]


async def _leader(nodes: list[RaftController]) -> RaftController:
    for _ in range(200):
        leaders = [n for n in nodes if n.is_leader()]
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no leader elected")


async def _stop(nodes: list[RaftController]) -> None:
    for n in nodes:
        await n.stop()


@pytest.mark.timeout(90)
async def test_three_nodes_register_cas_elect_and_full_restart(tmp_path: Path) -> None:
    addrs = [f"127.0.0.1:{p}" for p in _free_ports(3)]
    nodes = _nodes(tmp_path, addrs)
    for n in nodes:
        await n.start()
    try:
        leader = await _leader(nodes)
        follower = next(n for n in nodes if n is not leader)
        with pytest.raises(NotLeaderError) as info:
            await follower.heartbeat("g", "a", "127.0.0.1:1", 0, 0)
        assert info.value.leader == leader.self_addr
        st = await leader.heartbeat("g", "a", "127.0.0.1:1", 0, 10)
        assert (st.master_id, st.master_epoch, st.in_sync) == ("a", 1, frozenset({"a"}))
        await leader.heartbeat("g", "b", "127.0.0.1:2", 0, 10)
        st = await leader.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b"}))
        assert st.in_sync_epoch == 2
        with pytest.raises(StaleEpochError):
            await leader.alter_in_sync("g", "a", 1, 1, frozenset({"a"}))
        # only b keeps beating: a's lease lapses and b (in sync) is elected
        for _ in range(100):
            st = await leader.heartbeat("g", "b", "127.0.0.1:2", 1, 20)
            if st.master_id == "b":
                break
            await asyncio.sleep(0.2)
        assert (st.master_id, st.master_epoch, st.in_sync) == ("b", 2, frozenset({"b"}))
    finally:
        await _stop(nodes)
    # every node down and up again: epochs and in-sync sets kept
    nodes = _nodes(tmp_path, addrs)
    for n in nodes:
        await n.start()
    try:
        leader = await _leader(nodes)
        want = ("b", 2, frozenset({"b"}), 3)
        for _ in range(100):  # the new leader applies the journal it replays
            try:
                st = await leader.group_state("g")
                if (st.master_id, st.master_epoch, st.in_sync, st.in_sync_epoch) == want:
                    break
            except GroupNotFoundError:
                pass
            await asyncio.sleep(0.1)
        assert (st.master_id, st.master_epoch, st.in_sync, st.in_sync_epoch) == ("b", 2, frozenset({"b"}), 3)
    finally:
        await _stop(nodes)


async def _beat_until(node: RaftController, pred, broker: str = "b"):  # type: ignore[no-untyped-def]
    st = None
    for _ in range(100):
        try:
            st = await node.heartbeat("g", broker, "127.0.0.1:2", 1, 50)
            if pred(st):
                return st
        except NotLeaderError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached: {st}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("unclean", [False, True])
async def test_lapsed_master_with_no_live_in_sync_member(tmp_path: Path, unclean: bool) -> None:
    (port,) = _free_ports(1)
    addr = f"127.0.0.1:{port}"
    node = RaftController(str(tmp_path), addr, [addr], secret="k", lease_ms=1000, allow_unclean_election=unclean)
    await node.start()
    try:
        await _beat_until(node, lambda s: s.master_id == "a", broker="a")
        await _beat_until(node, lambda s: "b" in s.members)  # b joins, never in sync
        st = await _beat_until(node, lambda s: s.master_epoch == 2)  # a silent: its lease lapses
        if unclean:
            assert (st.master_id, st.in_sync) == ("b", frozenset({"b"}))
        else:  # no master rather than data loss; the in-sync set (a) is kept
            assert (st.master_id, st.master_addr, st.in_sync) == (None, None, frozenset({"a"}))
    finally:
        await node.stop()
