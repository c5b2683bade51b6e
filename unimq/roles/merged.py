"""``unimq up``: one process with a nameserver, a broker and every door (the merged deployment).

The broker is served over RPC and registered with the embedded nameserver, so
extra stateless gateways can attach to a merged node (``unimq gateway
--namesrv <its nameserver>``); this process's own doors call the broker
in-process (``gateway.deployment.local_processor``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from core_broker.config import FlushMode

from .broker import start_broker
from .common import add_door_port_flags, add_tls_flags, port_arg
from .nameserver import start_nameserver
from .role import Role

if TYPE_CHECKING:
    from unimq.node import Node

__all__ = ["ROLE"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from core_broker.config import StoreConfig
    from unimq.settings import UnimqSettings

    defaults, store = UnimqSettings(), StoreConfig()
    p.add_argument("--data-dir", type=Path, metavar="DIR",
                   help=f"where the store keeps its files (default: {store.data_dir})")
    p.add_argument("--host", help=f"address every door binds to (default: {defaults.host})")
    add_door_port_flags(p)
    p.add_argument("--namesrv-port", dest="namesrv_port", type=port_arg, metavar="N",
                   help=f"nameserver port (extra gateways join with --namesrv HOST:N), 0 = pick a free one "
                        f"(default: {defaults.namesrv_port})")
    p.add_argument("--broker-port", dest="broker_port", type=port_arg, metavar="N",
                   help="the broker's internal RPC port (extra gateways reach it through the nameserver), "
                        "0 = pick a free one (default: 0)")
    p.add_argument("--flush", choices=[m.value for m in FlushMode],
                   help=f"async: ack from page cache; sync: ack after fsync, group commit (default: {store.flush.value})")
    add_tls_flags(p)


async def _start(node: Node) -> None:
    from gateway.deployment import local_processor
    from gateway.door import format_address
    from unimq.node import announce
    from unimq.roles.common import processor_config

    host, port = await start_nameserver(node)
    broker = await start_broker(node, [(host, port)])
    # The two listeners above are not for clients: say who they are for.
    announce(f"namesrv and broker are for extra gateways: unimq gateway --namesrv {format_address(host, port)}")
    processor = local_processor(broker.controller, processor_config(node.settings), owns=False)
    await processor.start()
    node.processor = processor


ROLE = Role(
    name="merged",
    command="up",
    help="run the broker with every door that exists",
    description=(
        "Run unimq: open the store, start every door, print 'unimq: <door> listening on HOST:PORT' "
        "per door and 'unimq: ready' when GET /healthz answers 200. SIGTERM/SIGINT shut down cleanly. "
        "Flags override the config file; a port of 0 picks a free port."
    ),
    add_arguments=_add_arguments,
    start=_start,
    serves_doors=True,
)
