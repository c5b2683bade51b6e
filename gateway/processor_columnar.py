"""The processor's columnar and table reads: a compacted topic read as a table, compaction on
demand, and a pull as an Arrow page (undecoded records for the Spark source).

Why a mixin of :class:`gateway.processor.MessagingProcessor`: the processor module holds every
door's hot paths and is at its size limit; these calls serve readers of whole queues (the
Spark source, the table API) and share nothing with the per-message paths. They are part of
the contract (``gateway/api.py``) like every other call.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from core_broker.model import FilterExpression, GetResult
from core_broker.record_layout import LAYOUT

from .api import ArrowPage, ArrowUnavailableError
from .auth import Action, Resource
from .broker_client import BrokerClient, RawPage, TopicRoute
from .context import RequestContext
from .metrics import Metrics

__all__ = ["ColumnarCalls"]

_SUB, _TOPIC = Action.SUBSCRIBE, Resource.TOPIC


class ColumnarCalls:
    """``read_table``, ``compact_topic``, ``pull_arrow`` and ``pull_raw`` over the broker client."""

    broker: BrokerClient
    metrics: Metrics
    _check: Callable[[RequestContext, Action, Resource, str], None]
    _queue_broker: Callable[[RequestContext, str, int, str | None], Awaitable[str]]
    _route: Callable[..., Awaitable[TopicRoute]]

    async def read_table(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int = 0, max_count: int = 256
    ) -> GetResult:
        """A COMPACTED topic's queue as a table: the latest message of each key from ``offset``."""
        self._check(ctx, _SUB, _TOPIC, topic)
        b = await self._queue_broker(ctx, topic, queue_id, None)
        return await self.broker.read_table(b, topic, queue_id, offset, max_count)

    async def compact_topic(self, ctx: RequestContext, topic: str) -> dict:
        """Compact a COMPACTED topic now, on every broker of it (the admin trigger)."""
        self._check(ctx, Action.ADMIN, _TOPIC, topic)
        done = [await self.broker.compact_topic(b, topic) for b in (await self._route(ctx, topic)).brokers]
        return {k: sum(d[k] for d in done) for k in ("passes", "queues", "removed")}

    async def pull_arrow(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int = 32,
        filter_expression: FilterExpression | None = None, wait_ms: int = 0,
    ) -> ArrowPage:
        """:meth:`pull` as an Arrow page, built by ``gateway/arrow_pages.py`` (imported here, on
        first use: pyarrow and numpy are optional)."""
        try:
            from . import arrow_pages
        except ImportError:
            raise ArrowUnavailableError(
                "format=arrow needs pyarrow and numpy on the server (pip install 'unimq[spark]')") from None
        return await arrow_pages.pull_page(self, ctx, topic, queue_id, offset, max_count, filter_expression, wait_ms)

    async def pull_raw(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int
    ) -> RawPage | None:
        """Queue offsets ``[offset, offset+n)`` undecoded, for columnar readers (the Arrow pages
        of :meth:`pull_arrow`): see MessageStore.get_raw for the tuple. None when :meth:`pull`
        must be used (a remote broker, offset out of range)."""
        self._check(ctx, _SUB, _TOPIC, topic)
        if not self.broker.reads_raw:
            return None
        b = await self._queue_broker(ctx, topic, queue_id, None)
        r = await self.broker.pull_raw(b, topic, queue_id, offset, max_count)
        if r is not None:
            n = len(r[0]) // LAYOUT.entry_size  # consume-queue entries
            self.metrics.inc("messages_out", ctx.protocol, n)
            self.metrics.inc_topic("messages_out", ctx.protocol, topic, n)
        return r

