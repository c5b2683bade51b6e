"""``unimq gateway``: a stateless gateway (processor + doors) in front of brokers found through nameservers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .common import add_door_port_flags, add_tls_flags, port_arg

from .role import Role

if TYPE_CHECKING:
    from gateway.remote_broker_client import RemoteBrokerClient
    from unimq.node import Node

__all__ = ["ROLE"]

log = logging.getLogger("unimq.roles")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host")
    p.add_argument("--namesrv", required=True, metavar="HOST:PORT[,HOST:PORT]")
    p.add_argument("--rpc-port", dest="rpc_port", type=port_arg, metavar="N", help="processor RPC port")
    add_door_port_flags(p)
    add_tls_flags(p)


async def _start(node: Node) -> None:
    from gateway.processor import MessagingProcessor
    from gateway.remote_broker_client import RemoteBrokerClient
    from nameserver.client import parse_addresses
    from unimq.core_listeners import ProcessorRpcListener
    from unimq.roles.common import processor_config

    s = node.settings
    client = RemoteBrokerClient(parse_addresses(s.namesrv))
    processor = MessagingProcessor(client, processor_config(s))
    await processor.start()
    node.processor = processor
    await _wait_for_brokers(client)
    await node.listen(ProcessorRpcListener(s.host, s.rpc_port, processor), "processor RPC listener", s.rpc_port)


async def _wait_for_brokers(client: RemoteBrokerClient, timeout_s: float = 60.0) -> None:
    """A gateway is ready once some broker is registered (doors load their state from one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await client.list_brokers(refresh=True):
                return
        except Exception as e:  # nameservers not up yet
            last: Exception | None = e
        else:
            last = None
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no broker registered with the nameservers within {timeout_s:.0f}s ({last})")
        log.info("waiting for a broker to register with the nameservers")
        await asyncio.sleep(0.2)


ROLE = Role(
    name="gateway",
    command="gateway",
    help="run a stateless gateway in front of brokers (separated deployment)",
    description="Run a gateway: the protocol doors and a processor calling the brokers the nameservers know.",
    add_arguments=_add_arguments,
    start=_start,
    needs_namesrv=True,
    serves_doors=True,
)
