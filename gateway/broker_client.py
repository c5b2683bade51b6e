"""The processor's view of the brokers behind it, and its in-process implementation.

The :class:`BrokerClient` protocol is the seam between the two deployment
shapes: merged mode uses :class:`LocalBrokerClient` (direct calls on a
``BrokerController`` in this process), separated mode a remote client that
finds brokers through the nameserver and calls them over RPC. Both speak the
same domain types, so the processor and its test suite do not know which one
they run on. Every call that targets data names the broker that owns it
(routes and receipt handles carry broker names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Coroutine, NamedTuple, Protocol, Sequence

from core_broker.broker_controller import BrokerController, TopicStats
from core_broker.errors import BadRequestError
from core_broker.logic_queue import QueueMapping
from core_broker.model import FilterExpression, GetResult, Message, PutResult, StoredMessage
from core_broker.pop_service import PoppedMessage
from core_broker.topic_config import PERM_READ, PERM_WRITE, TopicConfig
from core_broker.transaction_service import TransactionChecker


#: Undecoded queue entries and commitlog bytes for columnar readers (see MessageStore.get_raw).
RawPage = tuple[bytes, memoryview, int, str, int, int]


@dataclass(frozen=True)
class QueueRoute:
    broker: str
    queue_id: int
    perm: int


@dataclass
class TopicRoute:
    config: TopicConfig
    queues: list[QueueRoute]

    @property
    def brokers(self) -> list[str]:
        return sorted({q.broker for q in self.queues})

    @property
    def writable(self) -> list[QueueRoute]:
        """The writable queues, computed once per route object (the send path asks per message)."""
        w = self.__dict__.get("_writable")
        if w is None:
            if self.config.mapping is not None:  # static: each logic queue's leader, in logic order
                w = self.__dict__["_writable"] = self.queues[:self.config.queues]
            else:
                w = self.__dict__["_writable"] = [q for q in self.queues if q.perm & PERM_WRITE]
        return w


    @property
    def readable_brokers(self) -> list[str]:
        """Brokers holding at least one readable queue of the topic (sorted), computed once."""
        r = self.__dict__.get("_readable")
        if r is None:
            r = self.__dict__["_readable"] = sorted({q.broker for q in self.queues if q.perm & PERM_READ})
        return r


class BrokerInfo(NamedTuple):
    """One broker (or replicated group, by its name) as the gateway sees it."""

    name: str
    address: str  # "" for the broker in this process
    writable: bool
    replicated: bool
    live: bool  # answering (not isolated after failed calls)
    topics: int


class ClusterView(NamedTuple):
    """The nameservers a gateway asks and the brokers they list."""

    nameservers: list[str]
    brokers: list[BrokerInfo]


class BrokerClient(Protocol):
    """Everything the processor asks of the brokers; both clients implement all of it.

    Capabilities one shape lacks are still declared, with the answer that shape
    gives (``route_nowait`` None, ``pull_raw`` unused when ``reads_raw`` is false,
    ``invalidate``/``host_queue`` doing nothing where nothing is cached or one
    broker holds everything), so the processor never probes its client.
    """

    #: Whether :meth:`pull_raw` can answer (only an in-process broker hands out views of its store).
    reads_raw: bool

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    # -- routes and topics
    def route_nowait(self, topic: str) -> TopicRoute | None:
        """The route when it is at hand without a round trip, else None (then :meth:`route`).
        The same object while the topic is unchanged: callers may cache by its identity."""
        ...
    async def route(self, topic: str) -> TopicRoute | None: ...
    def invalidate(self, topic: str) -> None:
        """Forget what is cached about ``topic`` (it was just created or changed elsewhere)."""
        ...
    async def create_topic(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig: ...
    async def host_queue(self, broker: str, name: str) -> None:
        """Make ``name`` (one queue, id 0) known on ``broker`` so it can be read there."""
        ...
    async def update_topic(self, tc: TopicConfig) -> TopicConfig: ...
    async def delete_topic(self, name: str) -> None: ...
    async def list_topics(self, include_system: bool = False) -> list[TopicConfig]: ...
    async def describe_topic(self, name: str) -> TopicStats: ...

    # -- produce
    async def send(
        self, broker: str, msgs: Sequence[Message], transactional: bool, producer_group: str
    ) -> list[tuple[PutResult, str | None]]: ...
    def writes_now(self) -> bool:
        """True when a plain message's write is acknowledged as soon as it is written (a broker in
        this process, async flush, no replica condition): the processor may then use
        :meth:`put_nowait` for a single send. Asked per send: a replica condition can come and go."""
        ...
    def put_nowait(self, broker: str, msg: Message) -> PutResult:
        """One plain (not delayed, not transactional) message stored by a synchronous call; only
        while :meth:`writes_now` holds (the remote client never does, and refuses)."""
        ...
    def put_batch_nowait(self, broker: str, msgs: Sequence[Message]) -> list[PutResult]:
        """:meth:`put_nowait` for a run of plain messages (one store call: the compiled encoder
        takes runs of one queue); only while :meth:`writes_now` holds."""
        ...
    async def end_transaction(self, broker: str, transaction_id: str, commit: bool, source: str) -> None: ...
    def set_transaction_checker(self, checker: TransactionChecker | None) -> None: ...

    # -- pop
    async def pop(
        self, broker: str, group: str, topic: str, max_count: int, invisible_ms: int,
        filter_expression: FilterExpression | None, wait_ms: int, from_latest: bool,
    ) -> list[PoppedMessage]: ...
    async def ack(self, broker: str, group: str, receipt_handle: str) -> None: ...
    async def ack_batch(self, broker: str, group: str, receipt_handles: Sequence[str]) -> list[str | None]:
        """Per handle None or the error code it failed with; one journal record for all."""
        ...
    async def change_invisible(
        self, broker: str, group: str, receipt_handle: str, invisible_ms: int
    ) -> tuple[str, int]: ...
    async def forward_to_dlq(self, broker: str, group: str, receipt_handle: str) -> None: ...

    # -- pull
    async def pull(
        self, broker: str, topic: str, queue_id: int, offset: int, max_count: int,
        filter_expression: FilterExpression | None, wait_ms: int,
    ) -> GetResult: ...
    async def pull_raw(
        self, broker: str, topic: str, queue_id: int, offset: int, max_count: int
    ) -> RawPage | None: ...
    async def pull_batches(self, broker: str, topic: str, queue_id: int, offset: int,
                           max_count: int) -> tuple[list, int, int] | None:
        """A batch topic's records whole, each once (for Arrow pages; over the broker RPC too), or
        None where the queue is not a batch queue or the offset is out of its range (the reader
        then pulls single messages)."""
        ...
    async def commit_offset(self, broker: str, group: str, topic: str, queue_id: int, offset: int) -> None: ...
    async def commit_offsets(self, broker: str, group: str, offsets: Sequence[tuple[str, int, int]]) -> None:
        """(topic, queue id, offset) of many queues on ``broker``, one journal record for all."""
        ...
    async def pull_lanes(self, broker: str, reads: Sequence[tuple[str, int, int, int]]) -> list[GetResult | None]:
        """(topic, queue id, offset, max count) of many queues on ``broker``, read in one call;
        None where a topic does not exist there."""
        ...
    async def get_offset(self, broker: str, group: str, topic: str, queue_id: int) -> int | None: ...
    async def query_offset(self, broker: str, topic: str, queue_id: int, policy: str, timestamp_ms: int) -> int: ...
    async def read_table(self, broker: str, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult: ...
    async def compact_topic(self, broker: str, topic: str) -> dict: ...

    # -- query
    async def query_by_id(self, message_id: str) -> StoredMessage | None: ...
    async def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int) -> list[StoredMessage]: ...

    # -- durable door state
    async def kv_put(self, namespace: str, key: str, value: bytes | None) -> None: ...
    async def kv_get(self, namespace: str, key: str) -> bytes | None: ...
    async def kv_items(self, namespace: str) -> dict[str, bytes]: ...
    async def kv_put_many(self, namespace: str, items: dict[str, bytes | None], writer: str) -> None: ...
    async def kv_create_many(self, namespace: str, items: dict[str, bytes], writer: str) -> set[str]: ...
    async def kv_get_many(self, namespace: str, keys: list[str]) -> dict[str, bytes | None]: ...
    async def door_watch(self, broker: str, gateway: str, namespaces: list[str], incarnation: str, seq: int,
                         timeout_s: float) -> dict[str, Any]: ...
    async def door_notify(self, broker: str, gateway: str, notes: list[Any]) -> None: ...
    async def broker_names(self) -> list[str]:
        """The names of every broker this client reaches (a fresh ask of the nameservers)."""
        ...

    # -- observability
    async def consumer_lag(self) -> list[tuple[str, str, int]]: ...
    async def store_stats(self) -> dict: ...
    async def group_queues(self) -> list[tuple[str, str, int, str, int, int, int]]:
        """(group, topic, queue, broker, consumer offset, max offset, in flight) over every broker."""
        ...
    async def reset_offset(self, broker: str, group: str, topic: str, queue_id: int, offset: int) -> int:
        """Move the group to ``offset`` (clamped to the queue's bounds); returns where it went."""
        ...
    async def remap_queue(self, topic: str, queue_id: int, broker: str) -> dict:
        """A static topic's logic queue written on ``broker`` from now on; its new map (as JSON)."""
        ...
    async def release_queue(self, topic: str, queue_id: int, broker: str) -> dict:
        """Scale-in: ``broker``'s drained old part of a static topic's logic queue forgotten."""
        ...
    async def cluster(self) -> ClusterView:
        """The nameservers and brokers (none and this process's broker in the merged shape)."""
        ...


class LocalBrokerClient:
    """Merged deployment: the broker lives in this process; calls are direct."""

    reads_raw = True

    def __init__(self, controller: BrokerController, owns: bool = True) -> None:
        self.broker = controller
        self.name = controller.name
        self._owns = owns
        self._routes: dict[str, TopicRoute] = {}

    async def start(self) -> None:
        if self._owns and not self.broker.started:
            await self.broker.start()

    async def stop(self) -> None:
        if self._owns:
            await self.broker.stop()

    def _check(self, broker: str) -> BrokerController:
        if broker != self.name:
            raise BadRequestError(f"unknown broker {broker!r}")
        return self.broker

    # -- topics
    def route_nowait(self, topic: str) -> TopicRoute | None:
        """The route without a coroutine (the processor's send path asks once per call).

        Reused while the topic's config object is the same one (any change replaces it),
        so callers may cache what they derive from a route by its identity.
        """
        tc = self.broker.route_config(topic)
        if tc is None:
            return None
        cached = self._routes.get(topic)
        if cached is not None and cached.config is tc:
            return cached
        if len(self._routes) > 65536:  # topics come and go (LMQs): do not grow without bound
            self._routes.clear()
        r = self._routes[topic] = TopicRoute(tc, [QueueRoute(self.name, q, tc.perm) for q in tc.queue_ids])
        return r

    async def route(self, topic: str) -> TopicRoute | None:
        return self.route_nowait(topic)

    def invalidate(self, topic: str) -> None:
        return None  # routes follow the topic's config object: nothing goes stale

    async def host_queue(self, broker: str, name: str) -> None:
        return None  # one broker holds every queue: nothing to add

    async def create_topic(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig:
        if tc.attributes.get("static") == "true":  # one broker: every logic queue lives here, for good
            if tc.message_type.value not in ("NORMAL", "FIFO"):
                raise BadRequestError(f"a static topic is NORMAL or FIFO, not {tc.message_type.value}")
            tc.queue_base = 0
            tc.mapping = QueueMapping.initial(tc.queues, [self.name]).to_json()
        return self.broker.create_topic(tc, exist_ok)

    async def update_topic(self, tc: TopicConfig) -> TopicConfig:
        cur = self.broker.get_topic(tc.name)
        if cur is not None and (cur.mapping is not None or tc.attributes.get("static") == "true"):
            if cur.mapping is None or tc.attributes.get("static") != "true":
                raise BadRequestError(f"topic {tc.name!r}: a topic is made static (or not) at its creation, for good")
            if tc.queues != cur.queues:
                raise BadRequestError(f"topic {tc.name!r} is static: its {cur.queues} logic queues are fixed")
            tc.attributes["static"] = "true"
            tc.mapping = cur.mapping
        return self.broker.update_topic(tc)

    async def delete_topic(self, name: str) -> None:
        self.broker.delete_topic(name)

    async def list_topics(self, include_system: bool = False) -> list[TopicConfig]:
        return self.broker.list_topics(include_system)

    async def describe_topic(self, name: str) -> TopicStats:
        return self.broker.describe_topic(name)

    # -- produce
    # The hot pass-throughs below are plain functions returning the controller's
    # coroutine (one coroutine frame less per call); callers await them as before.
    def send(
        self, broker: str, msgs: Sequence[Message], transactional: bool, producer_group: str
    ) -> Coroutine[Any, Any, list[tuple[PutResult, str | None]]]:
        return self._check(broker).send(msgs, transactional=transactional, producer_group=producer_group)

    def writes_now(self) -> bool:
        return not self.broker.durability.waits

    def put_nowait(self, broker: str, msg: Message) -> PutResult:
        return self._check(broker).put_nowait(msg)

    def put_batch_nowait(self, broker: str, msgs: Sequence[Message]) -> list[PutResult]:
        return self._check(broker).put_batch_nowait(msgs)

    async def end_transaction(self, broker: str, transaction_id: str, commit: bool, source: str) -> None:
        await self._check(broker).end_transaction(transaction_id, commit, source)

    def set_transaction_checker(self, checker: TransactionChecker | None) -> None:
        self.broker.set_transaction_checker(checker)

    # -- pop
    def pop(
        self, broker: str, group: str, topic: str, max_count: int, invisible_ms: int,
        filter_expression: FilterExpression | None, wait_ms: int, from_latest: bool,
    ) -> Coroutine[Any, Any, list[PoppedMessage]]:
        return self._check(broker).pop(
            group, topic, max_count, invisible_ms, filter_expression, wait_ms, from_latest
        )

    def ack(self, broker: str, group: str, receipt_handle: str) -> Coroutine[Any, Any, None]:
        return self._check(broker).ack(group, receipt_handle)

    def ack_batch(
        self, broker: str, group: str, receipt_handles: Sequence[str]
    ) -> Coroutine[Any, Any, list[str | None]]:
        return self._check(broker).ack_batch(group, receipt_handles)

    async def change_invisible(self, broker: str, group: str, receipt_handle: str, invisible_ms: int) -> tuple[str, int]:
        return await self._check(broker).change_invisible(group, receipt_handle, invisible_ms)

    async def forward_to_dlq(self, broker: str, group: str, receipt_handle: str) -> None:
        await self._check(broker).forward_to_dlq(group, receipt_handle)

    # -- pull
    async def pull(
        self, broker: str, topic: str, queue_id: int, offset: int, max_count: int,
        filter_expression: FilterExpression | None, wait_ms: int,
    ) -> GetResult:
        return await self._check(broker).pull(topic, queue_id, offset, max_count, filter_expression, wait_ms)

    async def pull_raw(self, broker: str, topic: str, queue_id: int, offset: int, max_count: int) -> RawPage | None:
        return self._check(broker).pull_raw(topic, queue_id, offset, max_count)

    async def pull_batches(self, broker: str, topic: str, queue_id: int, offset: int, max_count: int) -> tuple[list, int, int] | None:
        return self._check(broker).pull_batches(topic, queue_id, offset, max_count)

    async def commit_offset(self, broker: str, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self._check(broker).commit_offset(group, topic, queue_id, offset)

    async def commit_offsets(self, broker: str, group: str, offsets: Sequence[tuple[str, int, int]]) -> None:
        await self._check(broker).commit_offsets(group, list(offsets))

    async def pull_lanes(self, broker: str, reads: Sequence[tuple[str, int, int, int]]) -> list[GetResult | None]:
        return await self._check(broker).pull_lanes(list(reads))

    async def get_offset(self, broker: str, group: str, topic: str, queue_id: int) -> int | None:
        return self._check(broker).get_offset(group, topic, queue_id)

    async def query_offset(self, broker: str, topic: str, queue_id: int, policy: str, timestamp_ms: int) -> int:
        return await self._check(broker).query_offset_async(topic, queue_id, policy, timestamp_ms)

    async def read_table(self, broker: str, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        return await self._check(broker).read_table(topic, queue_id, offset, max_count)

    async def compact_topic(self, broker: str, topic: str) -> dict:
        return await self._check(broker).compact_topic(topic)

    # -- query
    async def query_by_id(self, message_id: str) -> StoredMessage | None:
        return await self.broker.query_by_id_async(message_id)

    async def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[StoredMessage]:
        return await self.broker.query_by_key_async(topic, key, begin_ms, end_ms, max_count)

    # -- durable door state
    async def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        await self.broker.kv_put(namespace, key, value)

    async def kv_get(self, namespace: str, key: str) -> bytes | None:
        return self.broker.kv_get(namespace, key)

    async def kv_items(self, namespace: str) -> dict[str, bytes]:
        return self.broker.kv_items(namespace)

    async def kv_put_many(self, namespace: str, items: dict[str, bytes | None], writer: str) -> None:
        b = self.broker
        await b.kv_put_many(namespace, [(k, v, b.next_kv_version()) for k, v in items.items()], writer)

    async def kv_create_many(self, namespace: str, items: dict[str, bytes], writer: str) -> set[str]:
        keys = list(items)
        refused = await self.broker.kv_create_many(namespace, list(items.items()), writer)
        return {keys[i] for i in refused}

    async def kv_get_many(self, namespace: str, keys: list[str]) -> dict[str, bytes | None]:
        return {k: self.broker.kv_get(namespace, k) for k in keys}

    async def door_watch(self, broker: str, gateway: str, namespaces: list[str], incarnation: str, seq: int,
                         timeout_s: float) -> dict[str, Any]:
        b = self._check(broker)
        return await b.door_feed.watch(gateway, namespaces, incarnation, seq, timeout_s, b)

    async def door_notify(self, broker: str, gateway: str, notes: list[Any]) -> None:
        self._check(broker).door_feed.notify(gateway, notes)

    async def broker_names(self) -> list[str]:
        return [self.name]  # in process: the one broker

    # -- observability
    async def consumer_lag(self) -> list[tuple[str, str, int]]:
        return self.broker.consumer_lag()

    async def store_stats(self) -> dict:
        return self.broker.store_stats()

    async def group_queues(self) -> list[tuple[str, str, int, str, int, int, int]]:
        return self.broker.group_queues()

    async def reset_offset(self, broker: str, group: str, topic: str, queue_id: int, offset: int) -> int:
        return await self._check(broker).reset_offset(group, topic, queue_id, offset)

    async def remap_queue(self, topic: str, queue_id: int, broker: str) -> dict:
        raise BadRequestError("one broker holds every logic queue here: remapping needs the separated "
                              "deployment (unimq cluster up)")

    async def release_queue(self, topic: str, queue_id: int, broker: str) -> dict:
        raise BadRequestError("one broker holds every logic queue here: nothing to release")

    async def cluster(self) -> ClusterView:
        n = len(self.broker.list_topics(False))
        return ClusterView([], [BrokerInfo(self.name, "", True, False, True, n)])
