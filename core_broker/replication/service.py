"""A broker's part in its replicated group: master or replica, as the controller says.

The master serves three calls to its replicas over the broker's RPC port:
``repl_hello`` (segment size, store id, epoch history, log bounds),
``repl_fetch`` (log bytes from an offset; a long poll at the end; each call
reports the replica's progress) and ``repl_state`` (the broker state snapshot:
what the journal in the log does not repeat once a snapshot covers it). It is
installed as the store's ReplicaCondition, so every acknowledgement of every
door waits for ``min_insync_replicas`` (see ``in_sync``).

A replica runs only its store and the copy loop (``follower``): the broker's
services (pop revive, timers, transaction checks) write to the log and run on
the master alone. Promotion starts them on the replica's own copy of the log,
replaying the journal from the last snapshot it took from the master, so
topics, consumer offsets, pop state and the doors' durable state are all there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..errors import NotMasterError
from ..json_file import read_json, write_json_atomic
from ..system_topics import JOURNAL_TOPIC
from .epoch_file import EpochFile
from .follower import Follower
from .in_sync import InSyncTracker, ReplicaProgress
from .tier_gate import ReplicaTierGate

if TYPE_CHECKING:
    from ..broker_controller import BrokerController

log = logging.getLogger("unimq.replication")

__all__ = ["ReplicationConfig", "ReplicationService", "ReplicaProgress"]

Role = Literal["none", "master", "replica"]


@dataclass
class ReplicationConfig:
    # Members of the in-sync set (the master included) that must hold a put before it is acked.
    min_insync_replicas: int = 1
    # A replica further behind than this (time since it last held the master's end, or bytes)
    # leaves the in-sync set; it rejoins once it has caught up.
    replica_lag_max_ms: int = 5000
    replica_lag_max_bytes: int = 64 << 20
    # How long a put waits for its acknowledgements before failing (retriably).
    ack_timeout_ms: int = 5000
    # Replicas that copy the log but never count for acknowledgements (disaster recovery).
    async_replicas: frozenset[str] = field(default_factory=frozenset)
    # A replica may serve pulls of offsets it holds.
    read_from_replica: bool = False


class ReplicationService:
    def __init__(self, controller: BrokerController, broker_id: str, config: ReplicationConfig) -> None:
        self.controller = controller
        self.store = controller.store
        self.broker_id = broker_id
        self.config = config
        self.epochs = EpochFile(self.store.root / "epochs.json")
        self.tracker = InSyncTracker(
            broker_id, config.min_insync_replicas, config.replica_lag_max_ms, config.replica_lag_max_bytes,
            self.store.durability.sync_flush, config.ack_timeout_ms / 1000, config.async_replicas,
        )
        self.tracker.writable = False
        self.role: Role = "none"
        self.epoch = 0
        self.master_addr: str | None = None
        self._follower: Follower | None = None
        self._more: asyncio.Future[None] | None = None
        # Set when a report calls for another in-sync set: the group member asks the controller
        # at once (a replica that caught up with a new master rejoins in one round trip, not
        # one heartbeat later, so puts refused for too few in sync after a failover are brief).
        self._proposal_due = asyncio.Event()
        self._tier_kept_at, self._tier_kept_end = -1e9, 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.epochs.load()
        self.store.durability.set_replica_condition(self)

    async def stop(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None
        self.tracker.fail_waiters(NotMasterError("the broker is stopping"))

    # ------------------------------------------------------------------ ReplicaCondition
    def check_writable(self) -> None:
        self.tracker.check_writable()

    def written(self, end: int) -> None:
        self._signal()

    async def wait(self, end: int) -> None:
        self._signal()
        await self.tracker.wait(end)

    def _signal(self) -> None:
        more = self._more
        if more is not None and not more.done():
            more.set_result(None)
        self._more = None

    # ------------------------------------------------------------------ roles
    async def become_master(self, epoch: int, in_sync: frozenset[str], in_sync_epoch: int) -> bool:
        """Take office for ``epoch``; True if this changed the role (the caller starts services)."""
        if self.role == "master" and epoch == self.epoch:
            self.tracker.set_in_sync(in_sync, in_sync_epoch)
            return False
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None
        if isinstance(self.store.tier, ReplicaTierGate):
            self.store.tier = None  # the broker's services start the tier itself (it uploads now)
        start = self.store.write_pos if self.epochs.entries else self.store.commitlog.first_record_offset()
        self.epochs.begin(epoch, start)
        self.tracker.start_term(in_sync, in_sync_epoch)
        self.role, self.epoch, self.master_addr = "master", epoch, None
        log.warning("broker %s is the master of its group, epoch %d, from offset %d", self.broker_id, epoch, start)
        return True

    async def become_replica(self, epoch: int, master_addr: str) -> None:
        if self.role == "master":
            raise RuntimeError("a master steps down by restarting (BrokerServer), never in place")
        self.epoch = max(self.epoch, epoch)
        if self.role == "replica" and self.master_addr == master_addr:
            return
        self.tracker.writable = False
        if self._follower is not None:
            await self._follower.stop()
        self.role, self.master_addr = "replica", master_addr
        gate = None
        if self.store.config.tier_enabled:  # local retention waits for the master's uploads
            gate = self.store.tier if isinstance(self.store.tier, ReplicaTierGate) else ReplicaTierGate()
            self.store.tier = gate
        self._follower = Follower(self.store, self.epochs, self.broker_id, master_addr, self._take_state,
                                  self._forget_state_past_cut, gate)
        self._follower.start()
        log.warning("broker %s replicates the master at %s (epoch %d)", self.broker_id, master_addr, epoch)

    async def proposal_due(self, timeout_s: float) -> None:
        """Return after ``timeout_s``, or as soon as a replica's report calls for an in-sync change."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._proposal_due.wait()
        except TimeoutError:
            pass
        self._proposal_due.clear()

    def update_in_sync(self, in_sync: frozenset[str], in_sync_epoch: int) -> None:
        self.tracker.set_in_sync(in_sync, in_sync_epoch)

    def progress(self) -> list[ReplicaProgress]:
        return list(self.tracker.progress.values())

    def confirmed_offset(self) -> int:
        return self.store.write_pos

    # ------------------------------------------------------------------ served to replicas
    def _require_master(self) -> None:
        if self.role != "master":
            raise NotMasterError(f"broker {self.broker_id} is not the master of its group")

    def repl_hello(self, broker_id: str) -> dict:
        self._require_master()
        st = self.store
        return {
            "segment_size": st.commitlog.segment_size, "store_id": st.store_id,
            "epochs": [list(e) for e in self.epochs.entries], "end": st.write_pos,
            "min_offset": st.commitlog.min_offset,
        }

    async def repl_fetch(self, broker_id: str, start: int, written: int, flushed: int,
                         max_bytes: int, wait_ms: int) -> dict:
        self._require_master()
        st = self.store
        self.tracker.report(broker_id, written, flushed, st.write_pos)
        if not self._proposal_due.is_set() and self.tracker.proposal(frozenset(self.tracker.progress), st.write_pos):
            self._proposal_due.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        # At the end: wait for more. Acknowledged puts signal at once; writes nobody waits
        # for (a timer firing, a journal entry) are seen by the 50 ms re-check.
        while start >= st.write_pos and self.role == "master":
            left = deadline - loop.time()
            if left <= 0:
                break
            if self._more is None:
                self._more = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._more), min(left, 0.05))
            except asyncio.TimeoutError:
                pass
        start, data = st.read_log(start, max_bytes)
        return {"start": start, "data": data, "end": st.write_pos, "epochs": [list(e) for e in self.epochs.entries],
                "tier_kept": self._tier_kept(loop.time())}

    def _tier_kept(self, now: float) -> int:
        """How far the tier holds this master's log: every segment ending at or below it is
        confirmed there (what a replica's retention may delete; see ``tier_gate``). Worked out
        at most once a second: a fetch answer must stay cheap."""
        if now - self._tier_kept_at < 1.0:
            return self._tier_kept_end
        tier, cl = self.controller.tier, self.store.commitlog
        kept = 0
        if tier is not None:
            kept = cl.min_offset
            for mf in list(cl.files.files)[:-1]:
                if not tier.may_delete(mf):
                    break
                kept = mf.end
        self._tier_kept_at, self._tier_kept_end = now, kept
        return kept

    def repl_state(self) -> dict:
        """The broker state a promoted replica starts from (consistent with its journal offset)."""
        self._require_master()
        c = self.controller
        snap = c._snapshot()
        offsets = {g: {f"{tp}@{q}": o for (tp, q), o in t.items()} for g, t in c.store.offsets.table.items()}
        topics = {t.name: t.to_json() for t in c.store.topics.topics.values()}
        return {"state": snap, "offsets": offsets, "topics": topics}

    async def _take_state(self, state: dict, log_end: int) -> None:
        """A replica keeps the master's snapshot once its own journal reaches the snapshot's point."""
        snap = state["state"]
        if int(snap.get("journal", 0)) > self.store.max_offset(JOURNAL_TOPIC, 0):
            return
        cfg = self.store.root / "config"

        def write() -> None:
            cfg.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cfg / "consumer_offsets.json", state["offsets"])
            write_json_atomic(cfg / "topics.json", state["topics"])
            write_json_atomic(cfg / "broker_state.json", snap)

        await asyncio.to_thread(write)
        if self.config.read_from_replica:  # pulls served here see the master's topics
            await asyncio.to_thread(self.store.topics.load)

    async def _forget_state_past_cut(self) -> None:
        """After a cut: state saved from journal entries that are gone (a deposed master's own
        snapshot and offsets table, taken after writes never acknowledged) must not come back
        at a promotion. They go; a promotion then replays the journal this log holds, unless
        the master's next snapshot (``_take_state``) replaces them first."""
        cfg = self.store.root / "config"
        snap = await asyncio.to_thread(read_json, cfg / "broker_state.json", {})
        if int(snap.get("journal", 0)) <= self.store.max_offset(JOURNAL_TOPIC, 0):
            return
        log.warning("replica %s: its state snapshot covers journal entries the cut removed: dropped", self.broker_id)

        def drop() -> None:
            for f in ("broker_state.json", "consumer_offsets.json"):
                (cfg / f).unlink(missing_ok=True)

        await asyncio.to_thread(drop)
        # a replica's services are stopped: nothing commits meanwhile; the journal's "off"
        # entries rebuild the table at promotion
        self.store.offsets.clear()

    async def prepare_promotion(self) -> None:
        """Before the broker's services start on this copy: load what the master's snapshot held."""
        st = self.store
        await asyncio.to_thread(st.topics.load)
        await asyncio.to_thread(st.offsets.load)
