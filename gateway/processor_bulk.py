"""The processor's batch-topic paths: whole-batch reads (for the Arrow pages of
``processor_columnar.py``), producer-packed batches, and single sends gathered into batches
(``batch.linger_ms``).

Why a mixin of :class:`gateway.processor.MessagingProcessor` rather than more methods in it:
the processor module holds every door's hot paths and is at its size limit; these are the
in-process paths of readers and writers that move many messages at once (the Spark source,
packed uploads) and the linger. ``send_packed`` is part of ``MessagingAPI`` (in process only).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from core_broker.model import Message

from .api import SendResult
from .auth import Action, Resource
from .batch_codec import P_BATCH_COUNT, unpack
from .batch_linger import Gathered, Linger
from .batch_send import check_batchable, packed_record
from .context import RequestContext

if TYPE_CHECKING:
    from .processor import MessagingProcessor

__all__ = ["BulkCalls"]

_SUB, _TOPIC = Action.SUBSCRIBE, Resource.TOPIC


class BulkCalls:
    """Over the processor's broker client, plans and linger (see the module docstring)."""

    async def _lingered(self: "MessagingProcessor", ctx: RequestContext,
                        messages: Sequence[Message]) -> list[SendResult] | None:
        """One send to a batch topic with a linger: answered once its gathered batch is stored; None
        when it is not one (no plan yet, no linger, or a gathered batch itself)."""
        if messages.__class__ is Gathered:
            return None
        topic = messages[0].topic
        lp = self._plans.get(topic)
        if lp is None or not lp.linger:
            return None
        cur = self._plan_nowait(ctx, topic)  # the caller's right to publish checked here
        if cur is None:  # separated deployment: a route is never at hand without an await
            cur = await self._send_plan(ctx, topic)
        if not cur.linger:  # switched off since
            return None
        linger = self.__dict__.get("_linger")
        if linger is None:  # made on first use: most processors never see a batch topic with a linger
            linger = self.__dict__["_linger"] = Linger(self.config.max_batch)
        return [await linger.add(ctx, _stamp(ctx, messages[0]), lp.linger, self.send)]

    async def send_packed(self: "MessagingProcessor", ctx: RequestContext, topic: str, body: bytes) -> tuple[SendResult, int]:
        """A batch its producer packed (``gateway/batch_codec.py``, maybe compressed) to a batch topic:
        stored as it came, one record; the result of its first message and the count (see batch_send)."""
        plan = self._plan_nowait(ctx, topic) or await self._send_plan(ctx, topic)
        record = packed_record(topic, body, plan.batch, ctx.protocol, ctx.remote_address, self.config.max_message_size)
        if record is None:  # its messages carry properties: routed one by one (MQTT, AMQP), then re-packed
            msgs = unpack(body).messages(topic, ctx.protocol)
            return (await self.send(ctx, msgs))[0], len(msgs)
        q = plan.select(record)
        record.queue_id = q.queue_id
        (r, tid), = await self.broker.send(q.broker, [record], False, "")
        n = int(record.properties[P_BATCH_COUNT])
        self.metrics.inc("messages_in", ctx.protocol, n)
        self.metrics.inc("bytes_in", ctx.protocol, len(body))
        return SendResult(r[1], topic, q.broker, q.queue_id, r[3], tid, ()), n

    async def pull_batches(self: "MessagingProcessor", ctx: RequestContext, topic: str, queue_id: int, offset: int,
                           max_count: int) -> tuple[list, int, int] | None:
        """A batch topic's records whole, for :meth:`pull_arrow` (MessageStore.get_batches); None: use pull."""
        self._check(ctx, _SUB, _TOPIC, topic)
        return await self.broker.pull_batches(await self._queue_broker(ctx, topic, queue_id, None), topic,
                                              queue_id, offset, max_count)


def _stamp(ctx: RequestContext, m: Message) -> Message:
    """A message that waits for a batch carries its own sender's door, host and time."""
    check_batchable(m.topic, "FIFO" if m.message_group else "DELAY" if m.delivery_time_ms else "NORMAL")
    if m.protocol == "internal":
        m.protocol = ctx.protocol
    m.born_host = m.born_host or ctx.remote_address
    m.born_timestamp_ms = m.born_timestamp_ms or int(time.time() * 1000)
    return m
