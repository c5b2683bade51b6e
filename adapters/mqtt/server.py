"""The MQTT door: a thin asyncio server around :mod:`adapters.mqtt.broker`.

Why this shape: the protocol logic (``broker.Connection``) knows nothing of
sockets; this module only moves bytes. Plain TCP uses an ``asyncio.Protocol``
(no stream objects per connection: 10,000 idle clients must stay small), and
MQTT over WebSocket (subprotocol ``mqtt``, for browser dashboards) uses the
``websockets`` library, already installed with uvicorn's standard extras, on
its own port: each binary WebSocket message is fed to the same Connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.door import bind_socket

from .broker import Connection, MQTTBroker, MQTTConfig
from .settings import MqttSettings

log = logging.getLogger("unimq.mqtt")

__all__ = ["MQTTDoor", "MQTTWebSocketDoor", "door_config"]


def _peer(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class _TcpProtocol(asyncio.Protocol):
    __slots__ = ("broker", "conn")

    def __init__(self, broker: MQTTBroker) -> None:
        self.broker = broker
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.set_write_buffer_limits(high=1 << 20)  # type: ignore[attr-defined]
        self.conn = Connection(self.broker, transport, _peer(transport.get_extra_info("peername")))
        self.broker.connections.add(self.conn)

    def data_received(self, data: bytes) -> None:
        self.conn.feed(data)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.broker.connections.discard(self.conn)
            self.conn.lost()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_writing()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_writing()


def door_config(settings: MqttSettings) -> MQTTConfig:
    """The MQTT door's knobs from unimq's settings (``mqtt_*`` keys, see ``settings.py``)."""
    return settings.mqtt_config()


async def _close_server(server: Any) -> None:
    """Stop listening and wait (a second at most) for the server to say it is closed."""
    if server is not None:
        server.close()
        try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel of this stop
            async with asyncio.timeout(1):
                await server.wait_closed()
        except TimeoutError:  # pragma: no cover
            pass


class MQTTDoor:
    """MQTT 3.1/3.1.1/5.0 over TCP on ``mqtt_port``; owns the broker shared with the WebSocket door."""

    name = "mqtt"

    def __init__(self, state: Any, broker: MQTTBroker | None = None, host: str | None = None,
                 port: int | None = None) -> None:
        self._state = state
        settings = getattr(state, "settings", None)
        self.host = host if host is not None else settings.host
        self.port = port if port is not None else settings.mqtt_port
        self.reuse_port = bool(getattr(settings, "reuse_port", False))
        self.broker = broker or MQTTBroker(state.processor, door_config(settings), getattr(state, "identities", None),
                                           getattr(settings, "allow_anonymous", True))
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        await self.broker.start()
        sock = bind_socket(self.host, self.port, backlog=4096, reuse_port=self.reuse_port)
        loop = asyncio.get_running_loop()
        broker = self.broker
        self._server = await loop.create_server(lambda: _TcpProtocol(broker), sock=sock)
        bound = sock.getsockname()
        return bound[0], bound[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # no new connections while the broker closes the open ones
        await self.broker.stop()
        await _close_server(self._server)


class MQTTTlsDoor:
    """MQTT over TLS (``mqtt_tls_port``, 8883 by default) sharing the TCP door's broker.

    Why a listener of its own rather than STARTTLS: MQTT has none; devices open TLS
    first on the port they are configured with, as with Mosquitto's ``listener 8883``
    + ``certfile``/``keyfile``. The handshake is asyncio's (the ``ssl`` module); a
    client that does not complete it is dropped without touching the broker.
    """

    name = "mqtts"

    def __init__(self, state: Any, broker: MQTTBroker, host: str | None = None, port: int | None = None) -> None:
        settings = state.settings
        self.host = host if host is not None else settings.host
        self.port = port if port is not None else (settings.mqtt_tls_port or 8883)
        self.reuse_port = bool(getattr(settings, "reuse_port", False))
        self.broker = broker
        self._state = state
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        tls = self._state.server_tls(self._state.settings.mqtt_tls_files(), "MQTT over TLS door")
        sock = bind_socket(self.host, self.port, backlog=4096, reuse_port=self.reuse_port)
        broker = self.broker
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _TcpProtocol(broker), sock=sock, ssl=tls.context,
            ssl_handshake_timeout=broker.config.connect_timeout_s)
        bound = sock.getsockname()
        return bound[0], bound[1]

    async def stop(self) -> None:
        await _close_server(self._server)


class _WsTransport:
    """What Connection needs from a transport, over one WebSocket connection."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.closed = False
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._paused = False
        self.sender = asyncio.get_running_loop().create_task(self._send_loop())
        self.pending = 0

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.pending += len(data)
            self._queue.put_nowait(data)

    async def _send_loop(self) -> None:
        try:
            while True:
                data = await self._queue.get()
                if data is None:
                    break
                self.pending -= len(data)
                await self.ws.send(data)
        except Exception:  # connection gone
            pass
        finally:
            try:
                await self.ws.close()
            except Exception:  # pragma: no cover
                pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(None)

    def get_write_buffer_size(self) -> int:
        return self.pending

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The underlying connection's (WSS: its TLS ``ssl_object``, for a client certificate)."""
        t = getattr(self.ws, "transport", None)
        return t.get_extra_info(name, default) if t is not None else default

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False


class MQTTWebSocketDoor:
    """MQTT over WebSocket (subprotocol ``mqtt``) on ``mqtt_ws_port``, any path; with ``secure``,
    over TLS (wss://) on ``mqtt_wss_port`` with the MQTT door's certificate."""

    name = "mqttws"

    def __init__(self, state: Any, broker: MQTTBroker, host: str | None = None, port: int | None = None,
                 secure: bool = False) -> None:
        settings = getattr(state, "settings", None)
        self._state = state
        self.host = host if host is not None else settings.host
        self.port = port if port is not None else settings.mqtt_ws_port
        self.reuse_port = bool(getattr(settings, "reuse_port", False))
        self.broker = broker
        self.secure = secure
        if secure:
            self.name = "mqttwss"
        self._server: Any = None

    async def start(self) -> tuple[str, int]:
        from websockets.asyncio.server import serve

        ssl_context = None
        if self.secure:
            ssl_context = self._state.server_tls(self._state.settings.mqtt_tls_files(),
                                                 "MQTT over secure WebSocket door").context
        sock = bind_socket(self.host, self.port, reuse_port=self.reuse_port)
        self._server = await serve(
            self._handler,
            sock=sock,
            ssl=ssl_context,
            open_timeout=self.broker.config.connect_timeout_s,
            subprotocols=["mqtt"],
            max_size=self.broker.config.max_packet_size + 16,
            compression=None,
        )
        bound = sock.getsockname()
        return bound[0], bound[1]

    async def _handler(self, ws: Any) -> None:
        if ws.subprotocol != "mqtt":
            await ws.close(1002, "subprotocol mqtt required")
            return
        transport = _WsTransport(ws)
        conn = Connection(self.broker, transport, _peer(ws.remote_address))
        try:
            async for msg in ws:
                if isinstance(msg, str):
                    conn.close()  # MQTT over WebSocket is binary only
                    break
                conn.feed(msg)
                if conn.closed:
                    break
                while transport._paused and not conn.closed:
                    await asyncio.sleep(0.01)
        except Exception:
            pass
        finally:
            conn.lost()
            transport.close()
            try:  # asyncio.timeout: a cancel of this handler must not be dropped (see _close_server)
                async with asyncio.timeout(5):
                    await transport.sender
            except Exception:  # TimeoutError included: the sender's own end does not matter here
                pass

    async def stop(self) -> None:
        await _close_server(self._server)
