"""A broker process in a replicated group: its role, as the controller decides it.

Every ``heartbeat_ms`` the broker tells the controller its log end (elections
pick the most advanced in-sync member) and learns the group's state: if it is
the master it takes office (ReplicationService.become_master, then the broker's
services start and it registers the group's name with the nameservers, so
routes follow within one nameserver round); if another member is, it copies
that member's log. As master it also proposes in-sync set changes (a lagging
replica leaves, a caught-up one rejoins) by compare-and-set.

A master that learns another member took over steps down by restarting its
process (``os.execv`` of the same command line): its store is shut down
cleanly, and the restarted broker rejoins as a replica, cutting whatever
unacknowledged tail it wrote after the group moved on. Stepping down in place
would mean unwinding every service's in-memory state; a restart is the same
code path as a crash, which is tested anyway.

With the controller unreachable nothing changes: the master keeps serving
(acknowledgements still need ``min_insync_replicas`` replicas), replicas keep
copying.

Lives in the application layer: it joins core_broker's BrokerServer to the
nameserver package's ControllerClient, which core_broker must not import.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from core_broker.broker_server import BrokerServer
from core_broker.errors import StaleEpochError
from core_broker.remoting.client import PeerUnavailableError
from nameserver.controller_client import ControllerClient, GroupState

log = logging.getLogger("unimq.group")

__all__ = ["GroupMember"]


class GroupMember:
    def __init__(self, server: BrokerServer, group: str, controllers: list[tuple[str, int]],
                 heartbeat_ms: int = 500, priority: int = 0) -> None:
        assert server.replication is not None
        self.server = server
        self.replication = server.replication
        self.group = group
        self.client = ControllerClient(controllers)
        self.interval_s = heartbeat_ms / 1000
        self.priority = priority
        self.last_state: GroupState | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.client.start()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.client.stop()

    async def _loop(self) -> None:
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except PeerUnavailableError as e:  # controller down: keep the role we have
                log.debug("controller unreachable: %s", e)
            except Exception:
                log.exception("group %s: heartbeat round failed", self.group)
            await self.replication.proposal_due(self.interval_s)

    async def round(self) -> None:
        r = self.replication
        st = await self.client.heartbeat(
            self.group, r.broker_id, self.server.address, r.epoch, r.confirmed_offset(), self.priority
        )
        self.last_state = st
        if st.master_id == r.broker_id:
            if await r.become_master(st.master_epoch, st.in_sync, st.in_sync_epoch):
                await self.server.promote()
            proposal = r.tracker.proposal(frozenset(st.members), self.server.controller.store.write_pos)
            if proposal is not None:
                try:
                    st = await self.client.alter_in_sync(self.group, r.broker_id, st.master_epoch, st.in_sync_epoch, proposal)
                    log.warning("group %s: in-sync set now %s", self.group, ", ".join(sorted(st.in_sync)))
                except StaleEpochError:
                    return
                r.update_in_sync(st.in_sync, st.in_sync_epoch)
            return
        if r.role == "master":
            await self._step_down(st)
            return
        if st.master_id is not None and st.master_addr:
            await r.become_replica(st.master_epoch, st.master_addr)

    async def _step_down(self, st: GroupState) -> None:
        log.warning("group %s: %s took over (epoch %d); %s restarts as a replica",
                    self.group, st.master_id, st.master_epoch, self.replication.broker_id)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        await self.client.stop()
        await self.server.stop()
        logging.shutdown()
        os.execv(sys.executable, sys.orig_argv)
