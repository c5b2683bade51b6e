"""When a put may be acknowledged: the one place that decides it.

Two conditions, built once from the configuration and the broker's role:

- local: under ``--flush sync`` the fdatasync that covers the record must have
  run (the flush service's group commit); under async flush the page cache is
  enough.
- replicas: on the master of a replicated broker group, ``min_insync_replicas``
  members of the in-sync set (the master included) must hold the record (and,
  under sync flush, have fdatasynced it). The replication service installs a
  :class:`ReplicaCondition`; an unreplicated broker has none.

Every acknowledgement of every door goes through :meth:`DurabilityPolicy.wait`
(``MessageStore.wait_durable``): gRPC SendMessage, AMQP confirms, MQTT
PUBACK/PUBREC and HTTP 2xx all wait for the broker's send, which waits here.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol


class ReplicaCondition(Protocol):
    def check_writable(self) -> None:
        """Raise a retriable error (NotMasterError, NotEnoughInSyncReplicasError) before a write."""

    def written(self, end_offset: int) -> None:
        """The log now reaches ``end_offset``: start copying it (before the local flush is done)."""

    async def wait(self, end_offset: int) -> None:
        """Return once enough in-sync members hold the log up to ``end_offset``."""


class DurabilityPolicy:
    def __init__(self, sync_flush: bool, flush_wait: Callable[[int], Awaitable[None]]) -> None:
        self.sync_flush = sync_flush
        self._flush_wait = flush_wait
        self.replicas: ReplicaCondition | None = None
        # False when an acknowledgement needs nothing after the write (async flush, no replicas):
        # the hot paths then skip the wait coroutine altogether. A plain attribute, kept in step
        # by set_replica_condition (the only writer of ``replicas``): every send reads it.
        self.waits = sync_flush

    def set_replica_condition(self, cond: ReplicaCondition | None) -> None:
        self.replicas = cond
        self.waits = self.sync_flush or cond is not None

    def check_writable(self) -> None:
        cond = self.replicas
        if cond is not None:
            cond.check_writable()

    async def wait(self, end_offset: int) -> None:
        cond = self.replicas
        if cond is not None:
            cond.written(end_offset)  # replicas copy and fdatasync while the master does its own
        if self.sync_flush:
            await self._flush_wait(end_offset)
        if cond is not None:
            await cond.wait(end_offset)
