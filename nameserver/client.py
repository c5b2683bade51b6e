"""Asking any of several nameservers: first that answers wins (they share nothing)."""

from __future__ import annotations

from typing import Any

from core_broker.remoting.client import PeerUnavailableError, RpcClient


def parse_addresses(spec: str) -> list[tuple[str, int]]:
    out = []
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        host, _, port = part.rpartition(":")
        out.append((host or "127.0.0.1", int(port)))
    if not out:
        raise ValueError(f"no nameserver address in {spec!r}")
    return out


class NameserverClient:
    def __init__(self, addresses: list[tuple[str, int]], rpc_timeout: float = 3.0) -> None:
        self.clients = [RpcClient(h, p, connect_timeout=rpc_timeout) for h, p in addresses]
        self.rpc_timeout = rpc_timeout

    async def call_any(self, method: str, *args: Any) -> Any:
        last: Exception | None = None
        for c in self.clients:
            try:
                return await c.call(method, *args, rpc_timeout=self.rpc_timeout)
            except PeerUnavailableError as e:
                last = e
        raise PeerUnavailableError(f"no nameserver answered: {last}")

    async def call_all(self, method: str, *args: Any) -> int:
        """Call every nameserver (registration); returns how many answered."""
        ok = 0
        for c in self.clients:
            try:
                await c.call(method, *args, rpc_timeout=self.rpc_timeout)
                ok += 1
            except PeerUnavailableError:
                pass
        return ok

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
