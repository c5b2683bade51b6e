"""The processor's admin calls: consumer groups' queues and offset resets (the console's and
``unimq admin``'s view of consumption).

Why a mixin of :class:`gateway.processor.MessagingProcessor` rather than more methods in it:
the processor module holds every door's hot paths and is at its size limit; these calls are
rare, admin-only, and read nothing the hot paths keep. They are part of the contract
(``gateway/api.py``) like every other call, so namespaces, the processor RPC and the
contract test treat them the same. Authorization: both ask ``ADMIN`` on the cluster (a
reset also asks ``ADMIN`` on the group), as ``consumer_lag`` and ``store_stats`` do.
"""

from __future__ import annotations

from typing import Callable

from core_broker.errors import BadRequestError, TopicNotFoundError

from .api import ClusterView, GroupQueueStats
from .auth import Action, Resource
from .broker_client import BrokerClient
from .context import RequestContext

__all__ = ["AdminCalls"]


class AdminCalls:
    """``consumer_groups``, ``reset_offset``, ``remap_queue``, ``release_queue`` and ``cluster`` over the
    processor's broker client."""

    broker: BrokerClient
    _check: Callable[[RequestContext, Action, Resource, str], None]

    async def consumer_groups(self, ctx: RequestContext) -> list[GroupQueueStats]:
        """Every consumer group's queues with offsets and in-flight counts (admin)."""
        self._check(ctx, Action.ADMIN, Resource.CLUSTER, "")
        return [GroupQueueStats(*row) for row in await self.broker.group_queues()]

    async def reset_offset(
        self, ctx: RequestContext, group: str, topic: str, queue_id: int | None = None, *,
        offset: int | None = None, timestamp_ms: int | None = None,
    ) -> list[tuple[int, int]]:
        """Move ``group`` on ``topic`` (one queue, or all) to ``offset`` or to the first message
        stored at or after ``timestamp_ms``; what follows is delivered again. Returns
        ``(queue_id, new offset)`` per queue (admin)."""
        self._check(ctx, Action.ADMIN, Resource.CLUSTER, "")
        self._check(ctx, Action.ADMIN, Resource.GROUP, group)
        if (offset is None) == (timestamp_ms is None):
            raise BadRequestError("give exactly one of offset and timestamp_ms")
        if offset is not None and offset < 0:
            raise BadRequestError("offset must not be negative")
        route = await self.broker.route(topic)
        if route is None:
            raise TopicNotFoundError(f"topic {topic!r} not found")
        seen: set[int] = set()  # a static topic's route lists a logic queue's older brokers too
        queues = [q for q in route.queues if (queue_id is None or q.queue_id == queue_id)
                  and not (q.queue_id in seen or seen.add(q.queue_id))]  # type: ignore[func-returns-value]
        if not queues:
            raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")
        out = []
        for q in queues:
            target = offset
            if target is None:
                target = await self.broker.query_offset(q.broker, topic, q.queue_id, "timestamp", timestamp_ms or 0)
            out.append((q.queue_id, await self.broker.reset_offset(q.broker, group, topic, q.queue_id, target)))
        return out

    async def remap_queue(self, ctx: RequestContext, topic: str, queue_id: int, broker: str) -> dict:
        """Write a static topic's logic queue ``queue_id`` on ``broker`` from now on, without copying
        anything: older offsets stay readable where they are. Returns the topic's new map (admin)."""
        self._check(ctx, Action.ADMIN, Resource.TOPIC, topic)
        return await self.broker.remap_queue(topic, queue_id, broker)

    async def release_queue(self, ctx: RequestContext, topic: str, queue_id: int, broker: str) -> dict:
        """Scale-in: forget ``broker``'s old part of a static topic's logic queue once every consumer
        group consumed it (refused, saying who is behind, until then). Returns the new map (admin)."""
        self._check(ctx, Action.ADMIN, Resource.TOPIC, topic)
        return await self.broker.release_queue(topic, queue_id, broker)

    async def cluster(self, ctx: RequestContext) -> ClusterView:
        """The nameservers and brokers this processor reaches (admin)."""
        self._check(ctx, Action.ADMIN, Resource.CLUSTER, "")
        return await self.broker.cluster()
