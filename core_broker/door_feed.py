"""The door-state feed: what changed in the doors' key-value state, and notes between gateways.

Why: several gateways serve one set of MQTT sessions (issue 21). Each keeps in memory
what it routes by (sessions' subscriptions, retained messages), so it must learn of
another gateway's writes; and a gateway that stored a message into the queue of a
session connected at another gateway must tell that gateway to read it. Brokers are
what every gateway already talks to, and they see every door-state write, so the
feed is theirs: a gateway long-polls :meth:`DoorFeed.watch` on every broker with the
sequence number it has seen, and gets the keys changed since (with their versioned
values, read by the caller), plus the notes other gateways left for it
(:meth:`DoorFeed.notify`). Brokers need not know gateways' addresses.

In memory only, by design: a broker's feed starts again with a new ``incarnation``
after a restart (or a promotion), and a watcher that sees another incarnation than it
knew is given everything (``full``). Notes are handed out once (read this queue now);
a gateway whose watch call failed reads its connected sessions' lanes again, so a note
lost with an answer is not a delivery lost (``adapters/mqtt/fleet.py``).
Hand-written because it is thirty lines over the broker's own state.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from typing import Any, Protocol

__all__ = ["DoorFeed", "MAX_NOTES", "VersionedKv"]


class VersionedKv(Protocol):
    """Where the feed reads the values of the keys it reports (the broker's door state)."""

    def kv_items_versioned(self, namespace: str) -> dict[str, tuple[int, bytes | None]]: ...
    def kv_get_versioned(self, namespace: str, key: str) -> tuple[int, bytes | None]: ...

MAX_NOTES = 100_000  # per gateway: one that never comes back must not fill memory


class DoorFeed:
    """Sequence-numbered door-state changes and per-gateway notes, for long-polling gateways."""

    __slots__ = ("incarnation", "seq", "changed", "writers", "notes", "watchers", "_waiters")

    def __init__(self) -> None:
        self.incarnation = secrets.token_hex(8)
        self.seq = 0
        # namespace -> key -> seq of its last change, in that order (a plain dict, the key moved to
        # the end by taking it out first: an OrderedDict's links cost ~100 bytes more per key, and
        # a fleet's brokers hold a key per device: issue 21's memory)
        self.changed: dict[str, dict[str, int]] = {}
        # namespace -> key -> the gateway that made its last change, when it said so: that gateway
        # is not sent its own write back (it knows it; in a storm that halves what the feed sends)
        self.writers: dict[str, dict[str, str]] = {}
        self.notes: dict[str, deque[Any]] = {}  # gateway id -> notes left for it
        self.watchers: dict[str, float] = {}  # gateway id -> when its last watch call ended
        self._waiters: set[asyncio.Future[None]] = set()

    def kv_changed(self, namespace: str, key: str, writer: str = "") -> None:
        ws = self.writers.get(namespace)
        if writer:
            if ws is None:
                ws = self.writers[namespace] = {}
            ws[key] = writer
        elif ws:
            ws.pop(key, None)
        self.seq += 1
        od = self.changed.get(namespace)
        if od is None:
            od = self.changed[namespace] = {}
        else:
            od.pop(key, None)
        od[key] = self.seq
        self._wake()

    def notify(self, gateway: str, notes: list[Any]) -> None:
        q = self.notes.get(gateway)
        if q is None:
            q = self.notes[gateway] = deque(maxlen=MAX_NOTES)
        q.extend(notes)
        self._wake()

    def _wake(self) -> None:
        if self._waiters:
            for f in self._waiters:
                if not f.done():
                    f.set_result(None)
            self._waiters.clear()

    def since(self, namespaces: list[str], seq: int, gateway: str = "") -> dict[str, list[str]]:
        """Keys of ``namespaces`` changed after ``seq`` (newest change last), but those whose last
        change ``gateway`` made itself."""
        out: dict[str, list[str]] = {}
        for ns in namespaces:
            od = self.changed.get(ns)
            if not od:
                continue
            writers = self.writers.get(ns) if gateway else None
            keys = []
            for k, s in reversed(od.items()):
                if s <= seq:
                    break
                if writers and writers.get(k) == gateway:
                    continue
                keys.append(k)
            if keys:
                out[ns] = keys[::-1]
        return out

    def live(self, gateway: str, within_s: float) -> list[str]:
        """The gateways polling this feed (``gateway`` now, the others within ``within_s``)."""
        now = time.monotonic()
        self.watchers[gateway] = now
        gone = [g for g, at in self.watchers.items() if now - at > max(within_s, 60.0)]
        for g in gone:
            del self.watchers[g]
            self.notes.pop(g, None)  # nobody will take them
        return [g for g, at in self.watchers.items() if now - at <= within_s]

    async def wait(self, gateway: str, namespaces: list[str], seq: int, timeout_s: float) -> None:
        """Until something for ``gateway`` is newer than ``seq`` (not its own writes), or
        ``timeout_s`` passed."""
        self.watchers[gateway] = time.monotonic()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        checked = seq  # changes up to here were all ``gateway``'s own: not looked at again
        while not (self.notes.get(gateway) or self.since(namespaces, checked, gateway)):
            checked = self.seq
            left = deadline - loop.time()
            if left <= 0:
                return
            f: asyncio.Future[None] = loop.create_future()
            self._waiters.add(f)
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for returns the result when a cancel
                # arrives as ``f`` completes, swallowing the cancel (a gateway's stop then hung)
                async with asyncio.timeout(left):
                    await f
            except TimeoutError:
                return
            finally:
                self._waiters.discard(f)

    async def watch(self, gateway: str, namespaces: list[str], incarnation: str, seq: int, timeout_s: float,
                    kv: VersionedKv) -> dict[str, Any]:
        """Door-state changes after ``seq`` of feed ``incarnation`` (everything when that is not
        this feed any more), with their versioned values from ``kv``; the notes left for
        ``gateway``; the gateways polling. Waits up to ``timeout_s`` (30 s at most) for a change."""
        full = incarnation != self.incarnation
        if not full:
            await self.wait(gateway, namespaces, seq, min(max(timeout_s, 0.0), 30.0))
        out: dict[str, dict[str, tuple[int, bytes | None]]] = {}
        if full:
            for ns in namespaces:
                out[ns] = kv.kv_items_versioned(ns)
        else:
            for ns, keys in self.since(namespaces, seq, gateway).items():
                out[ns] = {k: kv.kv_get_versioned(ns, k) for k in keys}
        # a gateway polls again at once, so one not heard of for three long polls is gone
        return {"inc": self.incarnation, "seq": self.seq, "full": full, "kv": out,
                "notes": self.take_notes(gateway), "gateways": self.live(gateway, max(timeout_s, 1.0) * 3)}

    def take_notes(self, gateway: str) -> list[Any]:
        q = self.notes.pop(gateway, None)
        return list(q) if q else []
