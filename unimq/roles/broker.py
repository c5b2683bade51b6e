"""``unimq broker``: a broker (store + consumption semantics) registered with nameservers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from core_broker.config import FlushMode

from .common import port_arg
from .role import Role

if TYPE_CHECKING:
    from core_broker.broker_server import BrokerServer
    from unimq.node import Node

__all__ = ["ROLE", "start_broker"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, metavar="DIR")
    p.add_argument("--host")
    p.add_argument("--port", dest="broker_port", type=port_arg, metavar="N", help="broker RPC port; 0 = free port")
    p.add_argument("--namesrv", required=True, metavar="HOST:PORT[,HOST:PORT]")
    p.add_argument("--name", dest="broker.broker_name", metavar="NAME", help="broker name (default broker-a)")
    p.add_argument("--heartbeat-s", dest="heartbeat_s", type=float, metavar="S")
    p.add_argument("--flush", choices=[m.value for m in FlushMode])


async def start_broker(node: Node, nameservers: list[tuple[str, int]]) -> BrokerServer:
    """Open the store (recovering it), serve it over RPC on ``broker_port``, register with ``nameservers``."""
    from unimq.core_listeners import BrokerListener

    s = node.settings
    listener = BrokerListener(s.host, s.broker_port, s.store, s.broker, nameservers, s.heartbeat_s)
    await node.listen(listener, "broker RPC listener", s.broker_port)
    node.store = listener.server.controller.store
    return listener.server


async def _start(node: Node) -> None:
    from nameserver.client import parse_addresses

    await start_broker(node, parse_addresses(node.settings.namesrv))


ROLE = Role(
    name="broker",
    command="broker",
    help="run a broker registered with nameservers (separated deployment)",
    description="Run a broker: it holds a store, serves it over RPC and registers with the nameservers.",
    add_arguments=_add_arguments,
    start=_start,
    needs_namesrv=True,
)
