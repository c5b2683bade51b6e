"""The master's view of its replicas: who holds what, who is in sync, when a put may be acked.

Replicas report how far they have written (and, under sync flush, fdatasynced)
the log with every fetch. A put ending at offset E may be acknowledged once
*every* member of the in-sync set holds E (Kafka's ``acks=all``; RocketMQ's
``allAckInSyncStateSet``), the master's own flush being the DurabilityPolicy's
first condition; ``min_insync_replicas`` is the floor on the set's size. With
fewer in-sync members than that, puts are refused before they are written
(:meth:`InSyncTracker.check_writable`), and a put whose acknowledgements do not
come within ``ack_timeout_s`` fails with the same retriable error: it may exist
on some members, but no client was told it is stored.

Why every member and not any ``min_insync_replicas`` of them: the controller
may elect any live member of the set, so each one must hold every acknowledged
message. Counting only the fastest members lost acknowledged messages in the
Jepsen test: a master cut off from the controller (but not from its replicas)
went on writing while the controller elected another member; the replica that
had not been elected acknowledged those writes, and then cut them to follow
the new master. Now such a write needs the newly elected member too, which
stops fetching once it learns it is master, and the cut-off master cannot
shrink the set without the controller (compare-and-set on the set's epoch), so
the write is never acknowledged. A slow member costs latency until it is
dropped from the set (``lag_max_ms``), as in Kafka. ``min_insync_replicas = 1``
keeps its meaning: the master alone acknowledges (``acks=1``), and a failover
may lose what replicas had not fetched.

The in-sync set itself belongs to the controller (compare-and-set on its epoch);
this class only proposes changes (:meth:`proposal`): a member silent or behind
for more than ``lag_max_ms``, or more than ``lag_max_bytes`` behind, leaves; one
that caught up with the master's log rejoins.

"Caught up" is Kafka's rule, not "holds the master's end right now": a replica
whose fetch shows it holds everything the master had when it answered the
previous fetch is keeping pace, even though the master wrote more meanwhile.
Under steady writes on a loaded machine a report never finds zero bytes of lag,
and the stricter rule dropped replicas that kept pace and never let them back.
A replica rejoins once it keeps pace and holds the highest end acknowledged in
this term (:attr:`InSyncTracker.acked_high`): a member of the in-sync set may
be elected, so it must hold every acknowledged message.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass

from ..errors import NotEnoughInSyncReplicasError, ReplicaAckTimeoutError

__all__ = ["InSyncTracker", "ReplicaProgress"]


@dataclass
class ReplicaProgress:
    broker_id: str
    written: int = 0
    flushed: int = 0
    caught_up_at: float = 0.0  # monotonic time it last held everything the master had when it last answered it
    lag_bytes: int = 0
    reported_at: float = 0.0  # a replica that stops fetching (dead, partitioned) is behind too
    answered_end: int = -1  # the master's log end when it answered this replica's last fetch
    previous_end: int = -1  # ... and its fetch before that: what this report must show it holds

    def lag_ms(self, now: float) -> int:
        return 0 if self.lag_bytes == 0 else int((now - self.caught_up_at) * 1000)


class InSyncTracker:
    def __init__(self, self_id: str, min_insync: int, lag_max_ms: int, lag_max_bytes: int,
                 sync_flush: bool, ack_timeout_s: float, async_replicas: frozenset[str] = frozenset()) -> None:
        self.self_id = self_id
        self.min_insync = min_insync
        self.lag_max_ms = lag_max_ms
        self.lag_max_bytes = lag_max_bytes
        self.sync_flush = sync_flush
        self.ack_timeout_s = ack_timeout_s
        self.async_replicas = async_replicas  # disaster-recovery copies: never counted for acks
        self.in_sync: frozenset[str] = frozenset({self_id})
        self.in_sync_epoch = 0
        self.progress: dict[str, ReplicaProgress] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None], float]] = []  # (end, seq, future, deadline)
        self._sweeper: asyncio.Task[None] | None = None
        self._seq = itertools.count()
        self.writable = True  # False while not master: check_writable refuses
        self.acked_high = 0  # the highest end acknowledged in this term (with replicas counted)

    # -- what replicas report
    def report(self, broker_id: str, written: int, flushed: int, master_end: int) -> None:
        p = self.progress.get(broker_id)
        if p is None:
            p = self.progress[broker_id] = ReplicaProgress(broker_id, caught_up_at=time.monotonic())
        p.written, p.flushed = written, flushed
        now = p.reported_at = time.monotonic()
        p.lag_bytes = max(0, master_end - written)
        p.previous_end, p.answered_end = p.answered_end, master_end
        if p.lag_bytes == 0 or (p.previous_end >= 0 and written >= p.previous_end):
            p.caught_up_at = now
        self._wake()

    def _held(self, p: ReplicaProgress) -> int:
        return p.flushed if self.sync_flush else p.written

    def acked_end(self) -> int:
        """The highest offset every in-sync member holds (the master holds everything)."""
        need = self.min_insync - 1
        if need <= 0:
            return 1 << 62
        held = [
            self._held(p) if (p := self.progress.get(b)) is not None else -1
            for b in self.in_sync if b != self.self_id and b not in self.async_replicas
        ]
        return min(held) if len(held) >= need else -1

    # -- the ReplicaCondition the store's DurabilityPolicy asks
    def check_writable(self) -> None:
        if not self.writable:
            from ..errors import NotMasterError

            raise NotMasterError("this broker is not the master of its group")
        counted = len([b for b in self.in_sync if b not in self.async_replicas])
        if counted < self.min_insync:
            raise NotEnoughInSyncReplicasError(
                f"only {counted} of the {self.min_insync} in-sync replicas this group needs are in sync "
                f"({', '.join(sorted(self.in_sync))}); retry shortly"
            )

    async def wait(self, end: int) -> None:
        if self.acked_end() >= end:
            if self.min_insync > 1 and end > self.acked_high:
                self.acked_high = end
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        # One future per put and one sweep for every deadline (not a wait_for per put: that
        # costs a task and a timer each, at every acknowledged put's rate).
        heapq.heappush(self._waiters, (end, next(self._seq), fut, loop.time() + self.ack_timeout_s))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep())
        await fut

    async def _sweep(self) -> None:
        """Fail puts whose acknowledgements did not come within ack_timeout_s (retriably)."""
        loop = asyncio.get_running_loop()
        while self._waiters:
            await asyncio.sleep(min(0.1, self.ack_timeout_s / 4))
            now = loop.time()
            if not any(w[3] <= now for w in self._waiters):
                continue
            keep = []
            for w in self._waiters:
                if w[3] <= now:
                    if not w[2].done():
                        w[2].set_exception(ReplicaAckTimeoutError(
                            f"not acknowledged by {self.min_insync} in-sync replicas within "
                            f"{self.ack_timeout_s:g} s; it may be stored: retry if the client may send twice"
                        ))
                else:
                    keep.append(w)
            heapq.heapify(keep)
            self._waiters = keep

    def _wake(self) -> None:
        w = self._waiters
        if not w:
            return
        acked = self.acked_end()
        while w and w[0][0] <= acked:
            end, _, fut, _ = heapq.heappop(w)
            if not fut.done():
                fut.set_result(None)
                if end > self.acked_high:
                    self.acked_high = end

    def fail_waiters(self, exc: BaseException) -> None:
        """The broker stopped being master: nobody waiting will be acknowledged here."""
        w, self._waiters = self._waiters, []
        for _, _, fut, _ in w:
            if not fut.done():
                fut.set_exception(exc)

    def start_term(self, in_sync: frozenset[str], epoch: int) -> None:
        """Taking office: every in-sync member gets ``lag_max_ms`` to report to this master."""
        now = time.monotonic()
        self.progress = {b: ReplicaProgress(b, caught_up_at=now, reported_at=now) for b in in_sync if b != self.self_id}
        self.in_sync, self.in_sync_epoch = frozenset(in_sync) | {self.self_id}, epoch
        self.writable = True
        self.acked_high = 0  # what earlier terms acknowledged is below this master's end (see proposal)

    # -- the in-sync set
    def set_in_sync(self, in_sync: frozenset[str], epoch: int) -> None:
        if epoch >= self.in_sync_epoch:
            self.in_sync, self.in_sync_epoch = frozenset(in_sync), epoch
            self._wake()

    def proposal(self, members: frozenset[str], master_end: int) -> frozenset[str] | None:
        """The in-sync set this master would have now, or None if it is the current one."""
        now = time.monotonic()
        new = set(self.in_sync) | {self.self_id}
        for b in members - {self.self_id}:
            p = self.progress.get(b)
            if b in self.async_replicas:
                new.discard(b)
                continue
            if p is None:
                continue
            lag_s = self.lag_max_ms / 1000
            behind = (
                p.lag_bytes > self.lag_max_bytes
                or (p.lag_bytes > 0 and now - p.caught_up_at > lag_s)
                or now - p.reported_at > lag_s
            )
            if b in new and behind:
                new.discard(b)
            elif b not in new and not behind and (p.lag_bytes == 0 or p.previous_end >= 0) and (
                self._held(p) >= max(p.previous_end if p.lag_bytes else master_end, self.acked_high)
            ):
                # It held all the master had when answering its previous fetch (which is beyond
                # everything earlier terms acknowledged: the master was elected holding that)
                # and everything acknowledged in this term.
                new.add(b)
        new_set = frozenset(new)
        return None if new_set == self.in_sync else new_set
