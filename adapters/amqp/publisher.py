"""Publishing on one AMQP connection: route at once, store in batches, then confirm.

Why apart from the connection: publishes are pipelined. Each Basic.Publish is
routed as it arrives (exchange and bindings as they are now) and appended to
the connection's pending batch; one sender task stores whole batches with a
single ``processor.send`` (group commit under ``--flush sync``), enqueues
each message into the queues it reached (their LMQ offsets come back in the
send result), and then sends the publisher confirms of the batch
(``multiple``). Any other method first waits (:meth:`Publisher.drain`) until
the pending publishes are stored, so a publish followed by a get or a declare
on the same connection sees its message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from core_broker.errors import BadRequestError, NotEnoughInSyncReplicasError, NotMasterError, StoreFullError, UnimqError

from gateway.access.traffic import QuotaExceededError
from gateway.auth import Action

from . import codec
from .errors import AmqpError
from .mapping import build_message
from .queue_state import QueueState
from .state import ConnState

if TYPE_CHECKING:
    from .channel import Channel
    from .connection import AmqpConnection

log = logging.getLogger("unimq.amqp")

_WRITE = Action.PUBLISH

__all__ = ["Publisher", "Pub", "MAX_BATCH", "MAX_PENDING", "RETRIABLE"]

MAX_PENDING = 4096  # publishes waiting to be stored before the connection stops reading
MAX_BATCH = 1024  # the processor's batch limit
CLOSED = ConnState.CLOSED

# Refusals a client may retry (a soft 506 channel error, and basic.nack under confirms): the
# disk is full, or a replicated group has too few in-sync replicas or is changing masters.
RETRIABLE = (StoreFullError, NotEnoughInSyncReplicasError, NotMasterError)

# A publish on its way to the store: channel, message, queues it reaches, confirm sequence
# (negative: nack), delivery template (raw properties, exchange, routing key) or None.
Pub = tuple["Channel", Any, list[QueueState], "int | None", Any]


class Publisher:
    """A connection's publishes between arrival and confirm: the pending batch and its sender task."""

    def __init__(self, conn: AmqpConnection) -> None:
        self.conn = conn
        self._pending: list[Pub] = []
        self._sender: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        # what a delivery from memory sends, per (raw properties, exchange, routing key): shared by
        # the publishes that repeat it
        self._tmpls: dict[tuple[bytes, str, str], tuple[bytes, str, str]] = {}

    def backlog(self) -> int:
        """Publishes received and not yet handed to the store."""
        return len(self._pending)

    def publish(self, ev: codec.ContentReceived) -> None:
        """Route one Basic.Publish with its content at once and queue it for the store (or the channel's tx)."""
        m = ev.method
        conn = self.conn
        ch = conn.channel_for(ev.channel, m)
        if ch is None:
            return
        vh = conn.vhost
        assert vh is not None
        exname = m.exchange
        ex = vh.exchanges.get(exname)
        if ex is None:
            raise AmqpError(codec.NOT_FOUND, f"no exchange '{exname}' in vhost '{vh.name}'", 60, 40)
        if ex.internal:
            raise AmqpError(codec.ACCESS_REFUSED, f"cannot publish to internal exchange '{exname}' in vhost "
                            f"'{vh.name}'", 60, 40)
        if conn.broker.access_enforced and exname not in conn.may_publish:
            # RabbitMQ's write permission on the exchange, asked once per connection and exchange
            # until users or permissions change (the broker empties may_publish then)
            conn.access(_WRITE, "exchange", exname or "amq.default", m)
            conn.may_publish.add(exname)
        if m.immediate:
            raise AmqpError(codec.NOT_IMPLEMENTED, "immediate=true", 60, 40, hard=True)
        body = ev.body
        if len(body) > conn.broker.max_message_size:
            raise AmqpError(codec.PRECONDITION_FAILED, f"message size {len(body)} is larger than configured max "
                            f"size {conn.broker.max_message_size}", 60, 40)
        if conn.traffic.active and self._over_rate(ch, len(body)):
            return
        props = ev.properties
        if props:
            uid = props.get("user_id")
            if uid is not None and uid != conn.user:
                raise AmqpError(codec.PRECONDITION_FAILED, f"user_id property set to '{uid}' but authenticated user "
                                f"was '{conn.user}'", 60, 40)
            exp = props.get("expiration")
            if exp is not None and not (exp.isdigit() and len(exp) < 19):
                raise AmqpError(codec.PRECONDITION_FAILED, f"invalid expiration '{exp}'", 60, 40)
            headers = props.get("headers")
        else:
            headers = None
        rk = m.routing_key
        queues = vh.route(exname, rk, headers)
        rejected = False
        if queues:
            for q in queues:
                if q.max_length is not None and q.rejects_publish():
                    rejected = True
                    queues = [x for x in queues if not x.rejects_publish()]
                    break
        topic, mqtt = vh.unified_topic(exname, rk)
        raw_props = ev.raw_props
        targets = queues[0].targets if len(queues) == 1 else tuple(t for q in queues for t in q.targets)
        msg = build_message(topic, mqtt, exname, rk, props, ev.raw_headers, body, targets,
                            raw_props)
        # what a delivery from memory sends: the properties exactly as published
        if raw_props is not None:
            key = (raw_props, exname, rk)
            tmpl = self._tmpls.get(key)
            if tmpl is None:
                if len(self._tmpls) >= 1024:
                    self._tmpls.clear()
                tmpl = self._tmpls[key] = key  # shared by the publishes that repeat it
        else:
            tmpl = None
        seq = None
        if ch.confirm:
            ch.pub_seq += 1
            seq = ch.pub_seq
            if rejected:
                seq = -seq  # nack once stored
        if m.mandatory and not queues and not rejected:
            conn.write(
                codec.encode_method(ch.number, codec.method(C.Basic.Return, reply_code=codec.NO_ROUTE,
                                                            reply_text="NO_ROUTE", exchange=exname, routing_key=rk))
                + codec.encode_content(ch.number, codec.encode_properties(props, ev.raw_headers), body,
                                       conn.frame_max)
            )
        if ch.tx:
            ch.tx_pubs.append((msg, queues, seq, tmpl))
            return
        self._pending.append((ch, msg, queues, seq, tmpl))
        if self._sender is None:
            self._idle.clear()
            self._sender = conn.loop.create_task(self._send_loop())

    def _over_rate(self, ch: Channel, nbytes: int) -> bool:
        """Charge one publish to the connection's budget (``gateway.access.traffic``): over its rate,
        the connection stops being read for a while (:meth:`AmqpConnection.hold`); True when the excess
        persists and this publish is refused, not stored: basic.nack under confirms, else the channel
        closed with 406."""
        conn = self.conn
        try:
            wait = conn.meter_of().charge(1, nbytes)
        except QuotaExceededError as e:
            conn.broker.processor.metrics.inc("quota_exceeded", "amqp")
            if not ch.confirm:
                raise AmqpError(codec.PRECONDITION_FAILED, f"publish refused for user '{conn.user}': {e}",
                                60, 40) from None
            ch.pub_seq += 1
            conn.write(codec.encode_method(ch.number, codec.method(C.Basic.Nack, delivery_tag=ch.pub_seq,
                                                                   multiple=False, requeue=False)))
            return True
        if wait > 0:
            conn.hold(wait)
        return False

    async def _send_loop(self) -> None:
        conn = self.conn
        try:
            while self._pending and conn.state is not CLOSED:
                batch = self._pending[:MAX_BATCH]
                del self._pending[: len(batch)]
                await self.store(batch)
                conn.maybe_resume()
        finally:
            self._pending.clear() if conn.state is CLOSED else None
            self._sender = None
            self._idle.set()

    async def drain(self) -> None:
        """Wait until every publish received so far is stored."""
        while self._pending or self._sender is not None:
            await self._idle.wait()

    async def store(self, batch: list[Pub]) -> None:
        """Store one batch with a single send; enqueue into the queues it reached; confirm it."""
        conn = self.conn
        broker = conn.broker
        try:
            results = await broker.send(conn.send_ctx, [b[1] for b in batch])
        except UnimqError as e:
            if isinstance(e, StoreFullError):
                broker.set_blocked("low on disk")
            log.warning("AMQP connection %s: storing %d message(s) failed: %s", conn.peer, len(batch), e)
            failed: set[Channel] = set()
            last_seq: dict[Channel, int] = {}
            for ch, _msg, _qs, seq, _t in batch:
                if seq is not None:
                    last_seq[ch] = abs(seq)
                else:
                    failed.add(ch)
            for ch, seq in last_seq.items():
                if not ch.closing:
                    conn.write(codec.encode_method(ch.number, codec.method(C.Basic.Nack, delivery_tag=seq,
                                                                           multiple=True, requeue=False)))
            # the client's mistake (a message without a key for a compacted topic): 406, as RabbitMQ's
            code = codec.RESOURCE_ERROR if isinstance(e, RETRIABLE) else \
                codec.PRECONDITION_FAILED if isinstance(e, BadRequestError) else codec.INTERNAL_ERROR
            for ch in failed:
                if ch.number in conn.channels:
                    conn.close_channel(ch.number, code, f"{codec.REPLY_TEXT[code]} - message not stored: {e}", 60, 40)
            return
        touched: dict[QueueState, None] = {}
        for (_ch, msg, queues, _seq, tmpl), r in zip(batch, results):
            if queues:
                # the first extra-dispatch targets are these queues' LMQs, in this order
                offs = r.extra_offsets
                for i, q in enumerate(queues):
                    q.on_enqueued(msg, offs[i] if i < len(offs) else None, r.broker, tmpl)
                    if q.max_length is not None:
                        touched[q] = None
        for q in touched:
            await q.enforce_max_length()
        self._confirm(batch)

    def _confirm(self, batch: list[Pub]) -> None:
        """Publisher confirms of a stored batch: one multiple ack per channel, nacks where a queue refused."""
        conn = self.conn
        write = conn.write
        acks: dict[Channel, int] = {}
        for ch, _msg, _qs, seq, _t in batch:
            if seq is None:
                continue
            if seq < 0:  # rejected by a full queue (x-overflow reject-publish)
                if ch in acks:
                    write(codec.encode_basic_ack(ch.number, acks.pop(ch), True))
                write(codec.encode_method(ch.number, codec.method(C.Basic.Nack, delivery_tag=-seq,
                                                                       multiple=False, requeue=False)))
                continue
            acks[ch] = seq
        for ch, seq in acks.items():
            if not ch.closing and ch.number in conn.channels:
                write(codec.encode_basic_ack(ch.number, seq, True))
