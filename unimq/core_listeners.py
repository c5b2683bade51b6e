"""The listeners of a role's core: the nameserver, the broker's RPC port, a gateway's processor RPC.

They satisfy :class:`gateway.door.Door` like the protocol doors, so the node
starts, announces and stops them the same way.
"""

from __future__ import annotations

from core_broker.broker_server import BrokerServer
from core_broker.config import BrokerConfig, StoreConfig
from core_broker.remoting.server import RpcServer
from gateway.processor import MessagingProcessor
from gateway.processor_rpc import PROCESSOR_METHODS, ProcessorRpcFacade
from nameserver.server import NameServer

__all__ = ["BrokerListener", "NameserverListener", "ProcessorRpcListener"]


class NameserverListener:
    name = "namesrv"

    def __init__(self, host: str, port: int, lease_s: float) -> None:
        self.host, self.port = host, port
        self.server = NameServer(lease_s)

    async def start(self) -> tuple[str, int]:
        return await self.server.start(self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop()


class BrokerListener:
    """A broker (its store opened and recovered) served over RPC and registered with nameservers."""

    name = "broker"

    def __init__(self, host: str, port: int, store: StoreConfig, broker: BrokerConfig,
                 nameservers: list[tuple[str, int]], heartbeat_s: float) -> None:
        self.host, self.port = host, port
        self.server = BrokerServer(store, broker, nameservers, heartbeat_s)

    async def start(self) -> tuple[str, int]:
        try:
            return await self.server.start(self.host, self.port)
        except BaseException:  # the store opened before the RPC port failed: shut it down cleanly
            await self.server.stop()
            raise

    async def stop(self) -> None:
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
