"""`unimq nameserver`: the route registry, served over unimq RPC."""

from __future__ import annotations

import asyncio
import logging

from core_broker.remoting.server import RpcServer

from .route_table import RouteTable

log = logging.getLogger("unimq.nameserver")


class NameServer:
    def __init__(self, lease_s: float = 120.0) -> None:
        self.table = RouteTable(lease_s)
        self._rpc = RpcServer(self, ["register_broker", "unregister_broker", "query_route", "list_brokers"], "nameserver")
        self._expiry: asyncio.Task | None = None

    # -- remote methods
    def register_broker(self, name: str, address: str, perm: int, topics: dict, replicated: bool = False,
                        epoch: int = 0) -> dict:
        old = self.table.brokers.get(name)
        if not self.table.register(name, address, perm, topics, replicated=replicated, epoch=epoch):
            return {"lease_s": self.table.lease_s, "stale": True}
        if old is not None and old.address != address:
            log.warning("broker %s moved from %s to %s (a new master of its group)", name, old.address, address)
        if old is None:
            log.info("broker %s registered at %s with %d topics", name, address, len(topics))
        return {"lease_s": self.table.lease_s}

    def unregister_broker(self, name: str) -> None:
        self.table.unregister(name)

    def query_route(self, topic: str) -> dict | None:
        return self.table.route(topic)

    def list_brokers(self) -> list[dict]:
        return self.table.list_brokers()

    # -- lifecycle
    async def start(self, host: str, port: int) -> tuple[str, int]:
        addr = await self._rpc.start(host, port)
        self._expiry = asyncio.ensure_future(self._expire_loop())
        return addr

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.table.lease_s / 4))
            for n in self.table.expire():
                log.warning("broker %s missed its lease; dropped from routes", n)

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        await self._rpc.stop()
