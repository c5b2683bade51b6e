"""The processor's door-state feed calls: how a door learns what other gateways wrote.

Why a module of its own (mixed into :class:`~gateway.processor.MessagingProcessor`):
the feed (``core_broker/door_feed.py``) is per broker, and only a door that keeps
door state in memory for routing (the MQTT door, with several gateways on one
port) needs it; the calls pass straight through to the broker client, they are
not part of the message API every door and the RPC processor implement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core_broker.errors import UnimqError

if TYPE_CHECKING:
    from .api import DoorFeed
    from .broker_client import BrokerClient

__all__ = ["DoorWatchCalls"]


class DoorWatchCalls:
    """``door_brokers`` / ``door_watch`` / ``door_notify`` over the processor's broker client."""

    broker: "BrokerClient"

    async def door_brokers(self) -> list[str]:
        """The names of the brokers whose feeds a watcher follows (every registered one)."""
        try:
            return await self.broker.broker_names()
        except (UnimqError, OSError):
            return []

    async def door_watch(self, broker: str, gateway: str, namespaces: list[str], incarnation: str, seq: int,
                         timeout_s: float) -> dict[str, Any]:
        """``broker``'s door-state changes after ``seq`` and the notes for ``gateway`` (a long poll)."""
        return await self.broker.door_watch(broker, gateway, namespaces, incarnation, seq, timeout_s)

    def door_feed(self) -> "DoorFeed | None":
        return self

    async def door_notify(self, broker: str, gateway: str, notes: list[Any]) -> None:
        """Leave ``notes`` for ``gateway`` on ``broker`` (it gets them with its next watch there)."""
        await self.broker.door_notify(broker, gateway, notes)
