"""The CONNECT deadline of connections that have not sent one yet: one timer for all of them.

Why: a connection that opens TCP and sends no CONNECT is closed after ``connect_timeout_s``
(Mosquitto does the same). A timer per connection (``loop.call_later``, then its cancel at
CONNECT) cost about 1.5% of a gateway's CPU per CONNECT in a storm; here a connection is one
dict entry until its CONNECT, and one timer for the whole door sweeps those past their
deadline, at most every ``TICK`` seconds (a deadline is kept up to that late).

Entries are in the order connections came, which is their deadlines' order while the timeout
is unchanged; after a reload that shortens it, a sweep stops at the first entry not yet due,
so a later one may be closed that much late.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["ConnectDeadlines", "TICK"]

TICK = 0.1  # seconds: the shortest wait between two sweeps


class ConnectDeadlines:
    """Connections waiting for their CONNECT, each with the monotonic time it is due."""

    __slots__ = ("_due", "_handle")

    def __init__(self) -> None:
        self._due: dict[Connection, float] = {}
        self._handle: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._due)

    def add(self, conn: Connection, due: float) -> None:
        """Close ``conn`` at ``due`` (``time.monotonic()``) unless it is :meth:`discard` ed first."""
        self._due[conn] = due
        if self._handle is None:
            self._arm(due - time.monotonic())

    def discard(self, conn: Connection) -> None:
        """``conn`` sent its CONNECT (or is gone): no deadline any more."""
        self._due.pop(conn, None)

    def _arm(self, delay: float) -> None:
        self._handle = asyncio.get_running_loop().call_later(max(delay, TICK), self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        due = self._due
        now = time.monotonic()
        while due:
            conn, t = next(iter(due.items()))
            if t > now:
                self._arm(t - now)
                return
            del due[conn]
            conn.connect_timed_out()
