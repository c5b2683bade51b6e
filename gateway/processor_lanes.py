"""The processor's calls over many LMQ lanes of one broker at once: reads and committed floors.

Why (issue 21): a door that reads light message queues (``lmq_reader.py``) through lanes,
one per broker holding a part of the LMQ, read and committed each lane with a call of its
own. An MQTT gateway in a fleet is woken for thousands of sessions at once (notes) and
commits thousands of floors per flush: one broker call per lane was most of the broker's
and much of the gateway's CPU per first message. These calls carry many lanes of one
broker in one call, each authorized as its own reader. A mixin of
:class:`gateway.processor.MessagingProcessor` (that module is at its size limit).

Only LMQs: a lane is a broker's part of one, never a static topic's mapped queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from core_broker.errors import BadRequestError
from core_broker.model import GetResult
from core_broker.system_topics import is_lmq

from .auth import Action, Resource
from .batch_codec import expand_all
from .context import RequestContext

if TYPE_CHECKING:
    from .processor import MessagingProcessor

__all__ = ["LaneCalls"]

_SUB, _TOPIC, _GROUP = Action.SUBSCRIBE, Resource.TOPIC, Resource.GROUP


def _lmq(topic: str) -> str:
    if not is_lmq(topic):
        raise BadRequestError(f"{topic!r} is not an LMQ: only LMQ lanes are read and committed together")
    return topic


class LaneCalls:
    """Over the processor's broker client, authorizer and metrics (see the module docstring)."""

    async def pull_lanes(self: "MessagingProcessor", ctx: RequestContext, broker: str,
                         reads: Sequence[tuple[RequestContext, str, int, int]]) -> list[GetResult | None]:
        """Read many LMQs' parts on ``broker`` (queue 0), ``(reader, lmq, offset, max count)`` each,
        the reader authorized as :meth:`pull` does; one answer per read, None where ``broker``
        does not know that LMQ (as :meth:`pull` raising ``TopicNotFoundError``). No long poll."""
        if not self._allow_all:
            for reader, topic, _, _ in reads:
                self._check(reader, _SUB, _TOPIC, topic)
        got = await self.broker.pull_lanes(broker, [(_lmq(t), 0, o, n) for _, t, o, n in reads])
        count = self.metrics.count_out
        out: list[GetResult | None] = []
        for (reader, topic, _, _), r in zip(reads, got):
            if r is not None and r.messages:
                r = r._replace(messages=expand_all(r.messages))
                count(reader.protocol, topic, len(r.messages), sum(len(m.body) for m in r.messages))
            out.append(r)
        return out

    async def commit_lanes(self: "MessagingProcessor", ctx: RequestContext, group: str, broker: str,
                           offsets: Sequence[tuple[str, int]]) -> None:
        """Commit ``group``'s offsets of many LMQs' parts on ``broker`` (queue 0), ``(lmq, offset)``
        each, in one call and one journal record (as :meth:`commit_offset` does one)."""
        if not self._allow_all:
            self._check(ctx, _SUB, _GROUP, group)
            for topic, _ in offsets:
                self._check(ctx, _SUB, _TOPIC, topic)
        await self.broker.commit_offsets(broker, group, [(_lmq(t), 0, o) for t, o in offsets])
