"""Helpers for the HTTP door's tests: a configured `unimq up`, a real webhook server, polling.

Why a real webhook server: push delivery must be seen from the receiving side
exactly as a serverless function or service would see it (a real HTTP/1.1
request over a socket), so the tests run uvicorn on 127.0.0.1 with an
ephemeral port inside the test's event loop and record what arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import uvicorn

CE_JSON = "application/cloudevents+json"
CE_BATCH = "application/cloudevents-batch+json"

# Small store files, and no disk-space guards: the test machine's disk is shared with other
# suites (the defaults preallocate a 1 GiB segment, and refuse puts or cut segments early when the
# disk is nearly full, which these tests are not about).
BASE_CONFIG = """
http_push_allowed_hosts = ["127.0.0.1"]
http_max_body_bytes = 65536

[store]
disk_min_free_ratio = 0.0
disk_refuse_free_ratio = 0.0
commitlog_segment_size = 16777216
cq_entries_per_file = 20000
index_slots = 20000
index_entries_per_file = 80000
"""


def start_server(unimq_server: Callable[..., Any], tmp_path: Path, *args: str, data_dir: Path | None = None,
                 config: str = "") -> Any:
    """`unimq up` with the HTTP door's test config (push sinks only on 127.0.0.1, 64 KiB bodies)."""
    cfg = tmp_path / f"unimq-http-{time.monotonic_ns()}.toml"
    cfg.write_text(BASE_CONFIG + config)
    return unimq_server("--config", str(cfg), *args, data_dir=data_dir)


async def until(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``pred`` (sync or async) until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test process keeps its own."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


class Webhook:
    """A real HTTP server (uvicorn, 127.0.0.1, ephemeral port) recording every request it gets.

    ``fail_first`` requests are answered with ``fail_status``; with ``always_fail`` every one is.
    """

    def __init__(self, fail_first: int = 0, fail_status: int = 500, always_fail: bool = False) -> None:
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.always_fail = always_fail
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[int] = []
        self.url = ""
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def app(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            ev = await receive()
            body += ev.get("body", b"")
            if not ev.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append((headers, body))
        fail = self.always_fail or len(self.requests) <= self.fail_first
        status = self.fail_status if fail else 200
        self.answers.append(status)
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok" if status == 200 else b"nope"})

    async def __aenter__(self) -> "Webhook":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hook"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False, interface="asgi3")
        self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        await until(lambda: self._server.started, 10, "the webhook server to start")  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await asyncio.wait_for(self._task, 15)
