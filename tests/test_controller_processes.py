"""Three controller processes on 127.0.0.1, reached through ControllerClient over the internal RPC;
the Raft leader killed with SIGKILL, then every node killed and restarted: state kept."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core_broker.errors import StaleEpochError
from nameserver.controller_client import ControllerClient, GroupState
from tests.test_controller_raft import _free_ports


def _spawn(tmp: Path, i: int, raft: list[str], rpc_port: int, unclean: bool = False) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "nameserver.controller_server", "--data-dir", str(tmp / f"c{i}"),
           "--port", str(rpc_port), "--raft-addr", raft[i], "--peers", ",".join(raft), "--secret", "t0p",
           "--lease-ms", "60000"]  # persistence only: no lease lapses here
    if unclean:
        cmd.append("--allow-unclean-election")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert re.search(r"listening on", line), line
    return p


async def _until(pred, what: str, tries: int = 150):  # type: ignore[no-untyped-def]
    last: object = None
    for _ in range(tries):
        try:
            last = await pred()
            if last:
                return last
        except Exception as e:  # noqa: BLE001  (leader moving: ask again)
            last = e
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: {last}")


@pytest.mark.timeout(120)
async def test_leader_sigkill_and_full_restart_keep_state(tmp_path: Path) -> None:
    ports = _free_ports(6)
    raft = [f"127.0.0.1:{p}" for p in ports[:3]]
    rpc = ports[3:]
    procs = [_spawn(tmp_path, i, raft, rpc[i]) for i in range(3)]
    client = ControllerClient([("127.0.0.1", p) for p in rpc], timeout_s=2.0)
    await client.start()
    try:
        st: GroupState = await _until(lambda: client.heartbeat("g", "a", "127.0.0.1:11", 0, 5), "first heartbeat")
        assert (st.master_id, st.master_epoch, st.in_sync) == ("a", 1, frozenset({"a"}))
        await client.heartbeat("g", "b", "127.0.0.1:12", 0, 5)
        st = await client.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b"}))
        assert st.in_sync_epoch == 2
        with pytest.raises(StaleEpochError):
            await client.alter_in_sync("g", "a", 1, 1, frozenset({"a"}))
        # SIGKILL the Raft leader (the node that answered)
        leader = procs[rpc.index(client.addresses[client._preferred][1])]
        leader.send_signal(signal.SIGKILL)
        leader.wait()

        async def served() -> GroupState | None:
            s = await client.group_state("g")
            return s if s.in_sync_epoch == 2 else None

        st = await _until(served, "new leader serves the state")
        assert (st.master_id, st.master_epoch, st.in_sync) == ("a", 1, frozenset({"a", "b"}))
        # everyone down, everyone up
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        procs = [_spawn(tmp_path, i, raft, rpc[i]) for i in range(3)]
        st = await _until(served, "state after full restart")
        assert (st.master_id, st.master_epoch, st.in_sync, st.in_sync_epoch) == ("a", 1, frozenset({"a", "b"}), 2)
    finally:
        await client.stop()
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
