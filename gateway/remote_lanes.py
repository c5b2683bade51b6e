"""The broker RPC's calls over many LMQ lanes at once, for :class:`gateway.remote_broker_client.RemoteBrokerClient`.

Why a mixin: the remote client is at its module size limit, and these two calls share
nothing with its routing, fencing and fail-over (a lane names its broker; an LMQ is
never a static topic, so there is no map to follow). See ``gateway/processor_lanes.py``
for why lanes are read and committed together (issue 21).
"""

from __future__ import annotations

from typing import Any, Sequence

from core_broker.model import GetResult
from core_broker.remoting.rows import get_result_from_block

__all__ = ["RemoteLaneCalls"]


class RemoteLaneCalls:
    """``pull_lanes`` and ``commit_offsets`` of :class:`gateway.broker_client.BrokerClient` over the RPC."""

    async def _call(self, broker: str, method: str, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError  # the client's own (RemoteBrokerClient._call)

    async def commit_offsets(self, broker: str, group: str, offsets: Sequence[tuple[str, int, int]]) -> None:
        await self._call(broker, "commit_offsets", group, [list(x) for x in offsets])

    async def pull_lanes(self, broker: str, reads: Sequence[tuple[str, int, int, int]]) -> list[GetResult | None]:
        blocks = await self._call(broker, "pull_lanes", [list(x) for x in reads])
        return [None if b is None else get_result_from_block(b) for b in blocks]
