"""The controller of replicated broker groups (issue 16) on pysyncobj's Raft.

Consensus is pysyncobj's (>= 0.3.17, which keeps term and vote across a full restart), never ours:
`_RaftGroups` is a SyncObj whose replicated methods apply `ControllerState` changes, journaled and
snapshotted in the data folder so a full restart keeps every epoch and in-sync set. pysyncobj's RPC
is unauthenticated pickle: the node binds only its own cluster address and sets pysyncobj's
password (`controller_secret`), which encrypts and authenticates the Raft traffic.

`RaftController` is the `ControllerBackend` the nameserver's RPC serves: it turns pysyncobj's
callback-style calls into awaitables (never blocking the event loop), keeps heartbeats in memory on
the leader (`LeaseTable`, never in the log) and commits elections when a master's lease lapses.
Another backend (etcd, say) only has to implement `ControllerBackend`.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from core_broker.errors import UnimqError
from nameserver.controller_state import ControllerState, GroupState, LeaseTable, NotLeaderError

__all__ = ["ControllerBackend", "NotLeaderError", "RaftController"]

DEFAULT_LEASE_MS = 2500


class ControllerBackend(Protocol):
    async def heartbeat(
        self, group: str, broker_id: str, addr: str, epoch: int, confirmed_offset: int, priority: int = 0
    ) -> GroupState: ...

    async def alter_in_sync(
        self, group: str, master_id: str, master_epoch: int, in_sync_epoch: int, new_in_sync: frozenset[str]
    ) -> GroupState: ...

    async def group_state(self, group: str) -> GroupState: ...

    async def cluster_state(self) -> dict[str, GroupState]: ...


class _RaftGroups(SyncObj):  # type: ignore[misc]
    """Only `state` is replicated data; pysyncobj pickles this object's attributes into snapshots."""

    def __init__(self, self_addr: str, peers: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, peers, conf)
        self.state = ControllerState()

    # Each method returns ("ok", GroupState) or ("err", UnimqError): raising inside apply would
    # stop the node's log; the caller re-raises.
    @replicated  # type: ignore[misc]
    def register(self, group: str, broker_id: str, addr: str, priority: int) -> tuple[str, object]:
        return "ok", self.state.register(group, broker_id, addr, priority)

    @replicated  # type: ignore[misc]
    def alter(
        self, group: str, master_id: str, master_epoch: int, in_sync_epoch: int, new_in_sync: frozenset[str]
    ) -> tuple[str, object]:
        try:
            return "ok", self.state.alter_in_sync(group, master_id, master_epoch, in_sync_epoch, new_in_sync)
        except UnimqError as exc:
            return "err", exc

    @replicated  # type: ignore[misc]
    def elect(self, group: str, live_offsets: dict[str, int], allow_unclean: bool) -> tuple[str, object]:
        return "ok", self.state.elect(group, live_offsets, allow_unclean)


class RaftController:
    """One controller node: the Raft member plus the leader's lease bookkeeping."""

    def __init__(
        self,
        data_dir: str,
        self_addr: str,
        peers: list[str],
        secret: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        allow_unclean_election: bool = False,
    ) -> None:
        os.makedirs(data_dir, exist_ok=True)
        conf = SyncObjConf(
            journalFile=os.path.join(data_dir, "raft.journal"),
            fullDumpFile=os.path.join(data_dir, "raft.snapshot"),
            password=secret,
            bindAddress=self_addr,  # the cluster address only, never 0.0.0.0
            dynamicMembershipChange=False,
            commandsWaitLeader=True,
            raftMinTimeout=0.4,
            raftMaxTimeout=1.4,
            appendEntriesPeriod=0.1,
            connectionRetryTime=1.0,
        )
        self.self_addr = self_addr
        self.lease_s = lease_ms / 1000.0
        self.allow_unclean = allow_unclean_election
        self._raft = _RaftGroups(self_addr, [p for p in peers if p != self_addr], conf)
        self._leases: LeaseTable | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- lifecycle
    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._lease_loop())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            # The loop also checks _stopping: a cancel that lands as a commit's future settles
            # can be swallowed (asyncio.wait_for on 3.11 does that), and the loop would go on.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
        # destroy() joins pysyncobj's ticking thread: off the loop
        await asyncio.get_running_loop().run_in_executor(None, self._raft.destroy)

    # -- who leads
    def is_leader(self) -> bool:
        return bool(self._raft._isLeader())

    def leader(self) -> str | None:
        node = self._raft._getLeader()
        return str(node.address) if node is not None else None

    def _require_leader(self) -> LeaseTable:
        if not self.is_leader():
            raise NotLeaderError(self.leader())
        if self._leases is None:  # just became leader: no heartbeat history yet
            self._leases = LeaseTable(self.lease_s, time.monotonic())
        return self._leases

    async def _commit(self, method: str, *args: object) -> GroupState:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[str, object]] = loop.create_future()

        def done(result: tuple[str, object] | None, err: int) -> None:  # pysyncobj's thread
            def settle() -> None:
                if fut.done():
                    return
                if err == FAIL_REASON.SUCCESS and result is not None:
                    fut.set_result(result)
                elif err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER, FAIL_REASON.LEADER_CHANGED):
                    fut.set_exception(NotLeaderError(self.leader()))
                else:
                    fut.set_exception(TimeoutError(f"controller commit failed ({err})"))

            loop.call_soon_threadsafe(settle)

        getattr(self._raft, method)(*args, callback=done)
        async with asyncio.timeout(10):  # not wait_for: on 3.11 it can swallow a cancel
            kind, value = await fut
        if kind == "err":
            assert isinstance(value, UnimqError)
            raise value
        assert isinstance(value, GroupState)
        return value

    # -- ControllerBackend
    async def heartbeat(
        self, group: str, broker_id: str, addr: str, epoch: int, confirmed_offset: int, priority: int = 0
    ) -> GroupState:
        leases = self._require_leader()
        leases.beat(group, broker_id, confirmed_offset, time.monotonic())
        member = self._raft.state.member(group, broker_id)
        if member is None or member.addr != addr or member.priority != priority:
            return await self._commit("register", group, broker_id, addr, priority)
        return self._raft.state.group_state(group)

    async def alter_in_sync(
        self, group: str, master_id: str, master_epoch: int, in_sync_epoch: int, new_in_sync: frozenset[str]
    ) -> GroupState:
        self._require_leader()
        return await self._commit("alter", group, master_id, master_epoch, in_sync_epoch, frozenset(new_in_sync))

    async def group_state(self, group: str) -> GroupState:
        self._require_leader()
        return self._raft.state.group_state(group)

    async def cluster_state(self) -> dict[str, GroupState]:
        self._require_leader()
        return self._raft.state.cluster_state()

    def reported_offset(self, group: str, broker_id: str) -> int | None:
        return self._leases.offset(group, broker_id) if self._leases else None

    # -- elections
    async def _lease_loop(self) -> None:
        period = min(0.25, self.lease_s / 4)
        while not self._stopping:
            await asyncio.sleep(period)
            if not self.is_leader():
                self._leases = None  # a leader again later starts with no history
                continue
            leases = self._require_leader()
            now = time.monotonic()
            for group in leases.elections_due(self._raft.state, now):
                live = leases.live(group, now)
                before = self._raft.state.group_state(group)
                eligible = [b for b in live if b in before.in_sync] or (list(live) if self.allow_unclean else [])
                if not eligible and before.master_id is None:
                    continue  # nothing to change: still no master
                try:
                    await self._commit("elect", group, live, self.allow_unclean)
                except (NotLeaderError, TimeoutError):
                    break
