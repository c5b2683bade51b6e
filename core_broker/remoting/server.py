"""RPC server: exposes the public async (or plain) methods of one object.

Each request runs as its own task so a long-polling pop does not hold up the
acks behind it on the same connection. Only methods listed in ``methods`` are
callable: the service, not the client, decides what is remote.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable, Iterable

from . import auth
from .codec import AUTH, REQUEST, RESPONSE, FrameDecoder, FrameError, encode
from .outbox import Outbox
from .wire import error_to_wire

log = logging.getLogger("unimq.rpc")


def _peer(writer: asyncio.StreamWriter) -> str:
    addr = writer.get_extra_info("peername")
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


class RpcServer:
    def __init__(
        self, target: Any, methods: Iterable[str], name: str = "rpc",
        on_connections: Callable[[int], None] | None = None,
        guard: Callable[[str], None] | None = None,
        credentials: auth.ClusterCredentials | None = None,
    ) -> None:
        """``on_connections(n)`` runs whenever the number of open connections changes (a broker
        learns whether any gateway is connected). ``guard(method)`` runs before each call and
        may refuse it with a typed error (a replica refuses what only its master serves).
        ``credentials``: what peers must prove at connection start (default: the process's,
        ``auth.configure``; nothing unless configured)."""
        self.target = target
        self.guard = guard
        self.on_connections = on_connections
        self.methods = {m: getattr(target, m) for m in methods}
        self.name = name
        self.credentials = credentials
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    async def start(self, host: str, port: int, sock: Any = None) -> tuple[str, int]:
        # mutual TLS when configured: the handshake runs before _handle (a failed one is logged by
        # auth's context); not start_tls in _handle, which would race the client's first bytes
        creds = self.credentials or auth.current()
        tls: dict[str, Any] = {}
        if creds.tls:
            tls = {"ssl": creds.server_ssl(), "ssl_handshake_timeout": auth.HANDSHAKE_TIMEOUT_S}
        if sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=sock, **tls)
        else:
            self._server = await asyncio.start_server(self._handle, host, port, **tls)
        addr = self._server.sockets[0].getsockname()
        return addr[0], addr[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)  # type: ignore[arg-type]
        if self.on_connections is not None:
            self.on_connections(len(self._conns))
        decoder = FrameDecoder()
        pending: set[asyncio.Task] = set()
        creds = self.credentials or auth.current()
        try:
            # once per connection, before the first request: the cluster secret (auth.py)
            if creds.secret and not await auth.server_handshake(reader, writer, decoder, creds, self.name,
                                                                 _peer(writer)):
                return
            outbox = Outbox(writer)
            while True:
                data = await reader.read(262144)
                if not data:
                    break
                try:
                    frames = decoder.feed(data)
                except FrameError as e:
                    log.warning("%s: closing a connection that sent a bad frame: %s", self.name, e)
                    break
                for f in frames:
                    if f[0] != REQUEST or len(f) != 5:
                        if f[0] == AUTH and not creds.secret:
                            auth.refuse_hello(writer, self.name, _peer(writer))
                            return
                        continue
                    t = asyncio.ensure_future(self._call(f[1], f[2], f[3], f[4], outbox))
                    pending.add(t)
                    t.add_done_callback(pending.discard)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for t in pending:
                t.cancel()
            self._conns.discard(task)  # type: ignore[arg-type]
            writer.close()
            if self.on_connections is not None:
                self.on_connections(len(self._conns))

    async def _call(self, call_id: int, method: str, args: list, kwargs: dict, outbox: Outbox) -> None:
        fn = self.methods.get(method)
        try:
            if fn is None:
                raise AttributeError(f"no remote method {method!r}")
            if self.guard is not None:
                self.guard(method)
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            frame = encode([RESPONSE, call_id, True, result])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # every failure goes back to the caller, typed
            if not getattr(e, "code", None):
                log.exception("%s: %s failed", self.name, method)
            frame = encode([RESPONSE, call_id, False, error_to_wire(e)])
        outbox.put(frame)
