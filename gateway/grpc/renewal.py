"""Auto-renewed invisibility for push consumers (ReceiveMessage with ``auto_renew``).

A push consumer receives without an invisible time and expects the server to
keep each message hidden while its listener runs, however long that is, and
then acks (or nacks with ChangeInvisibleDuration) with the receipt handle it
was given. RocketMQ 5's proxy does this by renewing the message's invisible
time itself and remembering, per handle it gave out, the newest handle the
broker issued; this module does the same over the processor's
``change_invisible``. Renewal stops when the client acks, nacks or
dead-letters the message, when the client is no longer heard from, or after
``max_renew_ms`` (then the message simply becomes visible again).

Connection state only: after a restart nothing is renewed, and messages come
back once their invisible time runs out, as after any consumer crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from core_broker.deadline_loop import DeadlineLoop
from core_broker.errors import UnimqError
from gateway.context import RequestContext
from gateway.api import MessagingAPI

log = logging.getLogger("unimq.grpc")


@dataclass
class _Held:
    ctx: RequestContext
    group: str
    topic: str
    handle: str  # the broker's newest handle for this delivery
    visible_at_ms: int
    until_ms: int  # stop renewing after this
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # a renewal in flight vs. the client's ack


class Renewer:
    def __init__(
        self,
        processor: MessagingAPI,
        client_alive: Callable[[str], bool],
        *,
        invisible_ms: int = 60_000,
        renew_ahead_ms: int = 10_000,
        max_renew_ms: int = 30 * 60_000,
        interval_s: float = 1.0,
    ) -> None:
        self.processor = processor
        self.client_alive = client_alive
        self.invisible_ms = invisible_ms
        self.renew_ahead_ms = renew_ahead_ms
        self.max_renew_ms = max_renew_ms
        self.interval_s = interval_s
        self.held: dict[str, _Held] = {}  # handle given to the client -> current state
        # every interval_s while something is held; asleep (no wake-ups) while nothing is
        self._loop = DeadlineLoop("unimq-grpc-renew", self._round, max_sleep_s=interval_s, first_delay_s=interval_s)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        self.held.clear()

    def hold(self, ctx: RequestContext, group: str, topic: str, handle: str, visible_at_ms: int) -> None:
        now = int(time.time() * 1000)
        if not self.held:
            self._loop.wake()
        self.held[handle] = _Held(ctx, group, topic, handle, visible_at_ms, now + self.max_renew_ms)

    async def release(self, client_handle: str) -> str:
        """Stop renewing; returns the handle to use with the broker now (the newest one)."""
        h = self.held.pop(client_handle, None)
        if h is None:
            return client_handle
        async with h.lock:  # wait for a renewal in flight: it changes the handle
            return h.handle

    async def renew_due(self) -> None:
        now = int(time.time() * 1000)
        for client_handle, h in list(self.held.items()):
            if h.visible_at_ms - now > self.renew_ahead_ms:
                continue
            if now >= h.until_ms or not self.client_alive(h.ctx.client_id):
                self.held.pop(client_handle, None)  # let it become visible again
                continue
            async with h.lock:
                try:
                    h.handle, h.visible_at_ms = await self.processor.change_invisible(
                        h.ctx, h.group, h.topic, h.handle, self.invisible_ms
                    )
                except UnimqError as e:  # acked through another path, or already redelivered
                    log.debug("stop renewing %s: %s", client_handle[:40], e)
                    self.held.pop(client_handle, None)

    async def _round(self) -> float | None:
        await self.renew_due()
        return self.interval_s if self.held else None
