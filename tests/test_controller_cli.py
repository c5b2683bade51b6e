"""`unimq controller` and `unimq nameserver --controller` as real processes, `unimq cluster status`."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nameserver.controller_client import ControllerClient
from tests.test_controller_raft import _free_ports

UNIMQ = str(Path(sys.executable).parent / "unimq")


def _start(args: list[str]) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen([UNIMQ, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    while True:
        line = p.stdout.readline()
        assert line, "exited before listening"
        m = re.search(r"controller listening on [\d.]+:(\d+)", line)
        if m:
            return p, int(m.group(1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("embedded", [False, True])
async def test_single_node_controller_and_cluster_status(tmp_path: Path, embedded: bool) -> None:
    (raft,) = _free_ports(1)
    args = ["--controller-port", "0", "--data-dir", str(tmp_path), "--raft-addr", f"127.0.0.1:{raft}",
            "--secret", "x"]
    args = ["nameserver", "--port", "0", "--controller", *args] if embedded else ["controller", *args]
    proc, port = _start(args)
    try:
        client = ControllerClient([("127.0.0.1", port)])
        await client.start()
        for _ in range(100):
            try:
                st = await client.heartbeat("g1", "b0", "127.0.0.1:7001", 0, 42)
                break
            except Exception:  # noqa: BLE001  (the single node elects itself first)
                await asyncio.sleep(0.1)
        assert (st.master_id, st.master_epoch) == ("b0", 1)
        await client.stop()
        out = await asyncio.to_thread(
            subprocess.run, [UNIMQ, "cluster", "status", "--controller", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "group g1: master b0 at 127.0.0.1:7001 epoch 1; in-sync b0 (epoch 1)" in out.stdout
        assert "b0 127.0.0.1:7001 master offset 42 lag 0" in out.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
