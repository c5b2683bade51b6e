"""HTTP connections under the traffic limits: a keep-alive TCP connection holds a connection slot.

Why here and not in the routes: the connection limits and the connection rate
of ``gateway.access.traffic`` count connections, and an HTTP request alone does
not say which connection it came on or when that ends. As for client
certificates (``http_certs``), the door's HTTP protocol class is extended to
note each open connection under its peer address (``scope["client"]``) and to
release its slot when it is lost; the login middleware (``http_auth``) takes
the slot at the connection's first request, for the user that request logged
in as (a connection counts for the user of its first request), and answers 429
``TOO_MANY_REQUESTS`` with ``Retry-After`` and ``Connection: close`` when a
limit refuses it.
"""

from __future__ import annotations

from typing import Any

from gateway.access.traffic import Lease, QuotaExceededError, TrafficControl

__all__ = ["PeerLeases"]


class PeerLeases:
    """(peer host, peer port) of each open connection -> its connection slot (None until its first request)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], Lease | None] = {}

    def opened(self, key: tuple[str, int]) -> None:
        self.open[key] = None

    def lost(self, key: tuple[str, int]) -> None:
        lease = self.open.pop(key, None)
        if lease is not None:
            lease.release()

    def admit(self, traffic: TrafficControl, client: Any, principal: str | None) -> None:
        """Take the connection's slot at its first request; QuotaExceededError when a limit refuses it.

        A request on a connection the table does not know (already lost, or not noted) is let through."""
        if not client:
            return
        key = (client[0], client[1])
        if key not in self.open or self.open[key] is not None:
            return
        self.open[key] = traffic.connect(principal, "", address=client[0])
