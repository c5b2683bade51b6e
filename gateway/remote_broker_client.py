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
import time
from typing import Any

from core_broker.broker_controller import QueueStats, TopicStats
from core_broker.errors import TopicExistsError, TopicNotFoundError
from core_broker.remoting.client import PeerUnavailableError, RpcClient
from core_broker.topic_config import PERM_WRITE, TopicConfig
from core_broker.transaction_service import TransactionChecker
from nameserver.client import NameserverClient

from .broker_client import QueueRoute, TopicRoute

log = logging.getLogger("unimq.remote")


class RemoteBrokerClient:
    def __init__(self, nameservers: list[tuple[str, int]], route_ttl_s: float = 30.0, isolate_s: float = 15.0) -> None:
        self.ns = NameserverClient(nameservers)
        self.route_ttl_s = route_ttl_s
        self.isolate_s = isolate_s
        self._clients: dict[str, RpcClient] = {}
        self._addr: dict[str, str] = {}
        self._routes: dict[str, tuple[TopicRoute, float]] = {}
        self._isolated: dict[str, float] = {}  # broker -> until (monotonic)
        self._checker: TransactionChecker | None = None
        self._pollers: dict[str, asyncio.Task] = {}
        self._broker_list: tuple[list[dict], float] = ([], 0.0)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for t in self._pollers.values():
            t.cancel()
        self._pollers.clear()
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
        self._addr[broker] = address

    async def _brokers(self, refresh: bool = False) -> list[dict]:
        cached, at = self._broker_list
        if not refresh and cached and time.monotonic() - at < self.route_ttl_s:
            return cached
        try:
            brokers = await self.ns.call_any("list_brokers")
        except PeerUnavailableError:
            if cached:
                return cached  # every nameserver down: keep serving from what we knew
            raise
        for b in brokers:
            self._note_address(b["name"], b["address"])
        self._broker_list = (brokers, time.monotonic())
        if self._checker is not None:
            self._start_pollers()
        return brokers

    async def list_brokers(self, refresh: bool = False) -> list[dict]:
        """The brokers the nameservers know (name, address, perm, topics)."""
        return await self._brokers(refresh=refresh)

    def invalidate(self, topic: str) -> None:
        self._routes.pop(topic, None)

    # ------------------------------------------------------------------ routes and topics

    async def route(self, topic: str) -> TopicRoute | None:
        cached = self._routes.get(topic)
        now = time.monotonic()
        raw = None
        if cached is None or now - cached[1] >= self.route_ttl_s:
            try:
                raw = await self.ns.call_any("query_route", topic)
            except PeerUnavailableError:
                if cached is None:
                    raise
            else:
                if raw is None:
                    self._routes.pop(topic, None)
                    return None
                queues = []
                total = 0
                for e in raw["queues"]:
                    self._note_address(e["broker"], e["address"])
                    total += e["queues"]
                    queues += [QueueRoute(e["broker"], e["queue_base"] + i, e["perm"]) for i in range(e["queues"])]
                tc = TopicConfig(topic, queues=max(1, min(total, 1024)), message_type=raw["type"],
                                 perm=raw["queues"][0]["perm"] if raw["queues"] else 0x6)
                cached = (TopicRoute(tc, queues), now)
                self._routes[topic] = cached
        route = cached[0]  # type: ignore[index]
        live = [q for q in route.queues if self._live(q.broker)]
        return TopicRoute(route.config, live or route.queues)

    async def create_topic(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig:
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
                    else:  # the topic as the cluster sees it: every broker's queues together
                        prev.queues = min(1024, prev.queues + t.queues)
                        prev.queue_base = min(prev.queue_base, t.queue_base)
            except PeerUnavailableError:
                continue
        return sorted(seen.values(), key=lambda t: t.name)

    async def describe_topic(self, name: str) -> TopicStats:
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
        return TopicStats(TopicConfig(name, queues=max(1, min(len(queues), 1024)), message_type=config.message_type), queues)

    # ------------------------------------------------------------------ data path

    async def send(self, broker, msgs, transactional, producer_group):
        return await self._call(broker, "send", list(msgs), transactional, producer_group)

    async def end_transaction(self, broker, transaction_id, commit, source):
        await self._call(broker, "end_transaction", transaction_id, commit, source)

    async def pop(self, broker, group, topic, max_count, invisible_ms, filter_expression, wait_ms, from_latest):
        return await self._call(
            broker, "pop", group, topic, max_count, invisible_ms, filter_expression, wait_ms, from_latest,
            rpc_timeout=wait_ms / 1000.0 + 30.0,
        )

    async def ack(self, broker, group, receipt_handle):
        await self._call(broker, "ack", group, receipt_handle)

    async def change_invisible(self, broker, group, receipt_handle, invisible_ms):
        return tuple(await self._call(broker, "change_invisible", group, receipt_handle, invisible_ms))

    async def forward_to_dlq(self, broker, group, receipt_handle):
        await self._call(broker, "forward_to_dlq", group, receipt_handle)

    async def pull(self, broker, topic, queue_id, offset, max_count, filter_expression, wait_ms):
        return await self._call(
            broker, "pull", topic, queue_id, offset, max_count, filter_expression, wait_ms,
            rpc_timeout=wait_ms / 1000.0 + 30.0,
        )

    async def commit_offset(self, broker, group, topic, queue_id, offset):
        await self._call(broker, "commit_offset", group, topic, queue_id, offset)

    async def get_offset(self, broker, group, topic, queue_id):
        return await self._call(broker, "get_offset", group, topic, queue_id)

    async def query_offset(self, broker, topic, queue_id, policy, timestamp_ms):
        return await self._call(broker, "query_offset", topic, queue_id, policy, timestamp_ms)

    async def query_by_id(self, message_id):
        for b in await self._brokers():
            try:
                m = await self._call(b["name"], "query_by_id", message_id)
            except PeerUnavailableError:
                continue
            if m is not None:
                return m
        return None

    async def query_by_key(self, topic, key, begin_ms, end_ms, max_count):
        out = []
        for b in await self._hosts(topic):
            try:
                out += await self._call(b, "query_by_key", topic, key, begin_ms, end_ms, max_count)
            except PeerUnavailableError:
                continue
        return out[:max_count]

    # ------------------------------------------------------------------ door state

    async def _kv_broker(self) -> str:
        """Door state lives on the first broker by name (documented limitation)."""
        brokers = await self._brokers()
        if not brokers:
            raise PeerUnavailableError("no broker is registered")
        return min(b["name"] for b in brokers)

    async def kv_put(self, namespace, key, value):
        await self._call(await self._kv_broker(), "kv_put", namespace, key, value)

    async def kv_get(self, namespace, key):
        return await self._call(await self._kv_broker(), "kv_get", namespace, key)

    async def kv_items(self, namespace):
        return await self._call(await self._kv_broker(), "kv_items", namespace)

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
                checker = self._checker
                if checker is None:
                    return
                try:
                    await checker(topic, group, msg, tid)
                except Exception:
                    log.exception("transaction check handler failed")
