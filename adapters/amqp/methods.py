"""The AMQP methods a channel accepts, one handler each: exchanges, queues, consuming, tx, confirms.

Why apart from the connection: the connection (``connection``) is the
transport loop and the protocol's state machine (``state``); what each method
*means* (declare, bind, consume, get, recover, tx.commit, ...) is here, one
``async def handler(conn, channel, method)`` per method class in
:data:`HANDLERS`, called in order by the connection's worker. Publishing and
Basic.Ack, the hot path, stay inline in the connection.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from gateway.auth import Action

from . import codec
from .channel import Channel
from .consumer import Consumer
from .durable import args_key
from .errors import AmqpError, method_ids
from .mapping import encoded_delivery
from .publisher import MAX_BATCH
from .routing import EXCHANGE_TYPES, Binding, Exchange
from .tracing import delivered as trace_delivered

if TYPE_CHECKING:
    from .connection import AmqpConnection

__all__ = ["HANDLERS", "NO_DRAIN"]

# RabbitMQ's three permission kinds, as the authorizer's actions (see AmqpConnection.access)
_CONFIGURE, _WRITE, _READ = Action.CREATE, Action.PUBLISH, Action.SUBSCRIBE


async def _channel_close(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    touched = ch.close_state()
    conn.decoder.discard_channel(ch.number)
    del conn.channels[ch.number]
    conn.send_method(ch.number, codec.method(C.Channel.CloseOk))
    for q in touched:
        await conn.maybe_auto_delete(q)
        q.wake()


async def _channel_close_ok(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    pass  # CloseOk for a close we did not send: ignore


async def _channel_flow(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    ch.active = bool(m.active)
    conn.send_method(ch.number, codec.method(C.Channel.FlowOk, active=ch.active))
    if ch.active:
        for c in ch.consumers.values():
            c.queue.wake()


async def _channel_flow_ok(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    pass


def _reserved(name: str) -> bool:
    return name.startswith("amq.")


async def _exchange_declare(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    name = m.exchange
    ex = vh.exchanges.get(name)
    if m.passive:
        if ex is None:
            raise AmqpError(codec.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", 40, 10)
    else:
        conn.access(_CONFIGURE, "exchange", name, m)
        if name == "":
            raise AmqpError(codec.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 10)
        if m.exchange_type not in EXCHANGE_TYPES:
            raise AmqpError(codec.COMMAND_INVALID, f"unknown exchange type '{m.exchange_type}'", 40, 10, hard=True)
        args = m.arguments or {}
        if ex is not None:
            diff = ex.equivalent(m.exchange_type, m.durable, m.auto_delete, m.internal, args)
            if diff is not None:
                raise AmqpError(codec.PRECONDITION_FAILED,
                                f"inequivalent arg for exchange '{name}' in vhost '{vh.name}': {diff}", 40, 10)
        else:
            if _reserved(name):
                raise AmqpError(codec.ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'",
                                40, 10)
            ex = Exchange(name, m.exchange_type, m.durable, m.auto_delete, m.internal, dict(args))
            vh.exchanges[name] = ex
            vh.version += 1
            await conn.broker.save_exchange(vh, ex)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Exchange.DeclareOk))


async def _exchange_delete(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    name = m.exchange
    if name == "" or _reserved(name):
        raise AmqpError(codec.ACCESS_REFUSED, f"operation not permitted on exchange '{name}'", 40, 20)
    conn.access(_CONFIGURE, "exchange", name, m)
    ex = vh.exchanges.get(name)
    if ex is not None:
        if m.if_unused and ex.bindings:
            raise AmqpError(codec.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vh.name}' in use", 40, 20)
        await conn.broker.delete_exchange(vh, ex)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Exchange.DeleteOk))


def _exchange(conn: AmqpConnection, name: str, m: Any) -> Exchange:
    vh = conn.vhost
    assert vh is not None
    ex = vh.exchanges.get(name)
    if ex is None:
        raise AmqpError(codec.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", *method_ids(m))
    return ex


async def _exchange_bind(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    if m.source == "" or m.destination == "":
        raise AmqpError(codec.ACCESS_REFUSED, "operation not permitted on the default exchange", *method_ids(m))
    args = m.arguments or {}
    b = Binding(m.source, m.destination, True, m.routing_key, args_key(args))
    conn.access(_WRITE, "exchange", m.destination, m)
    conn.access(_READ, "exchange", m.source, m)
    if isinstance(m, C.Exchange.Bind):
        _exchange(conn, m.source, m)
        _exchange(conn, m.destination, m)
        await conn.broker.add_binding(vh, b, dict(args))
        if not m.nowait:
            conn.send_method(ch.number, codec.method(C.Exchange.BindOk))
    else:
        # Like RabbitMQ, removing a binding whose source or destination is gone succeeds: clean-up code
        # (aio-pika's RPC close(), unbinds after an auto-delete cascade) unbinds what may already be gone.
        await conn.broker.remove_binding(vh, b)
        if not m.nowait:
            conn.send_method(ch.number, codec.method(C.Exchange.UnbindOk))


async def _queue_declare(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    broker = conn.broker
    name = m.queue
    if m.passive:
        q = conn.queue_for(ch, name, m)
    else:
        if not name:
            name = broker.generated_name("amq.gen-")
        conn.access(_CONFIGURE, "queue", name, m)
        q = vh.queues.get(name)
        args = dict(m.arguments or {})
        if q is not None:
            conn.check_exclusive(q, m)
            diff = q.equivalent(m.durable, m.exclusive, m.auto_delete, args)
            if diff is not None:
                raise AmqpError(codec.PRECONDITION_FAILED, diff, 50, 10)
        else:
            if _reserved(name) and not name.startswith("amq.gen-"):
                raise AmqpError(codec.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", 50, 10)
            dlx = args.get("x-dead-letter-exchange")
            if isinstance(dlx, (bytes, bytearray)):
                args["x-dead-letter-exchange"] = bytes(dlx).decode("utf-8", "replace")
            qt = args.get("x-queue-type")
            if qt is not None and qt not in ("classic", "quorum", "stream"):
                raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg 'x-queue-type' for queue '{name}': {qt!r}",
                                50, 10)
            q = await broker.declare_queue(vh, name, m.durable, conn if m.exclusive else None, m.auto_delete, args)
            if m.exclusive:
                conn.exclusive_queues.add(q)
    q.last_used = time.monotonic()
    ch.last_queue = q.name
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Queue.DeclareOk, queue=q.name, message_count=q.ready(),
                                                 consumer_count=len(q.consumers)))


async def _queue_bind(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    if m.exchange == "":
        raise AmqpError(codec.ACCESS_REFUSED, "operation not permitted on the default exchange", *method_ids(m))
    args = m.arguments or {}
    conn.access(_WRITE, "queue", m.queue or ch.last_queue, m)
    conn.access(_READ, "exchange", m.exchange, m)
    if isinstance(m, C.Queue.Bind):
        q = conn.queue_for(ch, m.queue, m)
        _exchange(conn, m.exchange, m)
        b = Binding(m.exchange, q.name, False, m.routing_key, args_key(args))
        await conn.broker.add_binding(vh, b, dict(args))
        if not m.nowait:
            conn.send_method(ch.number, codec.method(C.Queue.BindOk))
    else:
        # Unbind is idempotent as in RabbitMQ: a missing queue, exchange or binding answers Unbind-Ok
        # (aio-pika's RPC close() unbinds its auto-deleted queue after it is gone).
        name = m.queue or ch.last_queue
        q = vh.queues.get(name) if name else None
        if q is not None:
            conn.check_exclusive(q, m)
        elif not name:
            raise AmqpError(codec.NOT_FOUND, "no previously declared queue", *method_ids(m))
        b = Binding(m.exchange, name, False, m.routing_key, args_key(args))
        await conn.broker.remove_binding(vh, b)
        conn.send_method(ch.number, codec.method(C.Queue.UnbindOk))


async def _queue_purge(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    q = conn.queue_for(ch, m.queue, m)
    conn.access(_READ, "queue", q.name, m)
    n = await q.purge()
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Queue.PurgeOk, message_count=n))


async def _queue_delete(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    name = m.queue or ch.last_queue
    conn.access(_CONFIGURE, "queue", name, m)
    q = vh.queues.get(name)
    n = 0
    if q is not None:
        conn.check_exclusive(q, m)
        if m.if_unused and q.consumers:
            raise AmqpError(codec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' in use", 50, 40)
        if m.if_empty and q.ready():
            raise AmqpError(codec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' is not empty", 50, 40)
        n = await conn.broker.delete_queue(q)
        conn.exclusive_queues.discard(q)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Queue.DeleteOk, message_count=n))


async def _basic_qos(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if m.prefetch_size:
        raise AmqpError(codec.NOT_IMPLEMENTED, "prefetch_size!=0 (%d)" % m.prefetch_size, 60, 10, hard=True)
    if m.global_:
        ch.global_prefetch = m.prefetch_count
    else:
        ch.prefetch = m.prefetch_count
    conn.send_method(ch.number, codec.method(C.Basic.QosOk))
    for c in ch.consumers.values():
        c.queue.wake()


async def _basic_consume(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    q = conn.queue_for(ch, m.queue, m)
    conn.access(_READ, "queue", q.name, m)
    tag = m.consumer_tag or conn.broker.generated_name("amq.ctag-")
    if tag in ch.consumers:
        raise AmqpError(codec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20, hard=True)
    if m.exclusive and q.consumers:
        raise AmqpError(codec.ACCESS_REFUSED, f"queue '{q.name}' in vhost '{q.vhost.name}' in exclusive use", 60, 20)
    if any(c.exclusive for c in q.consumers):
        raise AmqpError(codec.ACCESS_REFUSED, f"queue '{q.name}' in vhost '{q.vhost.name}' in exclusive use", 60, 20)
    if conn.traffic.active:  # a limit on this user's or client's subscriptions (gateway.access.traffic)
        most = conn.meter_of().subscriptions()
        if most is not None and sum(len(c.consumers) for c in conn.channels.values()) >= most:
            conn.broker.processor.metrics.inc("quota_exceeded", "amqp")
            raise AmqpError(codec.PRECONDITION_FAILED, f"consumer limit ({most}) of user "
                            f"'{conn.user}' on this connection is reached", 60, 20)
    c = Consumer(ch, q, tag, m.no_ack, m.exclusive, ch.prefetch)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Basic.ConsumeOk, consumer_tag=tag))
    ch.consumers[tag] = c
    q.consumers.append(c)
    q.had_consumer = True
    q.last_used = time.monotonic()
    q.wake()


async def _basic_cancel(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    c = ch.consumers.pop(m.consumer_tag, None)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Basic.CancelOk, consumer_tag=m.consumer_tag))
    if c is not None:
        q = c.queue
        q.last_used = time.monotonic()
        q.drop_consumer(c)
        await conn.maybe_auto_delete(q)


async def _basic_get(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    q = conn.queue_for(ch, m.queue, m)
    conn.access(_READ, "queue", q.name, m)
    lease = await q.take_one()
    if lease is None:
        conn.send_method(ch.number, codec.method(C.Basic.GetEmpty))
        return
    tag = ch.next_tag
    ch.next_tag += 1
    lane = lease.lane
    if lease.offset >= lane.hw:
        lane.hw = lease.offset + 1
    if conn.broker.tracer.on:
        trace_delivered(conn.broker.tracer, conn.ctx, lease, "get", m.no_ack)
    if m.no_ack:
        q.count -= 1
        conn.broker.ack_lease(lease)
    else:
        lease.tag = tag
        lease.channel = ch
        ch.unacked[tag] = lease
        q.unacked += 1
    if not lease.read_back:
        q.count_out(1, len(lease.msg.body))
    enc, exchange, rk = encoded_delivery(lease.msg)
    conn.write(codec.encode_get_ok(ch.number, tag, lease.attempt > 1, exchange, rk, q.ready())
               + codec.encode_content(ch.number, enc, lease.msg.body, conn.frame_max))


async def _basic_reject(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    await ch.reject(m.delivery_tag, False, m.requeue, (60, 90))


async def _basic_nack(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    await ch.reject(m.delivery_tag, m.multiple, m.requeue, (60, 120))


async def _basic_recover(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    touched = {lease.queue for lease in ch.unacked.values()}
    ch.requeue_all()
    for q in touched:
        q.wake()
    if isinstance(m, C.Basic.Recover):
        conn.send_method(ch.number, codec.method(C.Basic.RecoverOk))


async def _basic_ack_async(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    ch.ack(m.delivery_tag, m.multiple)


async def _confirm_select(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if ch.tx:
        raise AmqpError(codec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10)
    ch.confirm = True
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Confirm.SelectOk))


async def _tx_select(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if ch.confirm:
        raise AmqpError(codec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10)
    ch.tx = True
    conn.send_method(ch.number, codec.method(C.Tx.SelectOk))


async def _tx_commit(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if not ch.tx:
        raise AmqpError(codec.PRECONDITION_FAILED, "channel is not transactional", 90, 20)
    pubs, ch.tx_pubs = ch.tx_pubs, []
    acks, ch.tx_acks = ch.tx_acks, []
    for i in range(0, len(pubs), MAX_BATCH):
        part = pubs[i : i + MAX_BATCH]
        await conn.publisher.store([(ch, msg, qs, seq, t) for msg, qs, seq, t in part])
        if ch.closing:
            return
    ch.tx = False  # apply the acks for real, then back to tx mode
    try:
        for kind, tag, multiple, requeue in acks:
            if kind == "ack":
                ch.ack(tag, multiple)
            else:
                await ch.reject(tag, multiple, requeue, (60, 120))
    finally:
        ch.tx = True
    conn.send_method(ch.number, codec.method(C.Tx.CommitOk))


async def _tx_rollback(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if not ch.tx:
        raise AmqpError(codec.PRECONDITION_FAILED, "channel is not transactional", 90, 30)
    ch.tx_pubs.clear()
    ch.tx_acks.clear()
    conn.send_method(ch.number, codec.method(C.Tx.RollbackOk))


#: The handler of every method a channel other than 0 accepts (see AmqpConnection.handle_async).
HANDLERS = {
    C.Channel.Close: _channel_close,
    C.Channel.CloseOk: _channel_close_ok,
    C.Channel.Flow: _channel_flow,
    C.Channel.FlowOk: _channel_flow_ok,
    C.Exchange.Declare: _exchange_declare,
    C.Exchange.Delete: _exchange_delete,
    C.Exchange.Bind: _exchange_bind,
    C.Exchange.Unbind: _exchange_bind,
    C.Queue.Declare: _queue_declare,
    C.Queue.Bind: _queue_bind,
    C.Queue.Unbind: _queue_bind,
    C.Queue.Purge: _queue_purge,
    C.Queue.Delete: _queue_delete,
    C.Basic.Qos: _basic_qos,
    C.Basic.Consume: _basic_consume,
    C.Basic.Cancel: _basic_cancel,
    C.Basic.Get: _basic_get,
    C.Basic.Ack: _basic_ack_async,
    C.Basic.Reject: _basic_reject,
    C.Basic.Nack: _basic_nack,
    C.Basic.Recover: _basic_recover,
    C.Basic.RecoverAsync: _basic_recover,
    C.Confirm.Select: _confirm_select,
    C.Tx.Select: _tx_select,
    C.Tx.Commit: _tx_commit,
    C.Tx.Rollback: _tx_rollback,
}

# Methods that need not wait for pending publishes to be stored.
NO_DRAIN = {C.Basic.Ack, C.Basic.Reject, C.Basic.Nack, C.Channel.Flow, C.Channel.FlowOk, C.Channel.CloseOk,
             C.Basic.Qos, C.Basic.Consume, C.Basic.Cancel, C.Confirm.Select}
