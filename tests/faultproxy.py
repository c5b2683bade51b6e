"""A fault-injecting TCP proxy for failover tests (issue 16).

It forwards 127.0.0.1:port to a target and can be told, at any moment, to blackhole the traffic
(a network partition: connections stay open, bytes vanish both ways, new connections are accepted
and then hear nothing), to delay every chunk, to reset every connection, and to resume. Written by
hand because the tools that do this (toxiproxy, tc netem) need a daemon or root; the proxy is a thin
asyncio loop, nothing of a protocol.

Use it from an asyncio test (`FaultProxy`) or from a synchronous one (`ThreadedFaultProxy`, which
runs the same proxy on its own event loop thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

CHUNK = 65536


class FaultProxy:
    """Forwards 127.0.0.1:`port` -> `target_host`:`target_port`, with faults on request."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self._listen_port = listen_port
        self.port = 0
        self.blackholed = False
        self.refusing = False
        self.delay_s = 0.0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections_accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def partition(self) -> None:
        """Blackhole: every byte from now on is dropped, in both directions, on old and new
        connections, without closing anything (what a partition looks like to TCP)."""
        self.blackholed = True

    def refuse(self) -> None:
        """Unreachable: every connection reset now, new ones closed at once (what a partition
        looks like when the network answers: an ICMP unreachable, a firewall's RST)."""
        self.refusing = True
        self.reset()

    def delay(self, seconds: float) -> None:
        self.delay_s = seconds

    def resume(self) -> None:
        self.blackholed = False
        self.refusing = False
        self.delay_s = 0.0

    def reset(self) -> None:
        """Close every proxied connection now (a peer crash or an RST as seen by both ends)."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.refusing:
            client_w.transport.abort()
            return
        self._writers.add(client_w)
        try:
            upstream_r, upstream_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self._writers.discard(client_w)
            client_w.transport.abort()
            return
        self._writers.add(upstream_w)
        for src, dst in ((client_r, upstream_w), (upstream_r, client_w)):
            task = asyncio.ensure_future(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    break
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.blackholed:
                    continue
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(dst)
            dst.transport.abort()


class ThreadedFaultProxy:
    """The same proxy on a private event loop thread, for synchronous tests."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="faultproxy")
        self.proxy = FaultProxy(target_port, target_host, listen_port)

    @property
    def port(self) -> int:
        return self.proxy.port

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def _do(self, action: Callable[[], None]) -> None:
        async def run() -> None:
            action()

        self._call(run)

    def start(self) -> None:
        self._thread.start()
        self._call(self.proxy.start)

    def stop(self) -> None:
        self._call(self.proxy.stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def partition(self) -> None:
        self._do(self.proxy.partition)

    def refuse(self) -> None:
        self._do(self.proxy.refuse)

    def delay(self, seconds: float) -> None:
        self._do(lambda: self.proxy.delay(seconds))

    def resume(self) -> None:
        self._do(self.proxy.resume)

    def reset(self) -> None:
        self._do(self.proxy.reset)
