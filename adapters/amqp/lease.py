"""A message of an AMQP queue: ready in the queue's buffer, or delivered and not yet acknowledged.

Why its own module: a lease is what the queue's buffer (plain or
:class:`~adapters.amqp.priority_buffer.PriorityBuffer`), its pump, the channel
that delivered it and the broker that settles it all hold; it carries the
message's LMQ offset and lane (the durable floor it advances when settled), its
priority, expiry and delivery attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core_broker.model import Message, StoredMessage
from gateway.lmq_reader import SpillLane

if TYPE_CHECKING:
    from .channel import Channel
    from .consumer import Consumer
    from .queue_state import QueueState

__all__ = ["Lease"]


class Lease:
    """A message of a queue: ready in the queue's buffer, or delivered and unacked."""

    __slots__ = ("queue", "msg", "attempt", "tag", "consumer", "channel", "expires_at", "offset", "tmpl", "priority",
                 "lane", "read_back")

    def __init__(self, queue: QueueState, msg: StoredMessage | Message, attempt: int, offset: int,
                 lane: SpillLane, tmpl: Any = None, read_back: bool = False) -> None:
        self.queue = queue
        # read back from the store: the processor's pull counted it in messages_out already
        self.read_back = read_back
        self.msg = msg
        self.lane = lane
        self.priority = queue.priority_of(msg) if queue.max_priority else 0
        self.tmpl = tmpl  # (raw properties, exchange, routing key) for delivering it, or None: derive
        self.offset = offset  # the message's LMQ offset (requeue order, the durable cursor)
        self.attempt = attempt
        self.tag = 0
        self.consumer: "Consumer | None" = None
        self.channel: "Channel | None" = None
        self.expires_at = queue.expiry_of(msg) if queue.ttl is not None or queue.per_message_ttl else None
