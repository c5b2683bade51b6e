"""Grouping single sends to a batch topic into batches within a bounded linger (``batch.linger_ms``).

Why: most producers send one message per request (an MQTT publish, an AMQP basic.publish, a
CloudEvent); a batch topic stores a batch as one record, so the gateway may hold each single
send up to ``batch.linger_ms`` to let others to the same topic join it, then store them with one
send call (one record). The price is latency: every send waits up to the linger (0: off, the
default), and is answered when its batch is stored. A full batch (``max_batch``) goes at once.
Each message is checked against its own sender's rights and stamped with its own door before it
waits (the processor does that); a waiter cancelled meanwhile does not take its message back.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

from core_broker.model import Message

from .api import SendResult

__all__ = ["Linger", "Gathered"]


class Gathered(list):
    """The messages of one gathered batch: a send of them never lingers again (one may be alone)."""

Send = Callable[[Any, Sequence[Message]], Awaitable[list[SendResult]]]


class _Slot:
    __slots__ = ("ctx", "messages", "waiters")

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.messages: list[Message] = []
        self.waiters: list[asyncio.Future[SendResult]] = []


class Linger:
    """Per topic, the batch being gathered and when it goes."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._open: dict[str, _Slot] = {}
        self._tasks: set[asyncio.Task] = set()

    async def add(self, ctx: Any, m: Message, linger_ms: int, send: Send) -> SendResult:
        loop = asyncio.get_running_loop()
        slot = self._open.get(m.topic)
        if slot is None:
            slot = self._open[m.topic] = _Slot(ctx)
            loop.call_later(linger_ms / 1000.0, self._go, m.topic, slot, send)
        fut: asyncio.Future[SendResult] = loop.create_future()
        slot.messages.append(m)
        slot.waiters.append(fut)
        if len(slot.messages) >= self.max_batch:
            self._go(m.topic, slot, send)
        return await fut

    def _go(self, topic: str, slot: _Slot, send: Send) -> None:
        if self._open.get(topic) is not slot:
            return  # gone already (full before its linger ran out)
        del self._open[topic]
        t = asyncio.ensure_future(self._flush(slot, send))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _flush(slot: _Slot, send: Send) -> None:
        try:
            results = await send(slot.ctx, Gathered(slot.messages))
        except Exception as e:  # every waiter gets the store's answer
            for f in slot.waiters:
                if not f.done():
                    f.set_exception(e)
            return
        for f, r in zip(slot.waiters, results):
            if not f.done():
                f.set_result(r)
