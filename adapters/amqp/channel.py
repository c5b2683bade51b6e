"""One AMQP channel: deliveries to its consumers, acknowledgements, requeues, tx and confirm mode.

Why its own module: a channel is the unit AMQP settles messages in (delivery
tags are per channel, and closing a channel requeues its unacknowledged
messages); the queue's pump calls :meth:`Channel.deliver`, the connection
hands it acks from its hot path, and the method handlers (``methods``) the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from . import codec
from .consumer import Consumer
from .errors import AmqpError
from .lease import Lease
from .mapping import encoded_delivery
from .queue_state import QueueState
from .tracing import delivered, settled

if TYPE_CHECKING:
    from .connection import AmqpConnection

__all__ = ["Channel"]


class Channel:
    """A channel's consumers, unacknowledged deliveries, prefetch, confirm and tx modes."""

    def __init__(self, conn: AmqpConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.closing = False  # we sent Channel.Close and wait for CloseOk
        self.active = True  # Channel.Flow from the client
        self.next_tag = 1
        self.unacked: dict[int, Lease] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch = 0  # for consumers created from now on (basic.qos global=false)
        self.global_prefetch = 0  # shared by the channel's consumers (basic.qos global=true)
        self.confirm = False
        self.pub_seq = 0
        self.tx = False
        self.tx_pubs: list[tuple[Any, list[QueueState], int | None, Any]] = []
        self.tx_acks: list[tuple[str, int, bool, bool]] = []  # (kind, tag, multiple, requeue)
        self.last_queue = ""

    # -- deliveries -------------------------------------------------------------------

    def deliver(self, consumer: Consumer, lease: Lease) -> None:
        """Send one message to a consumer (called by the queue's pump)."""
        tag = self.next_tag
        self.next_tag = tag + 1
        m = lease.msg
        tmpl = lease.tmpl
        if tmpl is None:
            tmpl = encoded_delivery(m)
        conn = self.conn
        conn.write(codec.encode_delivery(self.number, consumer.tag, tag, lease.attempt > 1, tmpl[1], tmpl[2],
                                         tmpl[0], m.body, conn.frame_max))
        q = lease.queue
        lane = lease.lane
        if lease.offset >= lane.hw:
            lane.hw = lease.offset + 1
        if conn.broker.tracer.on:
            delivered(conn.broker.tracer, conn.ctx, lease, "consume", consumer.no_ack)
        if consumer.no_ack:
            q.count -= 1
            conn.broker.ack_lease(lease)
        else:
            lease.tag = tag
            lease.consumer = consumer
            lease.channel = self
            self.unacked[tag] = lease
            consumer.unacked += 1
            q.unacked += 1

    def server_cancel(self, consumer: Consumer) -> None:
        """The queue went away: forget the consumer and tell the client if it understands Basic.Cancel."""
        self.consumers.pop(consumer.tag, None)
        if self.closing:
            return
        caps = self.conn.client_caps
        if caps.get("consumer_cancel_notify"):
            self.conn.send_method(self.number, codec.method(C.Basic.Cancel, consumer_tag=consumer.tag, nowait=True))

    # -- settling ------------------------------------------------------------------------

    def _take(self, tag: int, multiple: bool, cm: tuple[int, int]) -> list[Lease]:
        un = self.unacked
        if multiple:
            out = []
            if tag == 0:
                out = list(un.values())
                un.clear()
                return out
            if tag not in un and not any(t <= tag for t in un):
                raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)
            tags = []
            for t in un:  # delivery tags were inserted in increasing order
                if t > tag:
                    break
                tags.append(t)
            pop = un.pop
            return [pop(t) for t in tags]
        lease = un.pop(tag, None)
        if lease is None:
            raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)
        return [lease]

    def _settled(self, lease: Lease) -> QueueState:
        c = lease.consumer
        if c is not None:
            c.unacked -= 1
        q = lease.queue
        q.unacked -= 1
        return q

    def ack(self, tag: int, multiple: bool) -> None:
        if self.tx:
            self._take_check(tag, multiple, (60, 80))
            self.tx_acks.append(("ack", tag, multiple, False))
            return
        woken: set[QueueState] = set()
        broker = self.conn.broker
        tracer = broker.tracer
        for lease in self._take(tag, multiple, (60, 80)):
            q = self._settled(lease)
            q.count -= 1
            broker.ack_lease(lease)
            woken.add(q)
            if tracer.on:
                settled(tracer, self.conn.ctx, lease, "acked")
        for q in woken:
            q.wake()

    def _take_check(self, tag: int, multiple: bool, cm: tuple[int, int]) -> None:
        if multiple:
            if tag and not any(t <= tag for t in self.unacked):
                raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)
        elif tag not in self.unacked:
            raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)

    async def reject(self, tag: int, multiple: bool, requeue: bool, cm: tuple[int, int]) -> None:
        if self.tx:
            self._take_check(tag, multiple, cm)
            self.tx_acks.append(("nack", tag, multiple, requeue))
            return
        await self._reject(self._take(tag, multiple, cm), requeue)

    async def _reject(self, leases: list[Lease], requeue: bool) -> None:
        broker = self.conn.broker
        tracer = broker.tracer
        for lease in leases:
            q = self._settled(lease)
            if tracer.on:
                settled(tracer, self.conn.ctx, lease, "retried" if requeue else "nacked", requeue=requeue)
            if requeue:
                broker.release(lease)
            else:
                q.count -= 1
                await broker.dead_letter(q, lease, "rejected")
            q.wake()

    def requeue_all(self) -> None:
        """Give every unacked message of this channel back to its queue (close, recover)."""
        broker = self.conn.broker
        leases = list(self.unacked.values())
        self.unacked.clear()
        for lease in leases:
            self._settled(lease)
            if broker.tracer.on:
                settled(broker.tracer, self.conn.ctx, lease, "retried", requeue=True, reason="channel closed")
            broker.release(lease)
        for c in self.consumers.values():
            c.unacked = 0

    def close_state(self) -> list[QueueState]:
        """Drop consumers, requeue unacked; returns the queues whose consumers changed."""
        touched: list[QueueState] = []
        for c in list(self.consumers.values()):
            q = c.queue
            q.drop_consumer(c)
            touched.append(q)
        self.consumers.clear()
        self.requeue_all()
        self.tx_pubs.clear()
        self.tx_acks.clear()
        return touched
