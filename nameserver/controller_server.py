"""The controller role's door: a RaftController served over unimq's internal msgpack RPC (the
brokers' heartbeats never touch pysyncobj's port). A node that is not the Raft leader answers
NotLeaderError and the client asks the next address."""

from __future__ import annotations

from core_broker.remoting.server import RpcServer
from core_broker.remoting.wire import register_error
from nameserver.controller import DEFAULT_LEASE_MS, NotLeaderError, RaftController
from nameserver.controller_state import GroupNotFoundError
from nameserver.controller_wire import group_to_wire

register_error(NotLeaderError)
register_error(GroupNotFoundError)

METHODS = ["ctl_heartbeat", "ctl_alter_in_sync", "ctl_group_state", "ctl_cluster_state"]


class ControllerServer:
    def __init__(
        self,
        data_dir: str,
        raft_addr: str,
        peers: list[str],
        secret: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        allow_unclean_election: bool = False,
    ) -> None:
        self.backend = RaftController(data_dir, raft_addr, peers, secret, lease_ms, allow_unclean_election)
        self._rpc = RpcServer(self, METHODS, "controller")

    async def ctl_heartbeat(
        self, group: str, broker_id: str, addr: str, epoch: int, confirmed_offset: int, priority: int = 0
    ) -> dict[str, object]:
        return group_to_wire(await self.backend.heartbeat(group, broker_id, addr, epoch, confirmed_offset, priority))

    async def ctl_alter_in_sync(
        self, group: str, master_id: str, master_epoch: int, in_sync_epoch: int, new_in_sync: list[str]
    ) -> dict[str, object]:
        st = await self.backend.alter_in_sync(group, master_id, master_epoch, in_sync_epoch, frozenset(new_in_sync))
        return group_to_wire(st)

    async def ctl_group_state(self, group: str) -> dict[str, object]:
        return group_to_wire(await self.backend.group_state(group))

    async def ctl_cluster_state(self) -> dict[str, dict[str, object]]:
        groups = await self.backend.cluster_state()
        out = {}
        for name, st in groups.items():
            d = group_to_wire(st)
            d["offsets"] = {b: self.backend.reported_offset(name, b) for b in st.members}
            out[name] = d
        return out

    async def start(self, host: str, port: int) -> tuple[str, int]:
        await self.backend.start()
        return await self._rpc.start(host, port)

    async def stop(self) -> None:
        await self._rpc.stop()
        await self.backend.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m nameserver.controller_server`: one controller node until `unimq controller` exists."""
    import argparse
    import asyncio
    import signal

    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--raft-addr", required=True)
    ap.add_argument("--peers", default="")
    ap.add_argument("--secret", default=None)
    ap.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS)
    ap.add_argument("--allow-unclean-election", action="store_true")
    a = ap.parse_args(argv)
    peers = [p.strip() for p in a.peers.split(",") if p.strip()]

    async def run() -> None:
        server = ControllerServer(a.data_dir, a.raft_addr, peers, a.secret, a.lease_ms, a.allow_unclean_election)
        host, port = await server.start("127.0.0.1", a.port)
        print(f"controller listening on {host}:{port}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
        await server.stop()

    asyncio.run(run())


if __name__ == "__main__":
    main()
