"""The AMQP door's memory queues past their limit: a queue spills to its LMQ and reads back in order.

Why in process: the spill threshold (``adapters.amqp.broker.MEM_LIMIT``,
20,000 messages) is lowered for the test, which a ``unimq up`` subprocess
cannot be told; the door itself is the real one (its server, the real
processor and store from ``processor_fixtures``), driven by aio-pika over TCP.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import aio_pika
import pytest

from adapters.amqp import broker as amqp_broker
from adapters.amqp.connection import AmqpConnection
from unimq.settings import load_settings
from processor_fixtures import processor, processor_options  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(120)


class Door:
    def __init__(self, processor: Any, tmp_path: Any) -> None:
        self.settings = load_settings(overrides={"data_dir": str(tmp_path / "door")})
        self.processor = processor
        self.broker: amqp_broker.AmqpBroker | None = None
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.broker = amqp_broker.AmqpBroker(self.processor, self.settings)
        await self.broker.start()
        loop = asyncio.get_running_loop()
        b = self.broker
        self.server = await loop.create_server(lambda: AmqpConnection(b, self.settings), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None and self.broker is not None
        self.server.close()
        for c in list(self.broker.connections):
            if c.transport is not None:
                c.transport.abort()
        await asyncio.sleep(0.05)
        await self.broker.stop()


@pytest.fixture
async def door(processor: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Door]:  # noqa: F811
    monkeypatch.setattr(amqp_broker, "MEM_LIMIT", 5)
    d = Door(processor, tmp_path)
    await d.start()
    yield d
    await d.stop()


async def _consume(ch: aio_pika.abc.AbstractChannel, name: str, n: int, ack: bool = True) -> list[bytes]:
    q = await ch.get_queue(name)
    got: list[bytes] = []
    async with q.iterator() as it:
        async for m in it:
            got.append(m.body)
            if ack:
                await m.ack()
            if len(got) == n:
                break
    return got


async def test_spilled_queue_reads_back_in_order(door: Door) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{door.port}/")
    async with conn:
        ch = await conn.channel()  # publisher confirms on
        for durable in (True, False):
            name = f"spill-{durable}"
            await ch.declare_queue(name, durable=durable)
            for i in range(30):
                await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode(), delivery_mode=2), name)
            q = door.broker.vhosts["/"].queues[name]  # type: ignore[union-attr]
            assert len(q.buffer) == 5 and q.spilling()  # the rest waits in the store
            assert (await ch.declare_queue(name, passive=True)).declaration_result.message_count == 30
            got = await _consume(ch, name, 30)
            assert got == [f"m{i}".encode() for i in range(30)]
            assert (await ch.declare_queue(name, passive=True)).declaration_result.message_count == 0


async def test_purge_of_a_spilled_durable_queue_survives_a_door_restart(door: Door) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{door.port}/")
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue("spill-purge", durable=True)
        for i in range(12):
            await ch.default_exchange.publish(aio_pika.Message(f"old{i}".encode(), delivery_mode=2), "spill-purge")
        q = await ch.declare_queue("spill-purge", passive=True)
        await q.purge()
        await ch.default_exchange.publish(aio_pika.Message(b"new", delivery_mode=2), "spill-purge")
    await door.stop()
    await door.start()
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{door.port}/")
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue("spill-purge", durable=True)
        assert q.declaration_result.message_count == 1
        assert await _consume(ch, "spill-purge", 1) == [b"new"]
