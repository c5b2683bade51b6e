"""The fault-injecting proxy the failover tests use: forwards, blackholes, resumes, resets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from tests.faultproxy import FaultProxy, ThreadedFaultProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def proxy(echo_port: int) -> AsyncIterator[FaultProxy]:
    p = FaultProxy(echo_port)
    await p.start()
    yield p
    await p.stop()


async def _roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    data = await asyncio.wait_for(reader.readexactly(len(payload)), 5)
    writer.close()
    return data


async def test_forwards_both_ways(proxy: FaultProxy) -> None:
    payload = bytes(range(256)) * 1000
    assert await _roundtrip(proxy.port, payload) == payload


async def test_partition_drops_bytes_on_open_connections_and_resume_restores(proxy: FaultProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"before")
    assert await asyncio.wait_for(reader.readexactly(6), 5) == b"before"
    proxy.partition()
    writer.write(b"lost")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(100), 0.3)
    assert not reader.at_eof()  # a partition does not close the connection
    proxy.resume()
    writer.write(b"after")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"after"
    writer.close()


async def test_partition_silences_new_connections(proxy: FaultProxy) -> None:
    proxy.partition()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"hello")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(100), 0.3)
    writer.close()


async def test_delay_still_delivers_in_order(proxy: FaultProxy) -> None:
    proxy.delay(0.05)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    for i in range(5):
        writer.write(b"%d," % i)
        await writer.drain()
    got = b""
    while len(got) < 10:
        got += await asyncio.wait_for(reader.read(100), 5)
    assert got == b"0,1,2,3,4,"
    writer.close()


async def test_reset_closes_connections(proxy: FaultProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"x")
    assert await asyncio.wait_for(reader.readexactly(1), 5) == b"x"
    proxy.reset()
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        await asyncio.wait_for(reader.readexactly(1), 5)
    # the proxy keeps accepting after a reset
    assert await _roundtrip(proxy.port, b"again") == b"again"


def test_threaded_proxy_from_sync_code() -> None:
    target = socket.create_server(("127.0.0.1", 0))
    proxy = ThreadedFaultProxy(target.getsockname()[1])
    proxy.start()
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        conn, _ = target.accept()
        conn.settimeout(5)
        client.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        proxy.partition()
        client.sendall(b"gone")
        conn.settimeout(0.3)
        with pytest.raises(socket.timeout):
            conn.recv(4)
        proxy.resume()
        conn.settimeout(5)
        client.sendall(b"back")
        assert conn.recv(4) == b"back"
        client.close()
        conn.close()
    finally:
        proxy.stop()
        target.close()
