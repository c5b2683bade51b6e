"""`unimq broker`: one BrokerController served over unimq RPC, registered with nameservers.

The separated deployment's broker role. It registers its topics, queues and
permission with every configured nameserver and renews the lease by
heartbeat; any topic change re-registers at once so routes follow quickly.
Transaction checks flow the other way by polling: gateways ask
``poll_transaction_checks`` and hand each check to a producer they hold, so a
broker never needs to know or dial its gateways. A check taken by a gateway is
in flight until the gateway reports its outcome (``transaction_check_outcome``):
meanwhile the transaction is not checked again nor rolled back, and a check a
stopping gateway could not deliver is not counted. While no gateway is connected
(a broker started before its gateways, or a whole cluster stopping gateways
first), the broker holds its checks rather than count checks nobody can receive.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .broker_controller import BrokerController
from .config import BrokerConfig, StoreConfig
from .model import StoredMessage
from .remoting.client import RpcClient
from .remoting.rows import (
    batches_to_block, get_result_to_block, messages_from_block, popped_to_block, put_results_to_block,
)
from .remoting.server import RpcServer
from .errors import BadRequestError, BrokerWriteBlockedError, NotMasterError, QueueMovedError
from .logic_queue import QueueMapping
from .static_fence import StaticFence
from .replication.service import ReplicationConfig, ReplicationService
from .system_topics import is_lmq
from .topic_config import PERM_RW, PERM_WRITE, TopicConfig

log = logging.getLogger("unimq.broker_server")

REMOTE_METHODS = [
    "ping", "set_perm", "create_topic", "update_topic", "delete_topic", "get_topic", "list_topics",
    "describe_topic", "send", "end_transaction", "pop", "ack", "ack_batch", "change_invisible", "forward_to_dlq", "pull",
    "commit_offset", "get_offset", "query_offset", "query_by_id", "query_by_key", "kv_put", "kv_get",
    "kv_items", "kv_get_versioned", "kv_put_many", "kv_create_many", "kv_get_many_versioned", "kv_items_versioned", "door_watch",
    "door_notify", "poll_transaction_checks", "transaction_check_outcome",
    "commit_offsets", "pull_lanes", "consumer_lag", "store_stats", "group_queues", "reset_offset", "repl_hello", "repl_fetch", "repl_state",
    "read_table", "compact_topic", "seal_queue", "consumed_offset", "pull_batches",
]
# What a replica (or a group member with no role yet) answers; everything else is its master's.
REPLICA_METHODS = frozenset({"ping", "repl_hello", "repl_fetch", "repl_state"})
# ... and with read_from_replica, pulls of the offsets it holds (and what a puller asks first).
REPLICA_READS = frozenset({"pull", "query_offset", "get_topic", "describe_topic"})


class BrokerServer:
    def __init__(
        self,
        store_config: StoreConfig,
        broker_config: BrokerConfig,
        nameservers: list[tuple[str, int]],
        heartbeat_s: float = 30.0,
        advertised_host: str = "127.0.0.1",
        replication: ReplicationConfig | None = None,
        broker_id: str = "",
        advertise: str = "",
    ) -> None:
        self.controller = BrokerController(store_config, broker_config)
        self.name = broker_config.broker_name
        # A member of a replicated group (the group is its name with the nameservers): its
        # role comes from the controller (unimq/group_member.py), not from this process.
        self.replication = ReplicationService(self.controller, broker_id or self.name, replication) if replication else None
        self.nameservers = [RpcClient(h, p, connect_timeout=2.0) for h, p in nameservers]
        self.heartbeat_s = heartbeat_s
        self.perm = PERM_RW
        self.advertised_host = advertised_host
        self.advertise = advertise  # host:port others reach this broker at (NAT, a proxy), if not its own
        self.address = ""
        self._rpc = RpcServer(self, REMOTE_METHODS, f"broker {self.name}", on_connections=self._connections,
                              guard=self._guard if self.replication is not None else None)
        self._heartbeat: asyncio.Task | None = None
        self._checks: asyncio.Queue[list[Any]] = asyncio.Queue(maxsize=10_000)
        self._offered: set[str] = set()  # transactions with a check waiting in _checks
        self._n_connections = 0  # open RPC connections (gateways)
        self._registering: asyncio.Task | None = None  # registration of a topic change
        self._reregister = False  # topics changed again while it was under way
        self.fence = StaticFence(self.name)  # the logic queues of static topics this broker writes

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> tuple[str, int]:
        if self.replication is not None:  # the store alone until the controller names a role
            await asyncio.to_thread(self.controller.store.start)
            await self.replication.start()
            h, p = await self._rpc.start(host, port)
            self.address = self.advertise or f"{self.advertised_host if host in ('0.0.0.0', '::') else h}:{p}"
            return h, p
        await self._start_services()
        h, p = await self._rpc.start(host, port)
        self.address = self.advertise or f"{self.advertised_host if host in ('0.0.0.0', '::') else h}:{p}"
        await self.register()
        self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())
        return h, p

    async def promote(self) -> None:
        """A group member became master: start the broker's services on its copy, register."""
        assert self.replication is not None
        if self.controller.started:
            return
        await self.replication.prepare_promotion()
        await self._start_services()
        await self.register()
        if self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    def _guard(self, method: str) -> None:
        r = self.replication
        if r is not None and method not in REPLICA_METHODS and (r.role != "master" or not self.controller.started):
            if r.role == "replica" and r.config.read_from_replica and method in REPLICA_READS:
                return
            raise NotMasterError(f"broker {r.broker_id} is not the master of group {self.name}")

    def repl_hello(self, broker_id: str) -> dict:
        return self._replication().repl_hello(broker_id)

    async def repl_fetch(self, broker_id: str, start: int, written: int, flushed: int, max_bytes: int, wait_ms: int) -> dict:
        return await self._replication().repl_fetch(broker_id, start, written, flushed, max_bytes, wait_ms)

    def repl_state(self) -> dict:
        return self._replication().repl_state()

    def _replication(self) -> ReplicationService:
        if self.replication is None:
            raise NotMasterError(f"broker {self.name} is not in a replicated group")
        return self.replication

    async def _start_services(self) -> None:
        await self.controller.start()
        # Checks go out through gateways: while none is connected (a broker starting before
        # them, a whole cluster stopping gateways first), they would be counted unheard.
        self.controller.transactions.hold_checks = self._no_gateway
        self.controller.set_transaction_checker(self._queue_check)
        self.controller.on_topics_changed = self._topics_changed
        self._reload_fence()

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._registering is not None:
            self._registering.cancel()
        # A replica never registered: the group's name belongs to its master's address.
        registered = self.replication is None or self.controller.started
        for ns in self.nameservers:
            if registered:
                try:
                    await ns.call("unregister_broker", self.name, rpc_timeout=1.0)
                except Exception:
                    pass
            await ns.close()
        await self._rpc.stop()
        if self.replication is not None:
            await self.replication.stop()
            if not self.controller.started:  # a replica: only its store is open
                if self.controller.store.running:
                    await asyncio.to_thread(self.controller.store.shutdown)
                return
        while not self._checks.empty():  # checks no gateway took: they did not happen
            _, _, _, tid = self._checks.get_nowait()
            self.controller.transactions.uncount_check(tid)
        await self.controller.stop()

    def _topics(self) -> dict[str, dict]:
        out = {}
        for t in self.controller.list_topics(include_system=True):
            if is_lmq(t.name):  # every broker holds every LMQ: no route to register
                continue
            out[t.name] = {"queues": t.queues, "queue_base": t.queue_base, "perm": t.perm,
                           "type": t.message_type.value}
            if t.mapping is not None:
                out[t.name]["mapping"] = t.mapping
            attrs = t.route_attributes()
            if attrs:  # what the gateways' send plans need (a batch topic is packed by them)
                out[t.name]["attributes"] = attrs
        return out

    async def register(self) -> int:
        ok = 0
        topics = self._topics()
        for ns in self.nameservers:
            try:
                if self.replication is None:
                    await ns.call("register_broker", self.name, self.address, self.perm, topics, rpc_timeout=3.0)
                else:  # the master epoch fences a deposed master still re-registering the group's name
                    await ns.call("register_broker", self.name, self.address, self.perm, topics,
                                  replicated=True, epoch=self.replication.epoch, rpc_timeout=3.0)
                ok += 1
            except Exception as e:
                log.debug("nameserver %s unreachable: %s", ns.address, e)
        return ok

    def _topics_changed(self) -> None:
        # A topic the broker made itself (a DLQ on the first dead letter of a group): the
        # nameservers learn of it at once; changes during a registration coalesce into one more.
        if self._registering is not None and not self._registering.done():
            self._reregister = True
            return
        self._registering = asyncio.ensure_future(self._register_changes())

    async def _register_changes(self) -> None:
        while True:
            self._reregister = False
            await self.register()
            if not self._reregister:
                return

    async def _topics_registered(self) -> None:
        """Wait (bounded) until a topic change this call caused is known to the nameservers,
        so a client told "done" can route to the new topic at once (pop a DLQ it just fed)."""
        t = self._registering
        if t is not None and not t.done():
            await asyncio.wait({t}, timeout=5.0)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self.register()

    # ------------------------------------------------------------------ remote methods

    def ping(self) -> dict:
        return {"name": self.name, "perm": self.perm}

    async def set_perm(self, perm: int) -> None:
        """Write-block (read-only) or reopen this broker, e.g. to drain it before scale-in."""
        self.perm = perm
        await self.register()

    def _reload_fence(self) -> None:
        self.fence.reload(self.controller.list_topics())

    async def create_topic(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig:
        r = self.controller.create_topic(tc, exist_ok)
        if not is_lmq(tc.name):
            self._reload_fence()
            await self.register()
        return r

    async def update_topic(self, tc: TopicConfig) -> TopicConfig:
        cur = self.controller.get_topic(tc.name)
        if cur is not None and cur.mapping is not None and tc.mapping is not None:
            if QueueMapping.from_json(tc.mapping).epoch < QueueMapping.from_json(cur.mapping).epoch:
                raise BadRequestError(f"the map of {tc.name!r} given is older than this broker's")
        r = self.controller.update_topic(tc)
        self._reload_fence()
        await self.register()
        return r

    async def delete_topic(self, name: str) -> None:
        self.controller.delete_topic(name)
        if not is_lmq(name):
            self._reload_fence()
            await self.register()

    def seal_queue(self, topic: str, queue_id: int, epoch: int) -> int:
        """Close this broker's item of a static topic's logic queue where its physical queue
        ends now, and answer that end (a remap's first step; see static_fence.py). Synchronous
        on purpose: no put can run between reading the end and fencing the queue."""
        tc = self.controller.store.topics.require(topic)
        sealed = self.fence.seal(tc, queue_id, self.controller.store.max_offset(topic, queue_id), epoch)
        if sealed is not None:
            self.controller.update_topic(sealed)
            self._reload_fence()
            self._topics_changed()
        return QueueMapping.from_json(self.controller.store.topics.require(topic).mapping or {}).last(queue_id).phys_end

    def get_topic(self, name: str) -> TopicConfig | None:
        return self.controller.get_topic(name)

    def list_topics(self, include_system: bool = False) -> list[TopicConfig]:
        return self.controller.list_topics(include_system)

    def describe_topic(self, name: str):
        return self.controller.describe_topic(name)

    # The data path's batches travel as blocks of rows (remoting/rows.py), both ways.

    async def send(self, block: bytes, transactional: bool = False, producer_group: str = "") -> bytes:
        """``block``: messages as rows; answers one (PutResult, transaction id) row per message."""
        if not self.perm & PERM_WRITE:
            raise BrokerWriteBlockedError(f"broker {self.name} is write-blocked")
        msgs = messages_from_block(block)
        leads = self.fence.check(msgs, transactional) if self.fence.maps else None
        put = await self.controller.send(msgs, transactional=transactional, producer_group=producer_group)
        if leads is not None:
            put = self.fence.to_logic(leads, put)
        return put_results_to_block(put)

    async def end_transaction(self, transaction_id, commit, source="client"):
        await self.controller.end_transaction(transaction_id, commit, source)

    async def pop(self, group, topic, max_count, invisible_ms, filter_expression=None, wait_ms=0,
                  from_latest=False, skip_queues=(), scan_limits=()) -> bytes:
        """``skip_queues``, ``scan_limits``: a static FIFO topic's queues not to pop now, and
        offsets not to read on from (see gateway/static_topics.py pop_limits)."""
        return popped_to_block(await self.controller.pop(
            group, topic, max_count, invisible_ms, filter_expression, wait_ms, from_latest, skip_queues=skip_queues,
            scan_limits=[tuple(x) for x in scan_limits]))

    def consumed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """Below which offset ``group`` has consumed and acked everything of a queue: its pop
        cursor's floor, else its committed offset (a static FIFO topic's drain check)."""
        c = self.controller.pops.cursors.get((group, topic, queue_id))
        return c.floor() if c is not None else self.controller.get_offset(group, topic, queue_id)

    async def ack(self, group, receipt_handle):
        await self.controller.ack(group, receipt_handle)

    async def ack_batch(self, group, receipt_handles):
        return await self.controller.ack_batch(group, receipt_handles)

    async def change_invisible(self, group, receipt_handle, invisible_ms):
        return await self.controller.change_invisible(group, receipt_handle, invisible_ms)

    async def forward_to_dlq(self, group, receipt_handle):
        await self.controller.forward_to_dlq(group, receipt_handle)
        await self._topics_registered()

    async def pull(self, topic, queue_id, offset, max_count, filter_expression=None, wait_ms=0, map_epoch=0) -> bytes:
        """``map_epoch``: a static topic's map the reader translates by; an older one than this
        broker's is refused (a remap since could have reopened this physical queue further on)."""
        if map_epoch:
            mp = self.fence.maps.get(topic)
            if mp is not None and mp.epoch > map_epoch:
                raise QueueMovedError(f"the map of {topic!r} is at epoch {mp.epoch}, not {map_epoch}", epoch=mp.epoch)
        return get_result_to_block(
            await self.controller.pull(topic, queue_id, offset, max_count, filter_expression, wait_ms)
        )

    def pull_batches(self, topic: str, queue_id: int, offset: int, max_count: int) -> bytes:
        """A batch queue's records whole, each once (BrokerController.pull_batches), for the
        gateway's Arrow pages; None in the block where a pull answers instead."""
        return batches_to_block(self.controller.pull_batches(topic, queue_id, offset, max_count))

    async def read_table(self, topic, queue_id, offset, max_count) -> bytes:
        return get_result_to_block(await self.controller.read_table(topic, queue_id, offset, max_count))

    async def compact_topic(self, topic) -> dict:
        return await self.controller.compact_topic(topic)

    async def commit_offset(self, group, topic, queue_id, offset):
        await self.controller.commit_offset(group, topic, queue_id, offset)

    async def commit_offsets(self, group, offsets):
        await self.controller.commit_offsets(group, [(t, q, o) for t, q, o in offsets])

    async def pull_lanes(self, reads) -> list[bytes | None]:
        """One block per read (as ``pull`` answers), None where the topic does not exist."""
        got = await self.controller.pull_lanes([(t, q, o, n) for t, q, o, n in reads])
        return [None if r is None else get_result_to_block(r) for r in got]
    def get_offset(self, group, topic, queue_id):
        return self.controller.get_offset(group, topic, queue_id)

    async def query_offset(self, topic, queue_id, policy="end", timestamp_ms=0):
        return await self.controller.query_offset_async(topic, queue_id, policy, timestamp_ms)

    async def query_by_id(self, message_id):
        return await self.controller.query_by_id_async(message_id)

    async def query_by_key(self, topic, key, begin_ms=0, end_ms=2**62, max_count=32):
        return await self.controller.query_by_key_async(topic, key, begin_ms, end_ms, max_count)

    async def kv_put(self, namespace, key, value, version=None):
        return await self.controller.kv_put(namespace, key, value, version)

    def kv_get(self, namespace, key):
        return self.controller.kv_get(namespace, key)

    async def kv_put_many(self, namespace, items, writer=""):
        await self.controller.kv_put_many(namespace, [(k, v, ver) for k, v, ver in items], writer)

    async def kv_create_many(self, namespace, items, writer=""):
        return await self.controller.kv_create_many(namespace, [(k, v) for k, v in items], writer)

    def kv_get_many_versioned(self, namespace, keys):
        return [list(a) for a in self.controller.kv_get_many_versioned(namespace, keys)]

    def kv_items(self, namespace):
        return self.controller.kv_items(namespace)

    def kv_get_versioned(self, namespace, key):
        return list(self.controller.kv_get_versioned(namespace, key))

    def kv_items_versioned(self, namespace):
        return {k: list(v) for k, v in self.controller.kv_items_versioned(namespace).items()}

    async def door_watch(self, gateway, namespaces, incarnation, seq, timeout_s):
        r = await self.controller.door_feed.watch(gateway, namespaces, incarnation, seq, timeout_s, self.controller)
        r["kv"] = {ns: {k: list(v) for k, v in items.items()} for ns, items in r["kv"].items()}
        return r

    def door_notify(self, gateway, notes):
        self.controller.door_feed.notify(gateway, notes)

    def consumer_lag(self) -> list[tuple[str, str, int]]:
        return self.controller.consumer_lag()

    def store_stats(self) -> dict:
        return self.controller.store_stats()

    def group_queues(self) -> list[tuple[str, str, int, str, int, int, int]]:
        return self.controller.group_queues()

    async def reset_offset(self, group, topic, queue_id, offset):
        return await self.controller.reset_offset(group, topic, queue_id, offset)

    # ------------------------------------------------------------------ transaction checks

    def _connections(self, n: int) -> None:
        self._n_connections = n

    def _no_gateway(self) -> bool:
        # only while checks go out through gateways (a merged node's own processor may
        # have put its checker in place of this one)
        return self._n_connections == 0 and self.controller.transactions.checker == self._queue_check

    async def _queue_check(self, topic: str, producer_group: str, msg: StoredMessage, tid: str) -> bool:
        if tid in self._offered:
            return True  # the previous check still waits for a gateway: counted, not repeated
        try:
            self._checks.put_nowait([topic, producer_group, msg, tid])
        except asyncio.QueueFull:
            return False
        self._offered.add(tid)
        return True

    async def poll_transaction_checks(self, wait_ms: int = 10_000) -> list[list[Any]]:
        """Checks for a gateway to hand to producers: [[topic, producer group, message, tid], ...]."""
        out: list[list[Any]] = []
        try:
            out.append(await asyncio.wait_for(self._checks.get(), wait_ms / 1000.0))
        except asyncio.TimeoutError:
            return out
        while not self._checks.empty() and len(out) < 256:
            out.append(self._checks.get_nowait())
        for c in out:  # each comes back through transaction_check_outcome
            self._offered.discard(c[3])
            self.controller.transactions.check_in_flight(c[3])
        return out

    def transaction_check_outcome(self, transaction_id: str, delivered: bool) -> None:
        """A gateway tells what became of a check it took: it counts (``delivered``: it reached
        a producer, or the gateway had none to ask) or it was lost on the way (the gateway is
        stopping) and the broker checks again."""
        self.controller.transactions.check_outcome(transaction_id, delivered)
