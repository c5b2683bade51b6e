"""The processor's short path for one plain message whose acknowledgement waits for nothing.

Why a separate path: a single send through :meth:`MessagingProcessor.send` builds the per-call
state of a batch (plans and run tables per topic, broker lists, result lists) and awaits the broker
client, which awaits the controller's coroutine, which calls the store: some 42,000 instructions
over the store's own put (bench/RESULTS.md, "store and processor floors"). In the merged
deployment with async flush and no replica condition the store answers at once, so one plain
message can be written by a synchronous broker call from the processor itself, with no coroutine
under the send and nothing built per call but the result.

It applies only when nothing needs waiting or gathering: the topic's plan is at hand for the
route the broker client hands out now (a first send, a changed topic, the separated deployment:
the general path), the topic is not a batch topic (packing, linger), the message is not delayed
(timers), and the broker client says a write is acknowledged at once (no sync flush, no replica
condition: those sends wait in the general path). Otherwise it returns None before changing
anything, and :meth:`MessagingProcessor.send` takes the general path. Every check of the general
path is made here too, in the same order and with the same errors: reserved topics,
authorization, the door's size limit, the topic's message types, reserved properties; then
stamping, cross-door routing, the queue choice, metrics, tracing and the routers' after-send.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Sequence

from core_broker.errors import MessageTooLargeError
from core_broker.model import Message

from .api import SendResult, route_extra
from .context import RequestContext
from .send_plan import PLAIN_KEYS, clean_properties

if TYPE_CHECKING:
    from .processor import MessagingProcessor

__all__ = ["SendNow", "too_large"]

log = logging.getLogger("unimq.processor")
_tuple_new = tuple.__new__


def too_large(size: int, limit: int) -> MessageTooLargeError:
    """The error of a message body over its door's limit (both send paths raise the same)."""
    return MessageTooLargeError(f"message body of {size} bytes exceeds the limit of {limit}")


class SendNow:
    """Mixin of :class:`gateway.processor.MessagingProcessor`: the single send's short path."""

    def _send_now(self: "MessagingProcessor", ctx: RequestContext,
                  messages: Sequence[Message]) -> list[SendResult] | None:
        """One plain message (``messages`` holds exactly one) stored by a synchronous broker call,
        or None, with nothing changed, where the general path must take it (module docstring)."""
        m = messages[0]
        topic = m.topic
        plan = self._plans.get(topic)
        if (plan is None or plan.batch is not None or m.delivery_time_ms
                or plan.route is not self._route_nowait(topic) or not self.broker.writes_now()):
            return None
        self._publish_check(ctx, topic)
        protocol = ctx.protocol
        config = self.config
        size = len(m.body)
        limit = config.door_message_limits.get(protocol, config.max_message_size)
        if size > limit:
            raise too_large(size, limit)
        mtype = "FIFO" if m.message_group else "NORMAL"  # not delayed (above), not transactional
        if mtype not in plan.accepts:
            raise plan.refused(mtype)
        props = m.properties
        if props and not PLAIN_KEYS.issuperset(props):
            clean_properties(m)
        if m.protocol == "internal":
            m.protocol = protocol
        if not m.born_host:
            m.born_host = ctx.remote_address
        if not m.born_timestamp_ms:
            m.born_timestamp_ms = int(time.time() * 1000)
        routers = self._routers
        if routers:
            routing = [r for r in routers if r.routes_from(m.protocol)]
            if routing:
                route_extra(routing, m)
        q = plan.select(m)
        m.queue_id = q.queue_id
        broker = q.broker
        r = self.broker.put_nowait(broker, m)
        results = [_tuple_new(SendResult, (r[1], topic, broker, m.queue_id, r[3], None, r[6]))]
        if self.tracer.on:
            self.tracer.stored(ctx, messages, results)
        self.metrics.count_in(protocol, topic, 1, size)
        if routers:
            self._after_send(messages, results)
        return results
