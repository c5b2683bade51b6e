"""Shared fixtures: free ports and a real `unimq up` process.

Why a subprocess: the CLI contract (stdout lines, ports, signals, exit code,
files left on disk) is what later doors and clients depend on, and only a
real process shows it. The factory reads stdout until ``unimq: ready`` with
a bounded timeout, so a hung start fails the test instead of the suite.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from spark_fixtures import spark  # noqa: F401 (one SparkSession per test process, see there)

REPO_ROOT = Path(__file__).resolve().parent.parent
LISTEN_LINE = re.compile(r"^unimq: (?P<door>\w+) listening on \[?(?P<host>[^\]]+?)\]?:(?P<port>\d+)$")
PORT_FLAGS = (
    "--mqtt-port", "--mqtt-ws-port", "--mqtt-tls-port", "--amqp-port", "--amqp-tls-port",
    "--http-port", "--grpc-port", "--namesrv-port", "--broker-port",
)
TEST_STORE_SIZES = {
    "store.commitlog_segment_size": 64 * 1024 * 1024,
    "store.cq_entries_per_file": 100_000,
    "store.index_slots": 65_536,
    "store.index_entries_per_file": 262_144,
}
# The same sizes as flags of `unimq broker` / `unimq cluster up`: a commitlog segment is
# fallocated at its full size (1 GiB by default), so a test's broker with the defaults holds
# 1-2 GiB of real blocks, and a run of the suite would need tens of GB of disk.
TEST_STORE_ARGS = [f"--set={k}={v}" for k, v in TEST_STORE_SIZES.items()]


@pytest.fixture(scope="module", autouse=True)
def _drop_module_temp_dirs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Remove what a test module left under pytest's base temp once it passed.

    Stores fallocate their segments, so the data dirs of module-scoped servers and clusters
    (``tmp_path_factory.mktemp``) are real gigabytes; pytest keeps every one of them until
    the session ends, and CI ran out of disk. ``tmp_path`` dirs of passed tests are removed
    by ``tmp_path_retention_policy = "failed"``; this does the same for the factory's dirs,
    after the module's own fixtures (servers) are torn down: autouse fixtures are set up
    first, so they are torn down last. A module with a failure keeps its dirs to look at.
    """
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed == failed:
        for p in set(base.iterdir()) - before:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A function returning a TCP port on 127.0.0.1 that was free a moment ago."""

    def pick() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


@dataclass
class UnimqProcess:
    """A running `unimq up`: its process, data dir, announced ports and output."""

    proc: subprocess.Popen[str]
    data_dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    host: str = "127.0.0.1"
    stdout_lines: list[str] = field(default_factory=list)
    stderr_path: Path | None = None
    pump: threading.Thread | None = None

    def url(self, door: str = "http", path: str = "/") -> str:
        return f"http://{self.host}:{self.ports[door]}{path}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` to this process (by PID) and wait for its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"unimq did not exit {timeout}s after signal {sig}; stderr:\n{self.stderr()}")


def _unimq_command() -> list[str]:
    """`python -m unimq` with this interpreter: the `unimq` script's own code (``unimq.cli:main``).

    Not the installed script: a venv installed before the command moved packages
    keeps a script naming the old module until it is reinstalled.
    """
    return [sys.executable, "-m", "unimq"]


def _config_sets_segment_size(args: tuple[str, ...] | list[str]) -> bool:
    for i, a in enumerate(args):
        path = a.split("=", 1)[1] if a.startswith("--config=") else args[i + 1] if a == "--config" and i + 1 < len(args) else None
        if path and "commitlog_segment_size" in Path(path).read_text():
            return True
    return False


@pytest.fixture
def unimq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., UnimqProcess]]:
    """Factory: ``unimq_server(*extra_args, data_dir=None, timeout=60.0)`` starts `unimq up`.

    Every port is 0 (the server picks and prints them) and data goes to a fresh
    temp dir unless ``data_dir`` is given (pass the same dir twice to test a
    restart). Extra args come after the defaults, so they win. Every process
    still running at teardown is terminated by PID (SIGTERM, then SIGKILL).
    """
    started: list[UnimqProcess] = []

    def start(*extra_args: str, data_dir: Path | None = None, timeout: float = 60.0) -> UnimqProcess:
        if data_dir is None:
            data_dir = tmp_path_factory.mktemp("unimq-data")
        log_dir = tmp_path_factory.mktemp("unimq-log")
        stderr_path = log_dir / "stderr.txt"
        args = [*_unimq_command(), "up", "--data-dir", str(data_dir), "--host", "127.0.0.1"]
        for flag in PORT_FLAGS:
            args += [flag, "0"]
        # Test-sized files: the 1 GiB default segments are preallocated, and a suite
        # starts many servers. A test whose --config sets the segment size decides for
        # itself; its own --set flags come later and win.
        if not _config_sets_segment_size(extra_args):
            args += TEST_STORE_ARGS
        args += list(extra_args)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with stderr_path.open("w") as err:
            proc = subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        server = UnimqProcess(proc=proc, data_dir=data_dir, stderr_path=stderr_path)
        started.append(server)

        # A reader thread drains stdout for the whole life of the process, so the
        # server never blocks on a full pipe, and we can wait with a deadline.
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        server.pump = threading.Thread(target=pump, name=f"unimq-stdout-{proc.pid}", daemon=True)
        server.pump.start()

        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = lines.get(timeout=max(remaining, 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"unimq printed no 'unimq: ready' within {timeout}s; stdout so far: "
                    f"{server.stdout_lines}; stderr:\n{server.stderr()}"
                ) from None
            if line is None:
                code = proc.wait(timeout=10)
                raise AssertionError(
                    f"unimq exited with {code} before ready; stdout: {server.stdout_lines}; "
                    f"stderr:\n{server.stderr()}"
                )
            server.stdout_lines.append(line)
            m = LISTEN_LINE.match(line)
            if m:
                server.ports[m["door"]] = int(m["port"])
            elif line == "unimq: ready":
                return server

    yield start

    for server in started:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=10)
        if server.pump is not None:
            server.pump.join(timeout=10)  # EOF follows the exit; join before closing the pipe
        if server.proc.stdout is not None and (server.pump is None or not server.pump.is_alive()):
            server.proc.stdout.close()
