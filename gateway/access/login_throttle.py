"""Repeated failed logins from one address are slowed down (issue 19, traffic control).

Password guessing against a door costs the guesser one round trip per try; after
``failures`` failed logins within ``window_s`` from one IP address at one door, that
address's next login attempts there wait before they are answered: 0.1 s, doubling with
every further failure, at most ``max_delay_s``. The wait is an ``asyncio.sleep`` on the
attempt's own connection or request, so other clients (and other addresses) are not held
up. Loopback addresses are left alone unless asked for (``loopback=True``): behind a
local proxy every client shares its address, and one guesser would slow them all down.
A successful login clears the address's count; counts older than the window are
forgotten. Memory is bounded: at most ``MAX_ADDRESSES`` addresses per door are tracked,
the least recently failed dropped first.

Sans-io (the clock is a parameter) and hand-written: a few lines of counting per (door,
address), which no rate-limit library fits without its own storage and middleware.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import Callable

__all__ = ["LoginThrottle", "address_of"]

MAX_ADDRESSES = 10_000
FIRST_DELAY_S = 0.1


def address_of(peer: str) -> str:
    """The IP address of a peer written ``ip:port``, ``[v6]:port``, a bare v6 address or an IP."""
    if peer.startswith("["):
        return peer[1:].partition("]")[0]
    if peer.count(":") == 1:
        return peer.partition(":")[0]
    return peer


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:  # not an IP (a Unix socket's peer, ""): nothing to count it under
        return True


class LoginThrottle:
    """Per (door, IP address): failed logins in the window, and the delay the next attempt waits."""

    def __init__(self, failures: int = 5, window_s: float = 60.0, max_delay_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_delay: Callable[[str], None] | None = None, loopback: bool = False) -> None:
        self.failures = failures  # 0: never slow anyone down
        self.window_s = window_s
        self.max_delay_s = max_delay_s
        self.clock = clock
        self.on_delay = on_delay  # called with the door's name for every attempt made to wait
        self.loopback = loopback  # also count loopback addresses' failures
        self._seen: dict[tuple[str, str], tuple[int, float]] = {}  # (door, ip) -> (failures, first failure)

    def delay(self, door: str, peer: str) -> float:
        """Seconds an attempt from ``peer`` at ``door`` waits before it is answered (0: none)."""
        if self.failures <= 0 or not self._seen:
            return 0.0
        key = (door, address_of(peer))
        got = self._seen.get(key)
        if got is None:
            return 0.0
        count, since = got
        if self.clock() - since > self.window_s:
            del self._seen[key]
            return 0.0
        if count < self.failures:
            return 0.0
        return min(self.max_delay_s, FIRST_DELAY_S * 2.0 ** (count - self.failures))

    async def wait(self, door: str, peer: str) -> None:
        """Sleep for :meth:`delay` (only this attempt's task waits)."""
        d = self.delay(door, peer)
        if d > 0:
            if self.on_delay is not None:
                self.on_delay(door)
            await asyncio.sleep(d)

    def failed(self, door: str, peer: str) -> None:
        if self.failures <= 0:
            return
        ip = address_of(peer)
        if not self.loopback and _is_loopback(ip):
            return
        key = (door, ip)
        now = self.clock()
        got = self._seen.pop(key, None)
        if got is None or now - got[1] > self.window_s:
            got = (0, now)
        self._seen[key] = (got[0] + 1, got[1])  # re-inserted: the dict's order is the eviction order
        if len(self._seen) > MAX_ADDRESSES:
            del self._seen[next(iter(self._seen))]

    def succeeded(self, door: str, peer: str) -> None:
        if self._seen:
            self._seen.pop((door, address_of(peer)), None)
