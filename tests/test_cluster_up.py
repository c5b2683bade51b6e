"""`unimq cluster up`: the documented replicated cluster on one machine starts, serves, reports its
groups and stops cleanly on Ctrl-C (SIGINT to the whole process group, as a terminal sends it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import TEST_STORE_ARGS

REPO = Path(__file__).resolve().parent.parent


def _cluster_up(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], list[str], threading.Event]:
    """`unimq cluster up` with one group and every door on a free port; its output lines, and an
    event set once it printed `unimq: ready`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "unimq", "cluster", "up", "--data-dir", str(tmp_path), "--groups", "1", *args,
         "--http-port", "0", "--grpc-port", "0", "--mqtt-port", "0", "--amqp-port", "0", *TEST_STORE_ARGS],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("unimq: ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines, ready


@pytest.mark.timeout(180)
def test_cluster_up_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    proc, lines, ready = _cluster_up(tmp_path, "--replicas", "3")
    try:
        assert ready.wait(120), "".join(lines[-30:])
        out = "".join(lines)
        http = int(re.search(r"unimq: http listening on 127\.0\.0\.1:(\d+)", out).group(1))  # type: ignore[union-attr]
        status_cmd = re.search(r"unimq: cluster status: (unimq cluster status --controller .+)", out).group(1)  # type: ignore[union-attr]
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", out)]
        assert len(pids) == 3 + 3 + 1  # nameservers with controllers, a group of 3, the gateway
        deadline = time.monotonic() + 60
        while True:  # the group gets a master, then the gateway routes to it
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{http}/v1/topics/tryit/messages", data=b"hi", method="POST")
                with urllib.request.urlopen(req, timeout=20) as r:
                    assert r.status == 200
                break
            except Exception:
                assert time.monotonic() < deadline, "no send succeeded"
                time.sleep(0.5)
        deadline = time.monotonic() + 60
        while True:
            st = subprocess.run([sys.executable, "-m", "unimq", *status_cmd.split()[1:]], cwd=REPO,
                                capture_output=True, text=True, timeout=30)
            if re.search(r"group g1: master b\d", st.stdout) and st.stdout.count(" in-sync ") >= 1:
                break
            assert time.monotonic() < deadline, st.stdout + st.stderr
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: every process of the group
        assert proc.wait(60) == 0, "".join(lines[-30:])
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_cluster_up_with_two_gateways_on_one_mqtt_port(tmp_path: Path) -> None:
    """`--gateways 2`: both gateways announce the same MQTT port (picked once, shared with
    SO_REUSEPORT) and a device's persistent session works through it; Ctrl-C stops everything."""
    from mqtt_fixtures import Paho

    proc, lines, ready = _cluster_up(tmp_path, "--replicas", "1", "--min-insync-replicas", "1", "--gateways", "2")
    try:
        assert ready.wait(120), "".join(lines[-30:])
        out = "".join(lines)
        gws = re.findall(r"unimq: gateway-\d \(pid (\d+)\): .*\bmqtt (\d+)", out)
        assert len(gws) == 2 and gws[0][1] == gws[1][1], out
        port = int(gws[0][1])
        sub = Paho(port, "up-dev-1", clean=False)
        sub.subscribe("up/dev-1/cmd", qos=1)
        deadline = time.monotonic() + 60
        while True:  # the group gets a master, then the gateways route to it
            pub = Paho(port, None)
            try:
                pub.publish("up/dev-1/cmd", b"on", qos=1)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "no publish succeeded"
            finally:
                pub.disconnect()
        assert sub.get(30).payload == b"on"
        sub.disconnect()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, "".join(lines[-30:])
        for pid, _ in gws:
            assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
