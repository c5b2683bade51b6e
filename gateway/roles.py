"""The process roles of unimq and the core each one starts before its doors.

- ``merged`` (``unimq up``): a nameserver, one broker served over RPC and
  registered with it, and a processor calling that broker in-process. Extra
  stateless gateways can attach to a merged node through its nameserver.
- ``gateway`` (``unimq gateway``): a processor over a RemoteBrokerClient, plus
  the processor RPC port (what the separated test suite and tools call).
- ``broker`` (``unimq broker``): a BrokerServer registered with nameservers.
- ``nameserver`` (``unimq nameserver``): the route registry alone.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from core_broker.broker_server import BrokerServer
from core_broker.remoting.server import RpcServer
from nameserver.client import parse_addresses
from nameserver.server import NameServer

from .broker_client import LocalBrokerClient
from .processor import MessagingProcessor, ProcessorConfig
from .processor_rpc import PROCESSOR_METHODS, ProcessorRpcFacade
from .remote_broker_client import RemoteBrokerClient

log = logging.getLogger("unimq.roles")


class NameserverDoor:
    name = "namesrv"

    def __init__(self, host: str, port: int, lease_s: float) -> None:
        self.host, self.port = host, port
        self.server = NameServer(lease_s)

    async def start(self) -> tuple[str, int]:
        return await self.server.start(self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop()


class BrokerDoor:
    name = "broker"

    def __init__(self, settings: Any, nameservers: list[tuple[str, int]]) -> None:
        self.host = settings.host
        self.port = settings.broker_port
        self.server = BrokerServer(settings.store, settings.broker, nameservers, settings.heartbeat_s)

    async def start(self) -> tuple[str, int]:
        return await self.server.start(self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop()


class ProcessorRpcDoor:
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


def processor_config(settings: Any) -> ProcessorConfig:
    return ProcessorConfig(
        auto_create_topics=settings.auto_create_topics,
        default_queue_count=settings.default_queue_count,
        max_message_size=settings.store.max_message_size,
    )


async def start_core(settings: Any, state: Any, started: list, announce: Callable[[str, tuple[str, int]], None]) -> None:
    """Start the role's core pieces (appending each to ``started``) and set state.processor."""
    role = settings.role

    async def bring_up(door: Any) -> tuple[str, int]:
        addr = await door.start()
        started.append(door)
        announce(door.name, addr)
        return addr

    if role == "nameserver":
        await bring_up(NameserverDoor(settings.host, settings.namesrv_port, settings.nameserver_lease_s))
        return
    if role in ("merged", "broker"):
        if role == "merged":
            h, p = await bring_up(NameserverDoor(settings.host, settings.namesrv_port, settings.nameserver_lease_s))
            nameservers = [(h, p)]
        else:
            nameservers = parse_addresses(settings.namesrv)
        broker = BrokerDoor(settings, nameservers)
        await bring_up(broker)
        state.store = broker.server.controller.store
        if role == "broker":
            state.broker = broker.server
            return
        processor = MessagingProcessor(LocalBrokerClient(broker.server.controller, owns=False), processor_config(settings))
        await processor.start()
        state.processor = processor
        return
    if role == "gateway":
        client = RemoteBrokerClient(parse_addresses(settings.namesrv))
        processor = MessagingProcessor(client, processor_config(settings))
        await processor.start()
        await _wait_for_brokers(client)
        state.processor = processor
        await bring_up(ProcessorRpcDoor(settings.host, settings.rpc_port, processor))
        return
    raise ValueError(f"unknown role {role!r}")


async def _wait_for_brokers(client: RemoteBrokerClient, timeout_s: float = 60.0) -> None:
    """A gateway is ready once some broker is registered (doors load their state from one)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await client.list_brokers(refresh=True):
                return
        except Exception as e:  # nameservers not up yet
            last = e
        else:
            last = None
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no broker registered with the nameservers within {timeout_s:.0f}s ({last})")
        log.info("waiting for a broker to register with the nameservers")
        await asyncio.sleep(0.2)
