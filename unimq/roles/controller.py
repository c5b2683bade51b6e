"""``unimq controller``: one node of the broker groups' controller (Raft via pysyncobj)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import port_arg
from .role import Role

if TYPE_CHECKING:
    from unimq.node import Node

__all__ = ["ROLE", "add_controller_arguments", "start_controller"]


def add_controller_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--controller-port", dest="controller_port", type=port_arg, metavar="N",
                   help="controller RPC port for brokers (default 9880)")
    p.add_argument("--data-dir", dest="controller_data_dir", metavar="D", help="Raft journal and snapshots")
    p.add_argument("--raft-addr", dest="controller_raft_addr", metavar="HOST:PORT",
                   help="this node's Raft address (default 127.0.0.1:9881)")
    p.add_argument("--peers", dest="controller_peers", metavar="HOST:PORT,...",
                   help="every controller node's Raft address; empty: a single node")
    p.add_argument("--secret", dest="controller_secret", metavar="S", help="pysyncobj password (set it)")
    p.add_argument("--lease-ms", dest="controller_lease_ms", type=int, metavar="MS",
                   help="replace a master silent this long (default 2500)")
    p.add_argument("--allow-unclean-election", dest="allow_unclean_election", action="store_true", default=None)


class _ControllerListener:
    name = "controller"

    def __init__(self, node: Node) -> None:
        from nameserver.controller_server import ControllerServer

        s = node.settings
        peers = [x.strip() for x in s.controller_peers.split(",") if x.strip()] or [s.controller_raft_addr]
        self.host, self.port = s.host, s.controller_port
        self.server = ControllerServer(s.controller_data_dir, s.controller_raft_addr, peers,
                                       s.controller_secret or None, s.controller_lease_ms, s.allow_unclean_election)

    async def start(self) -> tuple[str, int]:
        return await self.server.start(self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop()


async def start_controller(node: Node) -> tuple[str, int]:
    return await node.listen(_ControllerListener(node), "controller", node.settings.controller_port)


ROLE = Role(
    name="controller",
    command="controller",
    help="run a controller node (masters and in-sync sets of broker groups)",
    description="Run one controller node: Raft (pysyncobj) over --peers, brokers heartbeat it on --controller-port.",
    add_arguments=add_controller_arguments,
    start=start_controller,
)
