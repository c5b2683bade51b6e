"""What brokers use to reach the controller: any of its nodes' RPC addresses; a node that is not
the Raft leader (or is down) is skipped and the next is asked."""

from __future__ import annotations

from typing import Any

from core_broker.remoting.client import PeerUnavailableError, RpcClient
from core_broker.remoting.wire import register_error
from nameserver.controller_state import GroupNotFoundError, GroupState, NotLeaderError
from nameserver.controller_wire import group_from_wire

register_error(NotLeaderError)
register_error(GroupNotFoundError)

__all__ = ["ControllerClient", "GroupState"]


class ControllerClient:
    def __init__(self, addresses: list[tuple[str, int]], timeout_s: float = 3.0) -> None:
        self.addresses = addresses
        self.timeout_s = timeout_s
        self._clients: list[RpcClient] = []
        self._preferred = 0

    async def start(self) -> None:
        self._clients = [RpcClient(h, p, connect_timeout=self.timeout_s) for h, p in self.addresses]

    async def stop(self) -> None:
        for c in self._clients:
            await c.close()
        self._clients = []

    async def _call(self, method: str, *args: Any) -> Any:
        last: Exception | None = None
        n = len(self._clients)
        for i in range(n):
            k = (self._preferred + i) % n
            try:
                result = await self._clients[k].call(method, *args, rpc_timeout=self.timeout_s)
            except (NotLeaderError, PeerUnavailableError, TimeoutError) as e:
                last = e
                continue
            self._preferred = k
            return result
        raise PeerUnavailableError(f"no controller leader answered: {last}")

    async def heartbeat(
        self, group: str, broker_id: str, addr: str, epoch: int, confirmed_offset: int, priority: int = 0
    ) -> GroupState:
        return group_from_wire(await self._call("ctl_heartbeat", group, broker_id, addr, epoch, confirmed_offset, priority))

    async def alter_in_sync(
        self, group: str, master_id: str, master_epoch: int, in_sync_epoch: int, new_in_sync: frozenset[str]
    ) -> GroupState:
        """Raises core_broker.errors.StaleEpochError on a stale quote."""
        d = await self._call("ctl_alter_in_sync", group, master_id, master_epoch, in_sync_epoch, sorted(new_in_sync))
        return group_from_wire(d)

    async def group_state(self, group: str) -> GroupState:
        return group_from_wire(await self._call("ctl_group_state", group))

    async def cluster_state(self) -> dict[str, GroupState]:
        d = await self._call("ctl_cluster_state")
        return {name: group_from_wire(g) for name, g in d.items()}

    async def cluster_report(self) -> dict[str, dict[str, Any]]:
        """cluster_state plus each member's last reported confirmed offset (for `cluster status`)."""
        result: dict[str, dict[str, Any]] = await self._call("ctl_cluster_state")
        return result
