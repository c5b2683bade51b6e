"""Helpers of the Spark tests (tests/test_spark_*.py): a module-scoped `unimq up`, producers.

Why not conftest's ``unimq_server``: it is function-scoped, and the Spark tests
share one server per module (starting `unimq up` costs seconds on a loaded
2-core machine). The server runs with small commitlog segments and the
disk-space guards off: a shared CI disk that is 98% full (as it was when these
tests were written) must not make puts fail or retention delete the data
under a test; the retention test turns retention on explicitly.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
LISTEN = re.compile(r"^unimq: (?P<door>\w+) listening on \[?(?P<host>[^\]]+?)\]?:(?P<port>\d+)$")

TEST_STORE = {
    "commitlog_segment_size": 16 << 20,
    "disk_refuse_free_ratio": 0.0,
    "disk_min_free_ratio": 0.0,
    "index_slots": 20_000,
    "index_entries_per_file": 80_000,
}


@dataclass
class Server:
    proc: subprocess.Popen
    data_dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_server(tmp: Path, store: dict | None = None, timeout: float = 120.0) -> Server:
    """`unimq up` on ephemeral 127.0.0.1 ports with data in ``tmp/data``; waits for `unimq: ready`.

    ``store`` overrides [store] settings of :data:`TEST_STORE`.
    """
    data = tmp / "data"
    cfg = tmp / "unimq.toml"
    cfg.write_text("[store]\n" + "".join(f"{k} = {v!r}\n" for k, v in {**TEST_STORE, **(store or {})}.items()))
    cmd = [sys.executable, "-m", "unimq"]
    cmd += ["up", "--config", str(cfg), "--data-dir", str(data), "--host", "127.0.0.1", "--log-level", "warning"]
    for flag in ("--mqtt-port", "--amqp-port", "--http-port", "--grpc-port", "--namesrv-port"):
        cmd += [flag, "0"]
    err = open(tmp / "stderr.txt", "w")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    err.close()
    srv = Server(proc, data)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            srv.stop()
            raise AssertionError(f"unimq not ready in {timeout}s: {srv.lines}; {(tmp / 'stderr.txt').read_text()}")
        if line is None:
            raise AssertionError(f"unimq exited: {srv.lines}; {(tmp / 'stderr.txt').read_text()}")
        srv.lines.append(line)
        m = LISTEN.match(line)
        if m:
            srv.ports[m["door"]] = int(m["port"])
        elif line == "unimq: ready":
            return srv


class Http:
    """A keep-alive client for producing test data through the HTTP door."""

    def __init__(self, endpoint: str) -> None:
        u = urllib.parse.urlsplit(endpoint)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                # the server closed an idle keep-alive connection (uvicorn: after 5 s): reconnect once
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def create_topic(self, name: str, queues: int = 4) -> None:
        st, body = self.call("POST", "/v1/topics", json.dumps({"name": name, "queues": queues}).encode(),
                             {"content-type": "application/json"})
        assert st in (200, 201), body

    def delete_topic(self, name: str) -> None:
        st, body = self.call("DELETE", f"/v1/topics/{urllib.parse.quote(name, safe='')}")
        assert st == 204, body

    def send(self, topic: str, body: bytes, headers: dict | None = None) -> dict:
        st, out = self.call("POST", f"/v1/topics/{urllib.parse.quote(topic, safe='')}/messages", body, headers)
        assert st == 200, out
        return json.loads(out)

    def send_events(self, topic: str, docs: Iterable[dict], start_id: int = 0, batch: int = 1000) -> int:
        """CloudEvents in batch mode (fast bulk load): one event per doc, data = the doc."""
        n = 0
        chunk: list[dict] = []

        def flush() -> None:
            st, out = self.call("POST", f"/v1/topics/{urllib.parse.quote(topic, safe='')}/events",
                                json.dumps(chunk).encode(), {"content-type": "application/cloudevents-batch+json"})
            assert st == 200, out[:300]
            chunk.clear()

        for d in docs:
            chunk.append({"specversion": "1.0", "id": str(start_id + n), "source": "/test", "type": "test.event",
                          "datacontenttype": "application/json", "data": d})
            n += 1
            if len(chunk) >= batch:
                flush()
        if chunk:
            flush()
        return n

    def describe(self, topic: str) -> dict[int, tuple[int, int]]:
        st, out = self.call("GET", f"/v1/topics/{urllib.parse.quote(topic, safe='')}")
        assert st == 200, out
        return {q["queue_id"]: (q["min_offset"], q["max_offset"]) for q in json.loads(out)["queues"]}

    def close(self) -> None:
        self.conn.close()


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL a child started with ``start_new_session=True`` and its whole process group (a
    Spark job's JVM with it), by PID, and reap it; nothing when it has already exited."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
