"""The listeners of a role's core: the nameserver, the broker's RPC port, a gateway's processor RPC.

They satisfy :class:`gateway.door.Door` like the protocol doors, so the node
starts, announces and stops them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from core_broker.broker_server import BrokerServer
from core_broker.replication.service import ReplicationConfig
from core_broker.config import BrokerConfig, StoreConfig
from core_broker.remoting.server import RpcServer
from gateway.processor import MessagingProcessor
from gateway.processor_rpc import PROCESSOR_METHODS, ProcessorRpcFacade
from nameserver.server import NameServer

from .group_member import GroupMember

__all__ = ["BrokerListener", "GroupSpec", "NameserverListener", "ProcessorRpcListener"]


class NameserverListener:
    name = "namesrv"

    def __init__(self, host: str, port: int, lease_s: float) -> None:
        self.host, self.port = host, port
        self.server = NameServer(lease_s)

    async def start(self) -> tuple[str, int]:
        return await self.server.start(self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop()


@dataclass(frozen=True)
class GroupSpec:
    """A broker's replicated group: who it is, where the controller is, how acks replicate."""

    group: str
    broker_id: str
    controllers: list[tuple[str, int]]
    heartbeat_ms: int
    priority: int
    replication: ReplicationConfig


class BrokerListener:
    """A broker (its store opened and recovered) served over RPC and registered with nameservers;
    in a replicated group, a member whose role the controller decides (unimq.group_member)."""

    name = "broker"

    def __init__(self, host: str, port: int, store: StoreConfig, broker: BrokerConfig,
                 nameservers: list[tuple[str, int]], heartbeat_s: float, group: GroupSpec | None = None,
                 advertise: str = "") -> None:
        self.host, self.port = host, port
        self.server = BrokerServer(store, broker, nameservers, heartbeat_s,
                                   replication=group.replication if group else None,
                                   broker_id=group.broker_id if group else "", advertise=advertise)
        self.member = (GroupMember(self.server, group.group, group.controllers, group.heartbeat_ms, group.priority)
                       if group else None)

    async def start(self) -> tuple[str, int]:
        try:
            addr = await self.server.start(self.host, self.port)
            if self.member is not None:
                await self.member.start()
            return addr
        except BaseException:  # the store opened before the RPC port failed: shut it down cleanly
            await self.server.stop()
            raise

    async def stop(self) -> None:
        if self.member is not None:
            await self.member.stop()
        await self.server.stop()


class ProcessorRpcListener:
    name = "rpc"

    def __init__(self, host: str, port: int, processor: MessagingProcessor) -> None:
        self.host, self.port = host, port
        self.facade = ProcessorRpcFacade(processor)
        self.server = RpcServer(self.facade, PROCESSOR_METHODS, "processor")

    async def start(self) -> tuple[str, int]:
        return await self.server.start(self.host, self.port)

    async def stop(self) -> None:
        self.facade.close()  # transaction checks not confirmed by a remote producer are lost
        await self.server.stop()
