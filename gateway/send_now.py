"""The processor's short paths for plain messages whose acknowledgement waits for nothing.

Why separate paths: a send through the general loop of :meth:`MessagingProcessor.send` builds the
per-call state of a mixed batch (plans and run tables per topic, broker lists, result lists), runs
some 40 bytecodes of checks and stamps per message, and awaits the broker client, which awaits the
controller's coroutine, which calls the store (bench/RESULTS.md, "store and processor floors"). In
the merged deployment with async flush and no replica condition the store answers at once, so
plain messages can be written by a synchronous broker call from the processor itself:

- :meth:`SendNow._send_now`: one message, nothing built per call but the result;
- :meth:`SendNow._send_run`: a call of several messages to one topic, checked and stamped by
  C-level passes over the call (``map`` over attribute getters, no bytecode per message), handed
  to the store in one ``put_batch_nowait`` (its compiled encoder takes each queue's run), and
  answered by one C-level pass over the store's results.

They apply only when nothing needs waiting or gathering: the topic's plan is at hand for the
route the broker client hands out now (a first send, a changed topic, the separated deployment:
the general path), the topic is not a batch topic (packing, linger), no message is delayed
(timers) and the broker client says a write is acknowledged at once (no sync flush, no replica
condition: those sends wait in the general path). Otherwise they return None before changing
anything, and :meth:`MessagingProcessor.send` takes the general path. Every check of the general
path is made here too: reserved topics, authorization, the door's size limit, the topic's message
types, reserved properties; then stamping, cross-door routing, the queue choice, metrics,
tracing and the routers' after-send. ``_send_run`` leaves any message that fails a check (or a
FIFO message, an unknown property name) to the general path, which raises the same error in the
same order as always.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Sequence

from core_broker.errors import MessageTooLargeError
from core_broker.model import Message

from .api import SendResult, route_extra
from .context import RequestContext
from .send_plan import PLAIN_KEYS, clean_properties, run_length

if TYPE_CHECKING:
    from .processor import MessagingProcessor

__all__ = ["SendNow", "too_large"]

log = logging.getLogger("unimq.processor")
_tuple_new = tuple.__new__
_drain = deque(maxlen=0).extend  # runs an iterator of setattr calls to its end, keeping nothing


def too_large(size: int, limit: int) -> MessageTooLargeError:
    """The error of a message body over its door's limit (both send paths raise the same)."""
    return MessageTooLargeError(f"message body of {size} bytes exceeds the limit of {limit}")


def _stamp(messages: Sequence[Message], name: str, value: object) -> None:
    _drain(map(setattr, messages, repeat(name), repeat(value)))


class SendNow:
    """Mixin of :class:`gateway.processor.MessagingProcessor`: the short send paths."""

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

    def _send_run(self: "MessagingProcessor", ctx: RequestContext,
                  messages: Sequence[Message]) -> list[SendResult] | None:
        """Several plain NORMAL messages to one round-robin topic, of one door, stored by one
        synchronous broker call; or None, with nothing changed, where the general path must take
        the call (module docstring)."""
        topic = messages[0].topic
        plan = self._plans.get(topic)
        config = self.config
        n = len(messages)
        if (plan is None or plan.batch is not None or plan.fifo or not plan.normal or plan.one_broker is None
                or n > config.max_batch or plan.route is not self._route_nowait(topic)
                or not self.broker.writes_now()):
            return None
        self._publish_check(ctx, topic)
        protocol = ctx.protocol
        host = ctx.remote_address
        limit = config.door_message_limits.get(protocol, config.max_message_size)
        writable, nw, rr = plan.writable, plan.nw, plan.rr
        per = run_length(n, nw)
        qid = writable[rr % nw].queue_id
        now = int(time.time() * 1000)
        plain = PLAIN_KEYS.issuperset
        nbytes = 0
        # One pass of specialised slot reads and writes (cheaper per message than C-level map
        # passes over attrgetters, which look every attribute up through the type). A message
        # that fails a check leaves the call to the general path: the stamps made so far are the
        # ones it makes too, and the queue is chosen again there.
        for m in messages:
            if m.topic != topic or m.message_group or m.delivery_time_ms:
                return None  # several topics, FIFO or delayed messages: the general path
            size = len(m.body)
            if size > limit:
                return None  # the general path raises the error, in its order
            props = m.properties
            if props and not plain(props):
                return None  # the general path cleans reserved names, or learns plain ones
            nbytes += size
            if m.protocol == "internal":
                m.protocol = protocol
            if not m.born_host:
                m.born_host = host
            if not m.born_timestamp_ms:
                m.born_timestamp_ms = now
            m.queue_id = qid
        if per < n:  # a large call: contiguous runs over the queues, as the general path makes them
            for k in range(per, n, per):
                _stamp(messages[k:k + per], "queue_id", writable[(rr + k // per) % nw].queue_id)
        plan.rr = rr + -(-n // per)
        routers = self._routers
        if routers:
            last_proto = None
            routing: list = []
            for m in messages:
                if m.protocol is not last_proto:
                    last_proto = m.protocol
                    routing = [r for r in routers if r.routes_from(last_proto)]
                if routing:
                    route_extra(routing, m)
        broker = plan.one_broker
        put = self.broker.put_batch_nowait(broker, messages)
        new = _tuple_new
        results = [new(SendResult, (r[1], topic, broker, r[2], r[3], None, r[6])) for r in put]
        if self.tracer.on:
            self.tracer.stored(ctx, messages, results)
        self.metrics.count_in(protocol, topic, n, nbytes)
        if routers:
            self._after_send(messages, results)
        return results
