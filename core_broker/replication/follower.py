"""A replica's copy loop: fetch the master's log from where this one ends, write it, report.

Each fetch carries how far this replica has written and (under sync flush)
fdatasynced the log: that report is what the master's acknowledgements wait
for, so the loop flushes before it asks again. A fetch at the master's end is a
long poll: the master answers as soon as it has more (see ReplicationService).

Before copying anything the replica compares its epoch history with the
master's and cuts its log after the last common point (``epoch_file``), so it
never keeps bytes the group's master of record did not write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Awaitable, Callable

from ..errors import NotMasterError, ReplicaOffsetMismatchError, UnimqError
from ..remoting.client import PeerUnavailableError, RpcClient
from .epoch_file import EpochFile, common_end
from .tier_gate import ReplicaTierGate

if TYPE_CHECKING:
    from ..message_store import MessageStore

log = logging.getLogger("unimq.replication")

CHUNK_BYTES = 4 << 20
LONG_POLL_MS = 300


class Follower:
    def __init__(self, store: MessageStore, epochs: EpochFile, broker_id: str, master_addr: str,
                 on_state: Callable[[dict, int], Awaitable[None]], on_cut: Callable[[], Awaitable[None]],
                 tier_gate: ReplicaTierGate | None = None) -> None:
        self.store = store
        self.tier_gate = tier_gate
        self.epochs = epochs
        self.broker_id = broker_id
        self.master_addr = master_addr
        host, _, port = master_addr.rpartition(":")
        self.client = RpcClient(host, int(port), connect_timeout=1.0)
        self._on_state = on_state
        self._on_cut = on_cut
        self.task: asyncio.Task[None] | None = None
        self.synced_once = asyncio.Event()
        self._stopping = False  # the loops end on it even if a cancellation was swallowed

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.client.close()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except (PeerUnavailableError, NotMasterError) as e:
                log.debug("replica %s: master %s: %s", self.broker_id, self.master_addr, e)
                await asyncio.sleep(0.2)
            except UnimqError as e:
                log.warning("replica %s: copying from %s failed: %s; starting over", self.broker_id, self.master_addr, e)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("replica %s: copying from %s failed; starting over", self.broker_id, self.master_addr)
                await asyncio.sleep(1.0)

    async def _follow(self) -> None:
        store = self.store
        hello = await self.client.call("repl_hello", self.broker_id, rpc_timeout=5.0)
        if hello["segment_size"] != store.commitlog.segment_size:
            raise ReplicaOffsetMismatchError(
                f"the master's commitlog segments are {hello['segment_size']} bytes, this broker's "
                f"{store.commitlog.segment_size}: a group's members need the same store.commitlog_segment_size"
            )
        store.adopt_store_id(hello["store_id"])
        theirs = [(int(e), int(s)) for e, s in hello["epochs"]]
        cut = common_end(self.epochs.entries, store.write_pos, theirs, int(hello["end"]))
        if store.write_pos > cut:
            log.warning("replica %s: cutting its log from %d back to %d (not written by the master of record)",
                        self.broker_id, store.write_pos, cut)
            await asyncio.to_thread(store.truncate_to, cut)
            self.epochs.cut(cut)
            await self._on_cut()
        pos = store.write_pos
        if pos < int(hello["min_offset"]):  # the master no longer holds this far back: start at its first segment
            pos = int(hello["min_offset"])
            if store.commitlog.files.files:
                raise ReplicaOffsetMismatchError(
                    f"this replica's log ends at {store.write_pos}, before the master's first offset {pos}: "
                    "empty its data folder to copy the master from scratch"
                )
        state_due = 0.0
        loop = asyncio.get_running_loop()
        while not self._stopping:
            resp = await self.client.call(
                "repl_fetch", self.broker_id, pos, store.write_pos, store.flushed_pos(), CHUNK_BYTES, LONG_POLL_MS,
                rpc_timeout=10.0,
            )
            data = resp["data"]
            if data:
                # a thread: checking and dispatching a 4 MiB chunk's records would hold the loop
                pos = await asyncio.to_thread(store.append_replicated, int(resp["start"]), data)
                await store.wait_flushed(pos)
            self.epochs.adopt([(int(e), int(s)) for e, s in resp["epochs"]], pos)
            if self.tier_gate is not None:
                self.tier_gate.kept_below = int(resp.get("tier_kept", 0))
            if pos >= int(resp["end"]):
                self.synced_once.set()
            if loop.time() >= state_due:
                state_due = loop.time() + 2.0
                state = await self.client.call("repl_state", rpc_timeout=10.0)
                await self._on_state(state, pos)
