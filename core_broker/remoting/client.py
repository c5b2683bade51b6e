"""RPC client: one multiplexed connection to one peer, reconnected on demand."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from typing import Any

from ..errors import UnimqError
from . import auth
from .codec import REQUEST, RESPONSE, FrameDecoder, FrameError, encode
from .outbox import Outbox
from .wire import error_from_wire, register_error


class PeerUnavailableError(UnimqError):
    """The broker or nameserver could not be reached (or the connection broke mid-call)."""

    code = "SERVICE_UNAVAILABLE"


register_error(PeerUnavailableError)


class PeerConnectError(PeerUnavailableError):
    """The peer could not be reached at all: a call that fails this way was never sent (safe to
    retry elsewhere, unlike a connection lost mid-call, after which it may have been carried out)."""


register_error(PeerConnectError)


class RpcClient:
    def __init__(self, host: str, port: int, connect_timeout: float = 3.0,
                 credentials: auth.ClusterCredentials | None = None) -> None:
        """``credentials``: what this client proves itself with (default: the process's, ``auth.configure``)."""
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.credentials = credentials
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._outbox: Outbox | None = None  # frames of this loop turn, for _writer
        self._reader_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        async with self._lock:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            creds = self.credentials or auth.current()
            decoder = FrameDecoder()
            writer = None
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
                # arrives as the connection attempt ends (refused at once by a dead peer, say), and
                # a task being stopped then runs on (a replica switching masters hung on that).
                async with asyncio.timeout(self.connect_timeout):
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    # once per connection: mutual TLS and the cluster secret when configured (auth.py)
                    if creds.tls:
                        await self._start_tls(writer, creds)
                    if creds.secret:
                        await auth.client_handshake(reader, writer, decoder, creds, self.address)
            except auth.RpcAuthError as e:
                writer.close()  # type: ignore[union-attr]
                auth.log.warning("refused by %s: %s", self.address, e)
                raise
            except (OSError, TimeoutError) as e:
                if writer is not None:
                    writer.close()
                raise PeerConnectError(f"cannot reach {self.address}: {e}") from None
            self._writer = writer
            self._outbox = Outbox(writer)
            self._reader_task = asyncio.ensure_future(self._read_loop(reader, writer, decoder))
            return writer

    async def _start_tls(self, writer: asyncio.StreamWriter, creds: auth.ClusterCredentials) -> None:
        try:
            await writer.start_tls(creds.client_ssl())  # type: ignore[arg-type]
        except (ssl.SSLError, ConnectionError) as e:
            raise auth.RpcAuthError(f"{self.address} refused the mutual TLS handshake: {e}") from None

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         decoder: FrameDecoder) -> None:
        reason = "lost"
        heard = False  # whether the peer ever sent anything on this connection
        try:
            while True:
                data = await reader.read(262144)
                if not data:
                    if not heard and not (self.credentials or auth.current()).tls:
                        reason = ("closed before answering anything (a peer that requires mutual TLS closes a "
                                  "connection without a certificate this way: rpc_tls_cert/key/ca)")
                    break
                heard = True
                for f in decoder.feed(data):
                    if f[0] != RESPONSE:
                        continue
                    fut = self._pending.pop(f[1], None)
                    if fut is None or fut.done():
                        continue
                    if f[2]:
                        fut.set_result(f[3])
                    else:
                        err = error_from_wire(f[3])
                        if isinstance(err, auth.RpcAuthError):  # this node lacks the cluster's credentials
                            auth.log.warning("refused by %s: %s", self.address, err)
                        fut.set_exception(err)
        except FrameError as e:  # a peer of another unimq version, or not a unimq peer at all
            reason = f"closed: {e}"
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            err = PeerUnavailableError(f"connection to {self.address} {reason}")
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(err)
            self._pending.clear()

    async def call(self, method: str, *args: Any, rpc_timeout: float | None = 60.0, **kwargs: Any) -> Any:
        writer = self._writer
        if writer is None or writer.is_closing():
            writer = await self._connect()
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending[call_id] = fut
        self._outbox.put(encode([REQUEST, call_id, method, list(args), kwargs]))  # type: ignore[union-attr]
        if rpc_timeout is None:
            return await fut
        # a timer handle rather than asyncio.wait_for: this is every RPC's path, and
        # wait_for costs an extra future and callbacks per call
        timer = loop.call_later(rpc_timeout, self._expire, call_id, method)
        try:
            return await fut
        finally:
            timer.cancel()
            if fut.cancelled():
                self._pending.pop(call_id, None)

    def _expire(self, call_id: int, method: str) -> None:
        fut = self._pending.pop(call_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(PeerUnavailableError(f"{method} on {self.address} timed out"))

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            try:
                await self._reader_task
            except asyncio.CancelledError:
                pass
            self._reader_task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
