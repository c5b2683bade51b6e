"""The AMQP 0-9-1 door: a thin asyncio server around the codec and the connection logic.

Why so little here: framing lives in the sans-io ``codec``, the protocol's
state in ``state``, each connection in ``connection`` (its channels and methods
beside it), the shared queues and exchanges in ``broker``; this module only binds the
socket (``gateway.door.bind_socket``, so port 0 reports the real port),
creates one :class:`~adapters.amqp.connection.AmqpConnection` per client,
watches the data disk for RabbitMQ's Connection.Blocked alarm, and on stop
closes every connection with 320 CONNECTION_FORCED after handing their
unacked messages back to the store (``AmqpConnection.shut_down``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable

from .broker import AmqpBroker
from .connection import AmqpConnection

log = logging.getLogger("unimq.amqp")

__all__ = ["AmqpDoor", "AmqpTlsDoor"]


class AmqpDoor:
    """``unimq up``'s AMQP door (``--amqp-port``, default 5672)."""

    name = "amqp"

    def __init__(self, state: Any) -> None:
        self._state = state
        self.broker: AmqpBroker | None = None
        self._server: asyncio.AbstractServer | None = None
        self._disk_task: asyncio.Task[None] | None = None
        # Free fraction of the data disk (the Connection.Blocked alarm); replaceable in tests.
        self.disk_free_ratio: Callable[[], float] = self._statvfs_free_ratio

    def _statvfs_free_ratio(self) -> float:
        st = os.statvfs(self._state.settings.store.data_dir)
        return st.f_bavail / st.f_blocks if st.f_blocks else 1.0

    async def start(self) -> tuple[str, int]:
        from gateway.door import bind_socket

        settings = self._state.settings
        self.broker = AmqpBroker(self._state.processor, settings, getattr(self._state, "identities", None))
        await self.broker.start()
        sock = bind_socket(settings.host, settings.amqp_port)
        loop = asyncio.get_running_loop()
        broker = self.broker
        self._server = await loop.create_server(lambda: AmqpConnection(broker, settings), sock=sock)
        self._disk_task = loop.create_task(self._disk_alarm(), name="amqp-disk-alarm")
        host, port = sock.getsockname()[:2]
        return host, port

    async def _disk_alarm(self) -> None:
        """Block publishers (Connection.Blocked) while the disk is under the store's refuse threshold."""
        limit = getattr(self._state.settings.store, "disk_refuse_free_ratio", 0.02)
        while True:
            await asyncio.sleep(1.0)
            try:
                ratio = self.disk_free_ratio()
            except OSError:
                continue
            assert self.broker is not None
            if ratio < limit:
                self.broker.set_blocked("low on disk")
            elif self.broker.blocked is not None and ratio >= limit * 1.5:
                self.broker.set_blocked(None)

    async def stop(self) -> None:
        if self._server is None or self.broker is None:
            return
        if self._disk_task is not None:
            self._disk_task.cancel()
        self._server.close()
        broker = self.broker
        conns = list(broker.connections)
        for c in conns:
            await c.shut_down()
        await broker.stop()
        try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel of this stop
            async with asyncio.timeout(5):
                await self._server.wait_closed()
        except Exception:  # TimeoutError included
            pass


class AmqpTlsDoor:
    """AMQPS (``amqp_tls_port``, 5671 by default): AMQP 0-9-1 inside TLS, sharing the plain door's broker.

    Why a port of its own: AMQP 0-9-1 has no STARTTLS; clients (pika's
    ``SSLOptions``, aio-pika's ``amqps://``) open TLS first on 5671, as with
    RabbitMQ's ``listeners.ssl``. The handshake is asyncio's (the ``ssl`` module);
    a client that does not complete it (plain AMQP sent here) is dropped without
    reaching the broker. Started after :class:`AmqpDoor` and stopped before it:
    the plain door's stop closes every connection of the broker, these included.
    """

    name = "amqps"

    def __init__(self, state: Any, plain: AmqpDoor, port: int) -> None:
        self._state = state
        self._plain = plain
        self.port = port
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        from gateway.door import bind_socket

        settings = self._state.settings
        files = settings.amqp_tls_files()
        tls = self._state.server_tls(files, "AMQPS door")
        broker = self._plain.broker
        assert broker is not None, "the plain AMQP door starts first"
        sock = bind_socket(settings.host, self.port)
        self._server = await asyncio.get_running_loop().create_server(
            lambda: AmqpConnection(broker, settings), sock=sock, ssl=tls.context, ssl_handshake_timeout=10.0)
        host, port = sock.getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # the plain door's stop closes the connections
            self._server = None
