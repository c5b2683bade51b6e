"""Separated deployment: brokers found through nameservers, called over unimq RPC.

A gateway holding this client is stateless: routes are cached from any
nameserver that answers (and served from the cache when none does), receipt
handles name their broker, and door state lives on the brokers. A broker
that stops answering is left out of routes for a while, so sends go to the
live brokers' queues until the nameserver's lease drops it for good.

Queue ids are cluster-wide: a topic created through a gateway spreads its
queues over the brokers as contiguous id ranges (``queue_base``), so a topic
of N queues has ids 0..N-1 wherever they live, a queue id alone names one
queue, and the processor's API is the same in both shapes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Sequence

from core_broker.broker_controller import QueueStats, TopicStats, kv_version
from core_broker.errors import (
    BadRequestError, NotEnoughInSyncReplicasError, NotMasterError, QueueMovedError, ReplicaAckTimeoutError,
    TopicExistsError, TopicNotFoundError,
)
from core_broker.logic_queue import QueueMapping
from core_broker.model import FilterExpression, GetResult, Message, PutResult, StoredMessage
from core_broker.pop_service import PoppedMessage
from core_broker.remoting.client import PeerConnectError, PeerUnavailableError, RpcClient
from core_broker.remoting.rows import (
    batches_from_block,
    get_result_from_block,
    messages_to_block,
    popped_from_block,
    put_results_from_block,
)
from core_broker.system_topics import is_lmq
from core_broker.topic_config import PERM_WRITE, TopicConfig, validate_topic_name
from core_broker.transaction_service import TransactionCheckLostError, TransactionChecker
from nameserver.client import NameserverClient

from . import static_topics
from .broker_client import BrokerInfo, ClusterView, QueueRoute, RawPage, TopicRoute
from .remote_lanes import RemoteLaneCalls

log = logging.getLogger("unimq.remote")

KV_BROKERS_MAX_AGE_S = 3.0  # how stale the broker list door state is replicated over may be


class RemoteBrokerClient(RemoteLaneCalls):
    """Separated deployment: every call goes over RPC to the broker that owns the data."""

    reads_raw = False  # the store's bytes are in another process: readers use pull()

    def __init__(self, nameservers: list[tuple[str, int]], route_ttl_s: float = 30.0, isolate_s: float = 15.0,
                 failover_retry_s: float = 15.0) -> None:
        self.ns = NameserverClient(nameservers)
        # How long a send to a replicated group waits for a new master (election after the
        # controller's lease, default 2.5 s, then one heartbeat to register it).
        self.failover_retry_s = failover_retry_s
        self._replicated: set[str] = set()  # brokers that are replicated groups
        self._moved_at: dict[str, float] = {}  # when a broker's address last changed (a failover)
        self.route_ttl_s = route_ttl_s
        self.isolate_s = isolate_s
        self._clients: dict[str, RpcClient] = {}
        self._addr: dict[str, str] = {}
        self._routes: dict[str, tuple[TopicRoute, float]] = {}
        self.maps: dict[str, QueueMapping] = {}  # static topics' maps of logic queues, from their routes
        self._drained: set[tuple] = set()  # static FIFO items found consumed (see static_topics.pop_skip)
        self._isolated: dict[str, float] = {}  # broker -> until (monotonic)
        self._checker: TransactionChecker | None = None
        self._pollers: dict[str, asyncio.Task] = {}
        self._broker_list: tuple[list[dict], float] = ([], 0.0)
        self._check_tasks: set[asyncio.Task] = set()
        self._acks: dict[tuple[str, str], list[tuple[str, asyncio.Future]]] = {}  # acks of this loop turn
        self._ack_tasks: set[asyncio.Task] = set()
        self._repairs: set[asyncio.Task] = set()
        self._kv_writer = random.getrandbits(20)  # this gateway's tie-breaker (see kv_version)
        self._kv_last = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for t in self._pollers.values():
            t.cancel()
        self._pollers.clear()
        if self._check_tasks:  # checks being handed on report their outcome to their broker first
            await asyncio.wait(list(self._check_tasks), timeout=10.0)
        if self._repairs:
            await asyncio.wait(list(self._repairs), timeout=2.0)
        for c in self._clients.values():
            await c.close()
        await self.ns.close()

    # ------------------------------------------------------------------ plumbing

    def _client(self, broker: str) -> RpcClient:
        c = self._clients.get(broker)
        addr = self._addr.get(broker)
        if addr is None:
            raise PeerUnavailableError(f"broker {broker!r} is not known to any nameserver")
        if c is None or c.address != addr:
            host, _, port = addr.rpartition(":")
            c = self._clients[broker] = RpcClient(host, int(port))
        return c

    async def _call(self, broker: str, method: str, *args: Any, **kw: Any) -> Any:
        if broker not in self._addr:
            await self._brokers(refresh=True)
        try:
            return await self._client(broker).call(method, *args, **kw)
        except PeerUnavailableError:
            # Leave it out of routes for a while, and re-ask the nameservers soon:
            # a restarted broker comes back at a new address.
            self._isolated[broker] = time.monotonic() + self.isolate_s
            self._routes = {t: (r, 0.0) for t, (r, _) in self._routes.items()}
            self._broker_list = (self._broker_list[0], 0.0)
            raise

    def _live(self, broker: str) -> bool:
        until = self._isolated.get(broker)
        if until is None:
            return True
        if time.monotonic() >= until:
            del self._isolated[broker]
            return True
        return False

    def _note_address(self, broker: str, address: str) -> None:
        if self._addr.get(broker) not in (None, address):
            self._isolated.pop(broker, None)  # it came back at a new address: try it at once
            self._moved_at[broker] = time.monotonic()  # a replicated group: a new master
        self._addr[broker] = address

    async def _brokers(self, refresh: bool = False, max_age_s: float | None = None) -> list[dict]:
        cached, at = self._broker_list
        if not refresh and cached and time.monotonic() - at < (self.route_ttl_s if max_age_s is None else max_age_s):
            return cached
        try:
            brokers = await self.ns.call_any("list_brokers")
        except PeerUnavailableError:
            if cached:
                return cached  # every nameserver down: keep serving from what we knew
            raise
        for b in brokers:
            self._note_address(b["name"], b["address"])
            if b.get("replicated"):
                self._replicated.add(b["name"])
            else:
                self._replicated.discard(b["name"])
        self._broker_list = (brokers, time.monotonic())
        if self._checker is not None:
            self._start_pollers()
        return brokers

    async def list_brokers(self, refresh: bool = False) -> list[dict]:
        """The brokers the nameservers know (name, address, perm, topics)."""
        return await self._brokers(refresh=refresh)

    def invalidate(self, topic: str) -> None:
        self._routes.pop(topic, None)

    async def _static(self, topic: str) -> QueueMapping | None:
        """A static topic's map (fresh within ``STATIC_ROUTE_TTL_S``), None for other topics."""
        if topic not in self.maps and (topic in self._routes or is_lmq(topic)):
            return None  # known not static (an LMQ never is): no await on the read paths
        await self.route(topic)
        return self.maps.get(topic)

    def route_nowait(self, topic: str) -> TopicRoute | None:
        return None  # a route here is filtered by the brokers' liveness on every ask: use route()

    # ------------------------------------------------------------------ routes and topics

    async def _lmq_route(self, topic: str) -> TopicRoute | None:
        """Every broker holds every LMQ (queue 0, the part multi-dispatch wrote there):
        the nameservers know no LMQ, and its route is the broker list."""
        brokers = sorted(await self._brokers(), key=lambda b: b["name"])
        if not brokers:
            return None
        queues = [QueueRoute(b["name"], 0, b["perm"]) for b in brokers]
        live = [q for q in queues if self._live(q.broker)]
        return TopicRoute(TopicConfig(topic, queues=1), live or queues)

    async def route(self, topic: str) -> TopicRoute | None:
        if is_lmq(topic):
            return await self._lmq_route(topic)
        cached = self._routes.get(topic)
        now = time.monotonic()
        raw = None
        ttl = static_topics.STATIC_ROUTE_TTL_S if topic in self.maps else self.route_ttl_s
        if cached is None or now - cached[1] >= ttl:
            try:
                raw = await self.ns.call_any("query_route", topic)
            except PeerUnavailableError:
                if cached is None:
                    raise
            else:
                if raw is None:
                    self._routes.pop(topic, None)
                    self.maps.pop(topic, None)
                    return None
                for e in raw["queues"]:
                    self._note_address(e["broker"], e["address"])
                if raw.get("mapping") is not None:  # a static topic: its routes come from its map
                    mp = self.maps[topic] = QueueMapping.from_json(raw["mapping"])
                    route = static_topics.route_of(topic, raw, mp)
                    self._routes[topic] = (route, now)
                    return route  # no queue is left out for a dead broker: a key's queue is fixed
                self.maps.pop(topic, None)
                queues = []
                total = 0
                for e in raw["queues"]:
                    total += e["queues"]
                    queues += [QueueRoute(e["broker"], e["queue_base"] + i, e["perm"]) for i in range(e["queues"])]
                tc = TopicConfig(topic, queues=max(1, min(total, 1024)), message_type=raw["type"],
                                 perm=raw["queues"][0]["perm"] if raw["queues"] else 0x6,
                                 attributes=dict(raw.get("attributes") or {}))  # batch topics: send_plan.py
                cached = (TopicRoute(tc, queues), now)
                self._routes[topic] = cached
        route = cached[0]  # type: ignore[index]
        if route.config.mapping is not None:
            return route
        live = [q for q in route.queues if self._live(q.broker)]
        return TopicRoute(route.config, live or route.queues)

    async def create_topic(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig:
        if is_lmq(tc.name):  # implicit on every broker: nothing to create
            validate_topic_name(tc.name)
            return TopicConfig(tc.name, queues=1)
        existing = await self.route(tc.name)
        if existing is not None:
            if exist_ok and existing.config.message_type == tc.message_type:
                return existing.config
            raise TopicExistsError(
                f"topic {tc.name!r} exists with type {existing.config.message_type.value}",
                existing_type=existing.config.message_type.value,
            )
        brokers = [b for b in await self._brokers(refresh=True) if b["perm"] & PERM_WRITE and self._live(b["name"])]
        if not brokers:
            raise PeerUnavailableError("no writable broker is registered with the nameservers")
        if tc.attributes.get("static") == "true":
            return await static_topics.create(self, tc, [b["name"] for b in brokers])
        # The topic's queues are spread over the brokers with contiguous cluster-wide ids:
        # 5 queues on 2 brokers are ids 0-2 on the first and 3-4 on the second.
        brokers.sort(key=lambda b: b["name"])
        k = min(len(brokers), tc.queues)
        base = 0
        for rank, b in enumerate(brokers[:k]):
            n = tc.queues // k + (1 if rank < tc.queues % k else 0)
            per = TopicConfig(
                tc.name, queues=n, message_type=tc.message_type, perm=tc.perm, system=tc.system,
                attributes=dict(tc.attributes), queue_base=base,
            )
            await self._call(b["name"], "create_topic", per, exist_ok)
            base += n
        self.invalidate(tc.name)
        return tc

    async def host_queue(self, broker: str, name: str) -> None:
        # an LMQ: noted in that broker's memory only (no write, no route)
        await self._call(broker, "create_topic", TopicConfig(name, queues=1, queue_base=0), True)
        self.invalidate(name)

    async def _hosts(self, name: str) -> list[str]:
        self.invalidate(name)
        route = await self.route(name)
        if route is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return route.brokers

    async def update_topic(self, tc: TopicConfig) -> TopicConfig:
        """Permission and type go to every broker; added queues extend the last broker's range."""
        hosts = [(b, await self._call(b, "get_topic", tc.name)) for b in await self._hosts(tc.name)]
        hosts = [(b, cur) for b, cur in hosts if cur is not None]
        static = [cur for _, cur in hosts if cur.mapping is not None]
        if static or tc.attributes.get("static") == "true":
            if not static or tc.attributes.get("static") != "true":
                raise BadRequestError(f"topic {tc.name!r}: a topic is made static (or not) at its creation, for good")
            newest = max(static, key=lambda c: c.mapping["epoch"])  # type: ignore[index]
            if tc.queues != newest.queues:
                raise BadRequestError(f"topic {tc.name!r} is static: its {newest.queues} logic queues are fixed")
            for b, _ in hosts:
                await self._call(b, "update_topic", static_topics.static_config(
                    TopicConfig(tc.name, tc.queues, tc.message_type, tc.perm, tc.system, dict(tc.attributes)),
                    QueueMapping.from_json(newest.mapping)))  # type: ignore[arg-type]
            self.invalidate(tc.name)
            return tc
        total = sum(cur.queues for _, cur in hosts)
        last = max(hosts, key=lambda h: h[1].queue_base)[0] if hosts else None
        for b, cur in hosts:
            n = cur.queues + (max(0, tc.queues - total) if b == last else 0)
            per = TopicConfig(
                tc.name, queues=n, message_type=tc.message_type, perm=tc.perm, system=tc.system,
                attributes=dict(tc.attributes), queue_base=cur.queue_base,
            )
            await self._call(b, "update_topic", per)
        self.invalidate(tc.name)
        return tc

    async def delete_topic(self, name: str) -> None:
        if is_lmq(name):  # its parts are wherever messages were dispatched into it
            for info in await self._brokers(refresh=True):
                if self._live(info["name"]):
                    await self._call(info["name"], "delete_topic", name)
            return
        for b in await self._hosts(name):
            await self._call(b, "delete_topic", name)
        self.invalidate(name)

    async def list_topics(self, include_system: bool = False) -> list[TopicConfig]:
        seen: dict[str, TopicConfig] = {}
        for b in await self._brokers(refresh=True):
            if not self._live(b["name"]):
                continue
            try:
                for t in await self._call(b["name"], "list_topics", include_system):
                    prev = seen.get(t.name)
                    if prev is None:
                        seen[t.name] = t
                    elif t.mapping is None:  # the topic as the cluster sees it: every broker's queues together
                        prev.queues = min(1024, prev.queues + t.queues)
                        prev.queue_base = min(prev.queue_base, t.queue_base)
            except PeerUnavailableError:
                continue
        return sorted(seen.values(), key=lambda t: t.name)

    async def describe_topic(self, name: str) -> TopicStats:
        self.invalidate(name)
        mp = await self._static(name)
        if mp is not None:
            tc = await self._call(mp.last(0).broker, "get_topic", name)
            if tc is None:
                raise TopicNotFoundError(f"topic {name!r} does not exist")
            return await static_topics.describe(self, mp, name, tc)
        queues: list[QueueStats] = []
        config = None
        for b in await self._hosts(name):
            try:
                st = await self._call(b, "describe_topic", name)
            except PeerUnavailableError:
                continue
            config = config or st.config
            queues.extend(st.queues)
        if config is None:
            raise PeerUnavailableError(f"no broker of topic {name!r} answered")
        queues.sort(key=lambda q: q.queue_id)
        # the cluster's queues; type and attributes are the same on every broker holding the topic
        tc = TopicConfig(name, queues=max(1, min(len(queues), 1024)), message_type=config.message_type,
                         attributes=dict(config.attributes))
        return TopicStats(tc, queues)

    # ------------------------------------------------------------------ data path

    # send, pop and pull carry their batches as blocks of rows (core_broker/remoting/rows.py)

    async def send(
        self, broker: str, msgs: Sequence[Message], transactional: bool, producer_group: str
    ) -> list[tuple[PutResult, str | None]]:
        try:
            return await self._send_once(broker, msgs, transactional, producer_group)
        except QueueMovedError:  # a static topic's logic queue was remapped: to its new broker
            return await static_topics.resend_moved(self, msgs, transactional, producer_group)

    def writes_now(self) -> bool:
        return False  # every write is a round trip: sends take the awaited path

    def put_nowait(self, broker: str, msg: Message) -> PutResult:
        raise BadRequestError("a remote broker is written with an awaited send")

    def put_batch_nowait(self, broker: str, msgs: Sequence[Message]) -> list[PutResult]:
        raise BadRequestError("a remote broker is written with an awaited send")

    async def _send_once(
        self, broker: str, msgs: Sequence[Message], transactional: bool, producer_group: str
    ) -> list[tuple[PutResult, str | None]]:
        rows = messages_to_block(msgs)
        deadline = 0.0
        while True:
            try:
                block = await self._call(broker, "send", rows, transactional, producer_group)
                return put_results_from_block(block)
            except (PeerConnectError, NotMasterError, NotEnoughInSyncReplicasError) as e:
                # A replicated group's master failed: another member takes its name over within
                # a few heartbeats, so wait for the nameservers to route there and send again
                # (an unreplicated broker fails at once: the processor sends elsewhere). A new
                # master starts with itself alone in sync until a replica has caught up with it:
                # within a failover that wait is part of it; outside one, too few in-sync
                # replicas is the answer the client gets at once. Only refusals of a send that was
                # never carried out are retried (no connection, a member that is not master, too
                # few in sync *before* writing): a connection lost mid-call, or acknowledgements
                # that did not come, go back to the client, which alone may send again (a gateway
                # resend would store a message twice that the client sent once).
                now = time.monotonic()
                failing_over = deadline or now - self._moved_at.get(broker, -1e9) < self.failover_retry_s
                if broker not in self._replicated or isinstance(e, ReplicaAckTimeoutError) or (
                    isinstance(e, NotEnoughInSyncReplicasError) and not failing_over
                ):
                    raise
                deadline = deadline or now + self.failover_retry_s
                if now >= deadline:
                    raise
                await asyncio.sleep(0.25)
                try:
                    await self._brokers(refresh=True)
                except PeerUnavailableError:
                    pass

    async def end_transaction(self, broker: str, transaction_id: str, commit: bool, source: str) -> None:
        await self._call(broker, "end_transaction", transaction_id, commit, source)

    async def pop(
        self, broker: str, group: str, topic: str, max_count: int, invisible_ms: int,
        filter_expression: FilterExpression | None, wait_ms: int, from_latest: bool,
    ) -> list[PoppedMessage]:
        mp = self.maps.get(topic) and await self._static(topic)
        if mp is None:
            return popped_from_block(await self._call(
                broker, "pop", group, topic, max_count, invisible_ms, filter_expression, wait_ms, from_latest,
                rpc_timeout=wait_ms / 1000.0 + 30.0,
            ))
        skip: list = []
        limits: list = []
        if self._routes[topic][0].config.message_type.value == "FIFO":
            skip, limits = await static_topics.pop_limits(self, mp, broker, group, topic, self._drained)
        wait_ms = min(wait_ms, int(static_topics.STATIC_ROUTE_TTL_S * 1000))  # see a remap soon
        return static_topics.to_logic_popped(mp, broker, popped_from_block(await self._call(
            broker, "pop", group, topic, max_count, invisible_ms, filter_expression, wait_ms, from_latest, skip,
            limits, rpc_timeout=wait_ms / 1000.0 + 30.0,
        )))

    async def ack(self, broker: str, group: str, receipt_handle: str) -> None:
        """Acks to one broker and group issued in the same event-loop turn (a door settling
        a popped batch message by message, many consumers at once) travel as one
        ``ack_batch`` call: one RPC and one journal record instead of one each."""
        key = (broker, group)
        batch = self._acks.get(key)
        if batch is None:
            batch = self._acks[key] = []
            asyncio.get_running_loop().call_soon(self._flush_acks, key)
        fut = asyncio.get_running_loop().create_future()
        batch.append((receipt_handle, fut))
        if await fut is not None:
            # rare: that handle failed; ask once more alone for the broker's typed error
            await self._call(broker, "ack", group, receipt_handle)

    def _flush_acks(self, key: tuple[str, str]) -> None:
        batch = self._acks.pop(key, None)
        if batch:
            t = asyncio.ensure_future(self._send_acks(key, batch))
            self._ack_tasks.add(t)
            t.add_done_callback(self._ack_tasks.discard)

    async def _send_acks(self, key: tuple[str, str], batch: list[tuple[str, asyncio.Future]]) -> None:
        broker, group = key
        try:
            codes = await self.ack_batch(broker, group, [h for h, _ in batch])
        except BaseException as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else PeerUnavailableError("cancelled"))
            if not isinstance(e, Exception):
                raise
            return
        for (_, fut), code in zip(batch, codes):
            if not fut.done():
                fut.set_result(code)

    async def ack_batch(self, broker: str, group: str, receipt_handles: Sequence[str]) -> list[str | None]:
        return await self._call(broker, "ack_batch", group, list(receipt_handles))

    async def change_invisible(self, broker: str, group: str, receipt_handle: str, invisible_ms: int) -> tuple[str, int]:
        return tuple(await self._call(broker, "change_invisible", group, receipt_handle, invisible_ms))

    async def forward_to_dlq(self, broker: str, group: str, receipt_handle: str) -> None:
        await self._call(broker, "forward_to_dlq", group, receipt_handle)

    async def pull(
        self, broker: str, topic: str, queue_id: int, offset: int, max_count: int,
        filter_expression: FilterExpression | None, wait_ms: int,
    ) -> GetResult:
        mp = await self._static(topic)
        if mp is not None:
            return await static_topics.pull(self, mp, topic, queue_id, offset, max_count, filter_expression, wait_ms)
        return await self._pull_once(broker, topic, queue_id, offset, max_count, filter_expression, wait_ms)

    async def _pull_once(
        self, broker: str, topic: str, queue_id: int, offset: int, max_count: int,
        filter_expression: FilterExpression | None, wait_ms: int, map_epoch: int = 0,
    ) -> GetResult:
        args: tuple = (map_epoch,) if map_epoch else ()  # a static topic's open item: see BrokerServer.pull
        return get_result_from_block(await self._call(
            broker, "pull", topic, queue_id, offset, max_count, filter_expression, wait_ms, *args,
            rpc_timeout=wait_ms / 1000.0 + 30.0,
        ))

    async def pull_raw(self, broker: str, topic: str, queue_id: int, offset: int, max_count: int) -> RawPage | None:
        return None  # see reads_raw

    async def pull_batches(self, broker: str, topic: str, queue_id: int, offset: int,
                           max_count: int) -> tuple[list, int, int] | None:
        if topic in self.maps:  # a static topic is never a batch topic (TopicConfig refuses both)
            return None
        return batches_from_block(await self._call(broker, "pull_batches", topic, queue_id, offset, max_count))

    async def commit_offset(self, broker: str, group: str, topic: str, queue_id: int, offset: int) -> None:
        mp = await self._static(topic)
        if mp is not None:
            return await static_topics.commit_offset(self, mp, group, topic, queue_id, offset)
        await self._call(broker, "commit_offset", group, topic, queue_id, offset)

    async def get_offset(self, broker: str, group: str, topic: str, queue_id: int) -> int | None:
        mp = await self._static(topic)
        if mp is not None:
            return await static_topics.get_offset(self, mp, group, topic, queue_id)
        return await self._call(broker, "get_offset", group, topic, queue_id)

    async def query_offset(self, broker: str, topic: str, queue_id: int, policy: str, timestamp_ms: int) -> int:
        mp = await self._static(topic)
        if mp is not None:
            return await static_topics.query_offset(self, mp, topic, queue_id, policy, timestamp_ms)
        return await self._call(broker, "query_offset", topic, queue_id, policy, timestamp_ms)

    async def read_table(self, broker: str, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        return get_result_from_block(await self._call(broker, "read_table", topic, queue_id, offset, max_count))

    async def compact_topic(self, broker: str, topic: str) -> dict:
        return await self._call(broker, "compact_topic", topic, rpc_timeout=3600.0)

    async def query_by_id(self, message_id: str) -> StoredMessage | None:
        # Ask the brokers we know; when none has it, ask the nameservers again and try the
        # brokers not asked yet: a list cached while a cluster restarted may lack a broker
        # (the id's broker is not in the id, as any broker may have stored it).
        asked: set[str] = set()
        for refresh in (False, True):
            for b in await self._brokers(refresh=refresh):
                if b["name"] in asked:
                    continue
                try:
                    m = await self._call(b["name"], "query_by_id", message_id)
                except PeerUnavailableError:
                    continue
                asked.add(b["name"])
                if m is not None:
                    return m
        return None

    async def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[StoredMessage]:
        out = []
        for b in await self._hosts(topic):
            try:
                out += await self._call(b, "query_by_key", topic, key, begin_ms, end_ms, max_count)
            except PeerUnavailableError:
                continue
        return out[:max_count]

    # ------------------------------------------------------------------ door state
    #
    # Door state (MQTT sessions and retained messages, AMQP definitions, HTTP push
    # subscriptions) is replicated to every registered broker, each entry with a
    # last-writer-wins version (see BrokerController.kv_put): a write goes to all brokers
    # that answer (at least one must), a read asks all of them and returns the newest
    # copy, writing it back to those that answered with an older one (read repair).
    # So a read never depends on which broker answers: any broker that saw the latest
    # write serves it, and a broker that was down catches up on the next read. What is
    # not possible: reading a value whose every copy is on brokers that are all down.

    def _kv_version(self) -> int:
        v = max(kv_version(self._kv_writer), self._kv_last + 1)
        self._kv_last = v
        return v

    async def _kv_brokers(self) -> list[str]:
        # a broker that (re)joined gets its copies soon: the list is refreshed more often here
        names = sorted(b["name"] for b in await self._brokers(max_age_s=KV_BROKERS_MAX_AGE_S))
        live = [n for n in names if self._live(n)]
        if not (live or names):
            raise PeerUnavailableError("no broker is registered")
        return live or names

    async def _kv_fanout(self, method: str, *args: Any) -> list[tuple[str, Any]]:
        """Call every broker at once; (broker, answer) of those that answered (at least one).

        When none answers, ask again (the nameservers too) for up to ``failover_retry_s``: a
        gateway starting, or reading its doors' state, while a replicated group's master was
        just killed finds only the dead master's address until the new one registers. Door
        state calls are versioned, so a call that reached a broker and is asked again changes
        nothing."""
        deadline = time.monotonic() + self.failover_retry_s
        while True:
            names = await self._kv_brokers()
            answers = await asyncio.gather(*(self._call(b, method, *args) for b in names), return_exceptions=True)
            out = []
            failure: BaseException | None = None
            for b, a in zip(names, answers):
                if isinstance(a, BaseException):
                    if not isinstance(a, PeerUnavailableError):
                        raise a
                    failure = a
                else:
                    out.append((b, a))
            if out:
                return out
            if time.monotonic() >= deadline:
                raise failure or PeerUnavailableError("no broker answered")
            await asyncio.sleep(0.2)
            await self._brokers(refresh=True)

    def _kv_repair(self, stale: list[str], namespace: str, key: str, version: int, value: bytes | None) -> None:
        for b in stale:
            t = asyncio.ensure_future(self._call(b, "kv_put", namespace, key, value, version))
            self._repairs.add(t)
            t.add_done_callback(self._repair_done)

    def _repair_done(self, t: asyncio.Task) -> None:
        self._repairs.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("door state read repair failed: %s", t.exception())

    async def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        await self._kv_fanout("kv_put", namespace, key, value, self._kv_version())

    async def kv_get(self, namespace: str, key: str) -> bytes | None:
        answers = await self._kv_fanout("kv_get_versioned", namespace, key)
        best_v, best = max((a for _, a in answers), key=lambda a: a[0])
        if best_v >= 0:
            self._kv_repair([b for b, a in answers if a[0] < best_v], namespace, key, best_v, best)
        return best

    async def kv_put_many(self, namespace: str, items: dict[str, bytes | None], writer: str) -> None:
        """Several writes, one call per broker (each its own version, in ``items`` order)."""
        await self._kv_fanout("kv_put_many", namespace, [[k, v, self._kv_version()] for k, v in items.items()],
                              writer)

    async def kv_create_many(self, namespace: str, items: dict[str, bytes], writer: str) -> set[str]:
        """Create-if-absent of each entry on every broker (``DoorStateKv.kv_create_many``), one
        call per broker; the keys some broker that answered refused (it held something of them)."""
        keys = list(items)
        answers = await self._kv_fanout("kv_create_many", namespace, [[k, v] for k, v in items.items()], writer)
        return {keys[i] for _, refused in answers for i in refused}

    async def kv_get_many(self, namespace: str, keys: list[str]) -> dict[str, bytes | None]:
        """``kv_get`` of each of ``keys``, one call per broker (read repair as there)."""
        answers = await self._kv_fanout("kv_get_many_versioned", namespace, keys)
        out: dict[str, bytes | None] = {}
        for i, k in enumerate(keys):
            best_v, best = max((a[i] for _, a in answers), key=lambda a: a[0])
            if best_v >= 0:
                self._kv_repair([b for b, a in answers if a[i][0] < best_v], namespace, k, best_v, best)
            out[k] = best
        return out

    async def kv_items(self, namespace: str) -> dict[str, bytes]:
        answers = await self._kv_fanout("kv_items_versioned", namespace)
        merged: dict[str, tuple[int, bytes | None]] = {}
        for _, items in answers:
            for k, (v, val) in items.items():
                cur = merged.get(k)
                if cur is None or v > cur[0]:
                    merged[k] = (v, val)
        for b, items in answers:
            for k, (v, val) in merged.items():
                have = items.get(k)
                if have is None or have[0] < v:
                    self._kv_repair([b], namespace, k, v, val)
        return {k: val for k, (v, val) in merged.items() if val is not None}

    async def door_watch(self, broker: str, gateway: str, namespaces: list[str], incarnation: str, seq: int,
                         timeout_s: float) -> dict[str, Any]:
        r = await self._call(broker, "door_watch", gateway, namespaces, incarnation, seq, timeout_s,
                             rpc_timeout=timeout_s + 10.0)
        r["kv"] = {ns: {k: (v[0], v[1]) for k, v in items.items()} for ns, items in r["kv"].items()}
        return r

    async def door_notify(self, broker: str, gateway: str, notes: list[Any]) -> None:
        await self._call(broker, "door_notify", gateway, notes)

    async def broker_names(self) -> list[str]:
        return sorted(b["name"] for b in await self.list_brokers(refresh=True))

    # ------------------------------------------------------------------ observability

    async def _every_broker(self, method: str) -> list[Any]:
        """``method``'s answer from every live broker at once (those that do not answer are left out)."""
        names = [b["name"] for b in await self._brokers() if self._live(b["name"])]
        answers = await asyncio.gather(*(self._call(b, method) for b in names), return_exceptions=True)
        out = []
        for a in answers:
            if isinstance(a, BaseException):
                if not isinstance(a, PeerUnavailableError):
                    raise a
            else:
                out.append(a)
        return out

    async def consumer_lag(self) -> list[tuple[str, str, int]]:
        """Every broker's backlog per (group, topic), summed over the brokers."""
        lag: dict[tuple[str, str], int] = {}
        for rows in await self._every_broker("consumer_lag"):
            for g, t, n in rows:
                lag[(g, t)] = lag.get((g, t), 0) + n
        return [(g, t, n) for (g, t), n in sorted(lag.items())]

    async def group_queues(self) -> list[tuple[str, str, int, str, int, int, int]]:
        """Every broker's consumer queues, together."""
        return sorted(tuple(r) for rows in await self._every_broker("group_queues") for r in rows)  # type: ignore[misc]

    async def reset_offset(self, broker: str, group: str, topic: str, queue_id: int, offset: int) -> int:
        mp = await self._static(topic)
        if mp is not None:
            return await static_topics.reset_offset(self, mp, group, topic, queue_id, offset)
        return await self._call(broker, "reset_offset", group, topic, queue_id, offset)

    async def remap_queue(self, topic: str, queue_id: int, broker: str) -> dict:
        return await static_topics.remap(self, topic, queue_id, broker)

    async def release_queue(self, topic: str, queue_id: int, broker: str) -> dict:
        return await static_topics.release(self, topic, queue_id, broker)

    async def cluster(self) -> ClusterView:
        brokers = [
            BrokerInfo(b["name"], b["address"], bool(b["perm"] & PERM_WRITE), bool(b.get("replicated")),
                       self._live(b["name"]), len(b.get("topics", ())))
            for b in await self._brokers(refresh=True)
        ]
        return ClusterView([f"{c.host}:{c.port}" for c in self.ns.clients], brokers)

    async def store_stats(self) -> dict:
        """The brokers' commitlog bytes, fdatasync timings and tier figures, summed."""
        out: dict[str, Any] = {"commitlog_bytes": 0, "flush_buckets": (), "flush_counts": [], "flush_seconds_sum": 0.0}
        for s in await self._every_broker("store_stats"):
            out["commitlog_bytes"] += s.get("commitlog_bytes", 0)
            for k, v in s.items():  # present only on brokers with the tier on (disk: where it could be read)
                if k.startswith(("tier_", "disk_")):
                    out[k] = out.get(k, 0) + v
            out["flush_seconds_sum"] += s.get("flush_seconds_sum", 0.0)
            counts = list(s.get("flush_counts", ()))
            if not out["flush_buckets"]:
                out["flush_buckets"] = tuple(s.get("flush_buckets", ()))
                out["flush_counts"] = counts
            elif len(counts) == len(out["flush_counts"]):
                out["flush_counts"] = [a + b for a, b in zip(out["flush_counts"], counts)]
        return out

    # ------------------------------------------------------------------ transaction checks

    def set_transaction_checker(self, checker: TransactionChecker | None) -> None:
        self._checker = checker
        if checker is None:
            for t in self._pollers.values():
                t.cancel()
            self._pollers.clear()
        else:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return
            self._start_pollers()
            asyncio.ensure_future(self._brokers(refresh=True))

    def _start_pollers(self) -> None:
        for name in list(self._addr):
            t = self._pollers.get(name)
            if t is None or t.done():
                self._pollers[name] = asyncio.ensure_future(self._poll_checks(name))

    async def _poll_checks(self, broker: str) -> None:
        while self._checker is not None:
            try:
                checks = await self._call(broker, "poll_transaction_checks", 10_000, rpc_timeout=20.0)
            except PeerUnavailableError:
                await asyncio.sleep(2.0)
                continue
            for topic, group, msg, tid in checks:
                # each check on its own: a checker may wait for a remote producer to confirm
                t = asyncio.ensure_future(self._deliver_check(broker, topic, group, msg, tid))
                self._check_tasks.add(t)
                t.add_done_callback(self._check_tasks.discard)

    async def _deliver_check(self, broker: str, topic: str, group: str, msg: Any, tid: str) -> None:
        """Hand one check to the processor's checkers, then tell the broker what became of it:
        it counts unless it was lost on the way (this gateway is stopping)."""
        delivered = True
        checker = self._checker
        try:
            if checker is not None:
                await checker(topic, group, msg, tid)
            else:
                delivered = False
        except TransactionCheckLostError:
            delivered = False
        except Exception:
            log.exception("transaction check handler failed")
        try:
            await self._call(broker, "transaction_check_outcome", tid, delivered, rpc_timeout=5.0)
        except Exception as e:  # the broker is gone: it counts the check as delivered after a while
            log.debug("could not report a transaction check's outcome to %s: %s", broker, e)
