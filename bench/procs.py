"""The processes a benchmark runs and watches: `unimq up` as a child, ports, CPU and RSS.

Every broker a section compares (unimq and its peers) runs as a child process
in a session of its own, so it is stopped as a process group (a broker's own
helpers go with it) and its CPU time is read from ``/proc`` beside the load
generator's. Shared by the MQTT and AMQP sections (and the HTTP one's CPU
reading), which measure the same way.
"""

from __future__ import annotations

import glob
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for peers that cannot be given port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far; NaN once it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def group_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes and every process in their process groups."""
    tick = os.sysconf("SC_CLK_TCK")
    groups = set()
    for p in pids:
        try:
            groups.add(os.getpgid(p))
        except OSError:
            pass
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def rss_mib(pid: int) -> float:
    """Resident set size (VmRSS) in MiB; NaN when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def stop_group(proc: subprocess.Popen[Any], wait_s: float = 60.0) -> None:
    """SIGTERM a child's process group (it was started in a session of its own), SIGKILL if slow."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class UnimqChild:
    """`unimq up` as a child process on ephemeral ports; ``port`` is the port of ``door``
    (``ports`` has every door's).

    ``config`` (TOML text), when given, is written beside the data dir and passed
    with ``--config``. Returns from the constructor once the server printed ready.
    """

    def __init__(self, base: Path, door: str, flush: str = "async", config: str | None = None,
                 host: str = "127.0.0.1") -> None:
        cmd = [sys.executable, "-m", "unimq"]
        cmd += ["up", "--data-dir", str(base / "data"), "--host", host, "--flush", flush, "--log-level", "warning"]
        for flag in ("--mqtt-port", "--amqp-port", "--http-port", "--grpc-port", "--namesrv-port"):
            cmd += [flag, "0"]
        if config is not None:
            cfg = base / "unimq.toml"
            cfg.write_text(config)
            cmd += ["--config", str(cfg)]
        listen = re.compile(r"^unimq: (\w+) listening on \S+:(\d+)$")
        self.log = base / "unimq.err"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                         text=True, start_new_session=True)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line.strip())
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.port = 0
        self.ports: dict[str, int] = {}  # every door's port, by the name it printed
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"unimq exited: {self.log.read_text()[-2000:]}")
            m = listen.match(line)
            if m:
                self.ports[m[1]] = int(m[2])
                if m[1] == door:
                    self.port = int(m[2])
            if line == "unimq: ready":
                return
        self.stop()
        raise RuntimeError("unimq did not get ready in 60 s")

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        stop_group(self.proc)
