"""``unimq nameserver``: the route registry alone (separated deployment)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import port_arg
from .controller import add_controller_arguments, start_controller
from .role import Role

if TYPE_CHECKING:
    from unimq.node import Node

__all__ = ["ROLE", "start_nameserver"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host")
    p.add_argument("--port", dest="namesrv_port", type=port_arg, metavar="N", help="default 9876; 0 = free port")
    p.add_argument("--lease-s", dest="nameserver_lease_s", type=float, metavar="S",
                   help="drop a broker not heard from for this long (default 120)")
    p.add_argument("--controller", dest="controller", action="store_true", default=None,
                   help="also run a controller node in this process (flags below)")
    add_controller_arguments(p)


async def start_nameserver(node: Node) -> tuple[str, int]:
    """Start a nameserver on ``namesrv_port``; returns its address."""
    from unimq.core_listeners import NameserverListener

    s = node.settings
    return await node.listen(NameserverListener(s.host, s.namesrv_port, s.nameserver_lease_s), "nameserver",
                             s.namesrv_port)


async def _start(node: Node) -> None:
    await start_nameserver(node)
    if node.settings.controller:
        await start_controller(node)


ROLE = Role(
    name="nameserver",
    command="nameserver",
    help="run a nameserver (separated deployment)",
    description="Run a nameserver: brokers register their topics with it, gateways ask it for routes.",
    add_arguments=_add_arguments,
    start=_start,
)
