"""``unimq cluster status``: every broker group as the controller knows it, over its RPC."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from core_broker.remoting import auth
from nameserver.client import parse_addresses


def add_parser(sub: Any) -> Any:
    """Register ``cluster status``; returns the actions so the application adds ``cluster up``."""
    cluster = sub.add_parser("cluster", help="replicated broker groups: status (asks the controller), up",
                             description="Broker groups: master, epoch, in-sync set, each member's offset and lag.")
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    actions.required = True
    status = actions.add_parser("status", help="print every group")
    status.add_argument("--controller", default="127.0.0.1:9880", metavar="HOST:PORT,...",
                        help="controller RPC addresses (default 127.0.0.1:9880)")
    status.add_argument("--timeout", type=float, default=3.0)
    auth.add_flags(status)  # the controller's port asks for the cluster's credentials when it has them
    return actions


def format_report(report: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, g in sorted(report.items()):
        lines.append(f"group {name}: master {g['master_id'] or '(none)'} at {g['master_addr'] or '-'}"
                     f" epoch {g['master_epoch']}; in-sync {','.join(g['in_sync']) or '-'}"
                     f" (epoch {g['in_sync_epoch']})")
        offsets: dict[str, int | None] = g.get("offsets", {})
        master_off = offsets.get(g["master_id"]) if g["master_id"] else None
        for b, addr in sorted(g["members"].items()):
            off = offsets.get(b)
            lag = master_off - off if master_off is not None and off is not None else None
            role = "master" if b == g["master_id"] else ("in-sync" if b in g["in_sync"] else "out-of-sync")
            lines.append(f"  {b} {addr} {role} offset {'-' if off is None else off}"
                         f" lag {'-' if lag is None else lag}")
    return "\n".join(lines) if lines else "no broker groups"


def run(args: argparse.Namespace) -> int:
    from nameserver.controller_client import ControllerClient  # on use: `unimq --help` stays light

    try:
        auth.configure(auth.from_settings(args.cluster_secret or "", args.cluster_secret_file or "",
                                          args.rpc_tls_cert or "", args.rpc_tls_key or "", args.rpc_tls_ca or ""))
    except ValueError as exc:
        print(f"unimq: error: {exc}")
        return 2

    async def go() -> dict[str, dict[str, Any]]:
        client = ControllerClient(parse_addresses(args.controller), timeout_s=args.timeout)
        await client.start()
        try:
            return await client.cluster_report()
        finally:
            await client.stop()

    try:
        report = asyncio.run(go())
    except Exception as exc:  # noqa: BLE001  (a CLI: one line, no traceback)
        print(f"unimq: error: {exc}")
        return 1
    print(format_report(report))
    return 0
