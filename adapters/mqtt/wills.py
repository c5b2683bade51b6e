"""Wills: the message a connection leaves behind when it goes away without a clean DISCONNECT.

MQTT 5 adds a Will Delay Interval (capped by the session expiry): the will is
published after the delay unless a new connection to the session comes first.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Coroutine

from gateway.context import RequestContext

from . import codec as C
from .mapping import PubItem
from .session import SESSION_NEVER_EXPIRES, Session

__all__ = ["Wills"]

Publish = Callable[[RequestContext, str, list[C.Publish]], Awaitable[Any]]


class Wills:
    """Publishes wills, at once or after their delay, through the door's publish path."""

    __slots__ = ("spawn", "publish")

    def __init__(self, spawn: Callable[[Coroutine[Any, Any, Any]], Any], publish: Publish) -> None:
        self.spawn = spawn
        self.publish = publish

    def gone(self, s: Session, will: C.Will, v5: bool) -> None:
        """``s``'s connection went away and its will is due."""
        delay = will.properties.get("will_delay_interval", 0) if v5 else 0
        delay = min(delay, s.expiry) if s.expiry != SESSION_NEVER_EXPIRES else delay
        if delay > 0:
            s.will_handle = asyncio.get_running_loop().call_later(delay, self._fire, s, will)
        else:
            self.spawn(self._publish(s.client_id, s.ctx.principal, will))

    @staticmethod
    def cancel(s: Session) -> None:
        """A new connection to ``s`` (or its end) cancels a delayed will."""
        if s.will_handle is not None:
            s.will_handle.cancel()
            s.will_handle = None

    def _fire(self, s: Session, will: C.Will) -> None:
        s.will_handle = None
        self.spawn(self._publish(s.client_id, s.ctx.principal, will))

    async def _publish(self, cid: str, principal: str | None, will: C.Will) -> None:
        props = dict(will.properties)
        props.pop("will_delay_interval", None)
        ctx = RequestContext(protocol="mqtt", client_id=cid, principal=principal)  # published as its client
        await self.publish(ctx, cid, [PubItem(will.topic, will.payload, will.qos, will.retain, props or None)])
