"""A separated unimq deployment as real OS processes on 127.0.0.1.

One nameserver, N brokers and M gateways, each started with the documented
commands (`python -m unimq nameserver|broker|gateway`) on free ports and
each stopped by its own PID. The separated test suite and the benchmark use
it; it is also a quick way to try the separated shape on one machine.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
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
    #: The last lines the process printed (warnings and errors: it logs at warning level), kept
    #: so a failing fault test can say what each process was doing.
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=200))

    def tail(self, n: int = 40) -> str:
        return "".join(list(self.recent)[-n:])

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
        [sys.executable, "-m", "unimq", *args, "--log-level", "warning"],
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
            threading.Thread(target=proc.recent.extend, args=(popen.stdout,), daemon=True).start()
            return proc
    popen.kill()
    raise RuntimeError(f"{name} did not start:\n{''.join(lines)}")


def toml_value(v: object) -> str:
    import enum

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_toml(path: Path, top: dict, tables: dict[str, dict]) -> Path:
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (for listeners several processes share: port 0 cannot be shared)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Cluster:
    """``shared_mqtt_port``: every gateway serves MQTT on this one port (SO_REUSEPORT), each
    keeping its own free HTTP, gRPC and AMQP ports (so each one's /metrics can be read)."""

    def __init__(self, root: Path, brokers: int = 2, gateways: int = 2, lease_s: float = 120.0,
                 heartbeat_s: float = 30.0, extra_broker_args: list[str] | None = None,
                 broker_toml: Path | None = None, gateway_toml: Path | None = None,
                 cluster_secret: str | None = None, common_args: list[str] | None = None,
                 shared_mqtt_port: int | None = None) -> None:
        """``cluster_secret``: every process proves it on the internal RPC (written to a file under
        ``root``, passed as --cluster-secret-file); ``common_args`` go to every process."""
        self.root = root
        self.n_brokers = brokers
        self.n_gateways = gateways
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s
        self.extra_broker_args = extra_broker_args or []
        self.broker_toml = broker_toml
        self.gateway_toml = gateway_toml
        self.common_args = list(common_args or [])
        if cluster_secret is not None:
            secret_file = root / "cluster.secret"
            secret_file.write_text(cluster_secret)
            self.common_args += ["--cluster-secret-file", str(secret_file)]
        self.shared_mqtt_port = shared_mqtt_port
        self.nameserver: Proc | None = None
        self.brokers: dict[str, Proc] = {}
        self.gateways: list[Proc] = []

    @property
    def namesrv(self) -> str:
        assert self.nameserver is not None
        return f"127.0.0.1:{self.nameserver.ports['namesrv']}"

    def start(self) -> "Cluster":
        self.nameserver = start_proc("nameserver", ["nameserver", "--port", "0", "--lease-s", str(self.lease_s),
                                                     *self.common_args])
        # brokers and gateways start in parallel: each only needs the nameserver
        names = [f"broker-{chr(ord('a') + i)}" for i in range(self.n_brokers)]
        with ThreadPoolExecutor(self.n_brokers + self.n_gateways) as pool:
            brokers = [pool.submit(self._spawn_broker, n) for n in names]
            gateways = [pool.submit(self._spawn_gateway) for _ in range(self.n_gateways)]
            for n, f in zip(names, brokers):
                self.brokers[n] = f.result()
            self.gateways = [f.result() for f in gateways]
        return self

    def _spawn_broker(self, name: str) -> Proc:
        cfg = ["--config", str(self.broker_toml)] if self.broker_toml else []
        return start_proc(name, ["broker", *cfg, "--data-dir", str(self.root / name), "--port", "0",
                                 "--namesrv", self.namesrv, "--name", name, "--heartbeat-s", str(self.heartbeat_s),
                                 *self.extra_broker_args, *self.common_args])

    def _spawn_gateway(self, shared_mqtt_port: int | None = None) -> Proc:
        """A gateway on free ports; with ``shared_mqtt_port`` (or the cluster's) its MQTT port is
        that one, shared with SO_REUSEPORT (and no MQTT over WebSocket: only one port is shared)."""
        cfg = ["--config", str(self.gateway_toml)] if self.gateway_toml else []
        shared = shared_mqtt_port if shared_mqtt_port is not None else self.shared_mqtt_port
        if shared is None:
            mqtt = ["--mqtt-port", "0"]
        else:
            mqtt = ["--mqtt-port", str(shared), "--mqtt-ws-port", "-1", "--reuse-port"]
        return start_proc("gateway", ["gateway", *cfg, "--namesrv", self.namesrv, "--rpc-port", "0",
                                      "--http-port", "0", *mqtt, "--amqp-port", "0", "--grpc-port", "0",
                                      *self.common_args])

    def start_broker(self, name: str) -> Proc:
        p = self._spawn_broker(name)
        self.brokers[name] = p
        return p

    def kill9(self) -> None:
        """Every process dies at once, as in a power cut of the whole cluster."""
        for p in [*self.gateways, *self.brokers.values(), self.nameserver]:
            if p is not None:
                p.kill9()

    def restart_gateways(self) -> None:
        """Every gateway stopped (SIGTERM) and as many started again, as after a rolling update
        of a fleet's gateways done at once: their devices reconnect to the new ones."""
        n = len(self.gateways)
        for g in self.gateways:
            g.stop()
        with ThreadPoolExecutor(n) as pool:
            self.gateways = list(pool.map(lambda _: self._spawn_gateway(), range(n)))

    def gateway_rpc(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", g.ports["rpc"]) for g in self.gateways]

    def stop(self) -> None:
        for g in self.gateways:
            g.stop()
        for b in self.brokers.values():
            b.stop()
        if self.nameserver is not None:
            self.nameserver.stop()
