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
    g = p.add_argument_group("replicated group (README: Replicated broker groups)")
    g.add_argument("--group", metavar="G", help="join replicated broker group G (its role comes from the controller)")
    g.add_argument("--broker-id", dest="broker_id", metavar="ID", help="this member's id in the group (stable)")
    g.add_argument("--controller-addr", dest="controller_addr", metavar="HOST:PORT[,HOST:PORT]",
                   help="the controller (unimq controller / unimq nameserver --controller)")
    g.add_argument("--min-insync-replicas", dest="min_insync_replicas", type=int, metavar="N",
                   help="members (master included) holding a put before it is acknowledged (default 1)")
    p.add_argument("--advertise", dest="broker_advertise", metavar="HOST:PORT",
                   help="the address others reach this broker at, when not its own (NAT, a proxy)")
    g.add_argument("--priority", dest="broker_priority", type=int, metavar="N",
                   help="elections: among equally advanced members the higher priority wins")


async def start_broker(node: Node, nameservers: list[tuple[str, int]]) -> BrokerServer:
    """Open the store (recovering it), serve it over RPC on ``broker_port``, register with ``nameservers``."""
    from unimq.core_listeners import BrokerListener, GroupSpec

    s = node.settings
    group = None
    if s.group:
        from core_broker.replication.service import ReplicationConfig
        from nameserver.client import parse_addresses

        s.broker.broker_name = s.group  # the group's name is what nameservers route to
        group = GroupSpec(
            s.group, s.broker_id, parse_addresses(s.controller_addr), s.group_heartbeat_ms, s.broker_priority,
            ReplicationConfig(
                min_insync_replicas=s.min_insync_replicas, replica_lag_max_ms=s.replica_lag_max_ms,
                replica_lag_max_bytes=s.replica_lag_max_bytes, ack_timeout_ms=s.replica_ack_timeout_ms,
                read_from_replica=s.read_from_replica,
                async_replicas=frozenset(b.strip() for b in s.async_replicas.split(",") if b.strip()),
            ),
        )
    listener = BrokerListener(s.host, s.broker_port, s.store, s.broker, nameservers, s.heartbeat_s, group,
                              s.broker_advertise)
    await node.listen(listener, "broker RPC listener", s.broker_port)
    node.store = listener.server.controller.store
    # message traces: the broker records its own retries and dead letters (core_broker/trace_log.py)
    listener.server.controller.pops.trace.default = float(s.trace_sample_rate)
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
