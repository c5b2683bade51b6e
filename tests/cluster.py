"""A separated unimq deployment as real OS processes on 127.0.0.1, for tests.

One nameserver, N brokers and M gateways, each started with the documented
commands (`python -m gateway.cli nameserver|broker|gateway`) on free ports,
each stopped by its own PID.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_LISTEN = re.compile(r"unimq: (\w+) listening on \[?([^\]]*)\]?:(\d+)")


@dataclass
class Proc:
    name: str
    args: list[str]
    popen: subprocess.Popen
    ports: dict[str, int] = field(default_factory=dict)

    def kill9(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.popen.returncode


def start_proc(name: str, args: list[str], timeout: float = 60.0) -> Proc:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    popen = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", *args, "--log-level", "warning"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    proc = Proc(name, args, popen)
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = popen.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        lines.append(line)
        m = _LISTEN.search(line)
        if m:
            proc.ports[m.group(1)] = int(m.group(3))
        if "unimq: ready" in line:
            # keep draining output so the child never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in popen.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc
    popen.kill()
    raise RuntimeError(f"{name} did not start:\n{''.join(lines)}")


class Cluster:
    def __init__(self, root: Path, brokers: int = 2, gateways: int = 2, lease_s: float = 120.0,
                 heartbeat_s: float = 30.0, extra_broker_args: list[str] | None = None) -> None:
        self.root = root
        self.n_brokers = brokers
        self.n_gateways = gateways
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s
        self.extra_broker_args = extra_broker_args or []
        self.nameserver: Proc | None = None
        self.brokers: dict[str, Proc] = {}
        self.gateways: list[Proc] = []

    @property
    def namesrv(self) -> str:
        assert self.nameserver is not None
        return f"127.0.0.1:{self.nameserver.ports['namesrv']}"

    def start(self) -> "Cluster":
        self.nameserver = start_proc("nameserver", ["nameserver", "--port", "0", "--lease-s", str(self.lease_s)])
        for i in range(self.n_brokers):
            self.start_broker(f"broker-{chr(ord('a') + i)}")
        for _ in range(self.n_gateways):
            self.gateways.append(
                start_proc("gateway", ["gateway", "--namesrv", self.namesrv, "--rpc-port", "0", "--http-port", "0",
                                       "--mqtt-port", "0", "--amqp-port", "0", "--grpc-port", "0"])
            )
        return self

    def start_broker(self, name: str) -> Proc:
        p = start_proc(name, ["broker", "--data-dir", str(self.root / name), "--port", "0", "--namesrv", self.namesrv,
                              "--name", name, "--heartbeat-s", str(self.heartbeat_s), *self.extra_broker_args])
        self.brokers[name] = p
        return p

    def gateway_rpc(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", g.ports["rpc"]) for g in self.gateways]

    def stop(self) -> None:
        for g in self.gateways:
            g.stop()
        for b in self.brokers.values():
            b.stop()
        if self.nameserver is not None:
            self.nameserver.stop()
