"""Idempotent clean-up operations answer OK on missing entities, as RabbitMQ does.

Why: apps migrating from RabbitMQ unbind, delete and cancel in clean-up code that runs after an
auto-delete cascade removed the queue or exchange; aio-pika's RPC pattern does so on every close().
RabbitMQ answers Unbind-Ok / Delete-Ok / Cancel-Ok there (binding removal treats a missing source or
destination as success; deleting a missing queue or exchange is a no-op whatever the if-unused /
if-empty flags), so a channel closed with 404 breaks them. Real pika and aio-pika against `unimq up`.
"""

from __future__ import annotations

import asyncio

import aio_pika
import aio_pika.patterns
import pika
import pytest

from tests.test_amqp_e2e import Server, params, server, uniq  # noqa: F401  (module fixture)

pytestmark = pytest.mark.timeout(60)


def test_pika_unbind_missing_queue_and_exchange_is_ok(server: Server) -> None:  # noqa: F811
    c = pika.BlockingConnection(params(server))
    ch = c.channel()
    ex, q = uniq("gone_ex"), uniq("gone_q")
    ch.exchange_declare(ex, "direct", auto_delete=True)
    ch.queue_declare(q, auto_delete=True)
    ch.queue_bind(q, ex, "k")
    ch.queue_delete(q)  # cascades: the binding goes, then the auto-delete exchange
    ch.queue_unbind(q, ex, "k")  # queue and exchange both gone
    ch.queue_unbind(q, "amq.direct", "k")  # queue gone, exchange present
    other = uniq("q_present")
    ch.queue_declare(other)
    ch.queue_unbind(other, uniq("no_ex"), "k")  # exchange missing, queue present
    ch.exchange_unbind(destination=uniq("no_dst"), source=uniq("no_src"), routing_key="k")
    ch.exchange_unbind(destination=uniq("no_dst"), source="amq.topic", routing_key="k")
    ch.queue_delete(other)
    assert ch.is_open
    c.close()


def test_pika_delete_missing_and_cancel_unknown_are_ok(server: Server) -> None:  # noqa: F811
    c = pika.BlockingConnection(params(server))
    ch = c.channel()
    assert ch.queue_delete(uniq("never")).method.message_count == 0
    ch.queue_delete(uniq("never"), if_unused=True, if_empty=True)
    ch.exchange_delete(uniq("never_ex"))
    ch.exchange_delete(uniq("never_ex"), if_unused=True)
    ch.basic_cancel("no-such-consumer-tag")
    assert ch.is_open
    c.close()


async def _aio_idempotent(port: int) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange(uniq("aio_ex"), aio_pika.ExchangeType.DIRECT, auto_delete=True)
        q = await ch.declare_queue(uniq("aio_q"), auto_delete=True)
        await q.bind(ex, "k")
        await q.delete()
        await q.unbind(ex, "k")  # queue and exchange gone
        await ch.queue_delete(q.name)
        await ch.exchange_delete(ex.name)
        dst = await ch.declare_exchange(uniq("aio_dst"), aio_pika.ExchangeType.FANOUT)
        await dst.bind("amq.topic", "a.b")
        raw = await ch.get_underlay_channel()
        await dst.delete()  # aio-pika's Exchange drops its channel on delete(): unbind on the raw one
        await raw.exchange_unbind(destination=dst.name, source="amq.topic", routing_key="a.b")
        async def ignore(_: aio_pika.abc.AbstractIncomingMessage) -> None:
            return None

        tag = await (await ch.declare_queue(exclusive=True)).consume(ignore)
        await raw.basic_cancel(tag)
        await raw.basic_cancel(tag)  # already cancelled
        assert not ch.is_closed


def test_aio_pika_unbind_delete_cancel_missing_are_ok(server: Server) -> None:  # noqa: F811
    asyncio.run(_aio_idempotent(server.amqp_port))


async def _aio_rpc(port: int) -> None:
    conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with conn:
        srv_ch = await conn.channel()
        srv = await aio_pika.patterns.RPC.create(srv_ch)

        async def mul(*, x: int, y: int) -> int:
            return x * y

        name = uniq("mul")
        await srv.register(name, mul, auto_delete=True)
        cli_ch = await conn.channel()
        cli = await aio_pika.patterns.RPC.create(cli_ch)
        for i in range(3):
            assert await asyncio.wait_for(cli.proxy.__getattr__(name)(x=i, y=7), 10) == i * 7
        await cli.close()  # unbinds its reply queue after it is gone
        await srv.close()
        assert not cli_ch.is_closed and not srv_ch.is_closed
        # the channels are still usable after close()
        q = await cli_ch.declare_queue(exclusive=True)
        await cli_ch.default_exchange.publish(aio_pika.Message(b"still open"), q.name)
        msg = await q.get(timeout=5)
        assert msg is not None and msg.body == b"still open"
        await msg.ack()


def test_aio_pika_rpc_pattern_close_keeps_channel(server: Server) -> None:  # noqa: F811
    asyncio.run(_aio_rpc(server.amqp_port))
