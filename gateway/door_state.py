"""The processor's durable door-state calls: small state doors keep across restarts.

Why a module of its own (mixed into :class:`~gateway.processor.MessagingProcessor`): the
processor module holds every door's hot paths and is at its size limit, and door state is
one concept - a versioned key-value store per namespace (MQTT sessions and retained
messages, AMQP definitions, HTTP push subscriptions) kept by the brokers' journal and
snapshot. The ``*_many`` calls exist for storms: a door writing or reading many keys at
once (an MQTT gateway taking thousands of CONNECTs a second) makes one call per broker
for all of them instead of one per key. Authorization: ``ADMIN`` on the door state's
namespace, as every call here.
"""

from __future__ import annotations

from typing import Callable

from .auth import Action, Resource
from .broker_client import BrokerClient
from .context import RequestContext

__all__ = ["DoorStateCalls"]


class DoorStateCalls:
    """``kv_put`` / ``kv_get`` / ``kv_items`` / ``kv_put_many`` / ``kv_create_many`` / ``kv_get_many`` over the broker client."""

    broker: BrokerClient
    _check: Callable[[RequestContext, Action, Resource, str], None]

    async def kv_put(self, ctx: RequestContext, namespace: str, key: str, value: bytes | None) -> None:
        """Durable small state for a door (sessions, retained messages, exchanges, bindings...).

        Doors keep only connection state themselves; what must survive a restart is
        written here and lives in the broker's journal and snapshot.
        """
        self._check(ctx, Action.ADMIN, Resource.DOOR_STATE, namespace)
        await self.broker.kv_put(namespace, key, value)

    async def kv_get(self, ctx: RequestContext, namespace: str, key: str) -> bytes | None:
        self._check(ctx, Action.ADMIN, Resource.DOOR_STATE, namespace)
        return await self.broker.kv_get(namespace, key)

    async def kv_items(self, ctx: RequestContext, namespace: str) -> dict[str, bytes]:
        self._check(ctx, Action.ADMIN, Resource.DOOR_STATE, namespace)
        return await self.broker.kv_items(namespace)

    async def kv_put_many(self, ctx: RequestContext, namespace: str, items: dict[str, bytes | None],
                          writer: str = "") -> None:
        """Several ``kv_put`` s (None deletes), durable together once this returns. ``writer``: the
        id the door follows the door-state feed with (``door_watch``'s ``gateway``), which then
        does not bring these writes back to it."""
        self._check(ctx, Action.ADMIN, Resource.DOOR_STATE, namespace)
        if items:
            await self.broker.kv_put_many(namespace, items, writer)

    async def kv_create_many(self, ctx: RequestContext, namespace: str, items: dict[str, bytes],
                             writer: str = "") -> set[str]:
        """Create each entry whose key the brokers hold nothing of (a tombstone counts), durable
        together once this returns; the keys refused. A created entry is older than any write
        (the brokers' ``kv_create_many``): a door that is refused reads the key and goes on from
        what it finds, and a create that reached only some brokers never hides a record."""
        self._check(ctx, Action.ADMIN, Resource.DOOR_STATE, namespace)
        if not items:
            return set()
        return await self.broker.kv_create_many(namespace, items, writer)

    async def kv_get_many(self, ctx: RequestContext, namespace: str, keys: list[str]) -> dict[str, bytes | None]:
        """``kv_get`` of each of ``keys`` (None: no such entry)."""
        self._check(ctx, Action.ADMIN, Resource.DOOR_STATE, namespace)
        if not keys:
            return {}
        return await self.broker.kv_get_many(namespace, keys)
