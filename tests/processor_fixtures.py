"""Fixtures and helpers of the MessagingProcessor suite (tests/test_processor_*.py).

The suite drives every consumption semantic through the processor API only,
so the same tests can run against every deployment shape. The ``processor``
fixture is parametrized over :data:`SHAPES`; each shape is a
:class:`Deployment` that builds a started processor over a data directory and
stops it again. Today there is one shape, ``"merged"`` (broker in this
process behind a ``LocalBrokerClient``); the nameserver issue adds
``"separated"`` by registering one more Deployment in :data:`DEPLOYMENTS` --
no test changes.

What a test gets is a :class:`ProcessorUnderTest`: it forwards every
attribute to the current ``MessagingProcessor`` (``await processor.send(...)``)
and adds :meth:`ProcessorUnderTest.restart`, which stops the deployment and
builds a new one on the same data directory (clean stop, or ``hard=True``:
broker state snapshot not written on the way down, so the restart must replay
the broker journal). A transaction checker registered through
``set_transaction_checker`` is registered again on every restart, before the
new processor starts, the way a door registers it at startup.

Configuration: the defaults below make the broker's clocks fast (revive every
50 ms, no retry back-off, transaction checks after 200 ms, state snapshots
every 200 ms) and the store small. A test module or a single test changes them
by overriding the ``processor_options`` fixture::

    @pytest.fixture
    def processor_options():
        return {"broker": {"max_delivery_attempts": 3}, "processor": {"auto_create_topics": False}}

or per test with ``@pytest.mark.parametrize("processor_options", [{...}], ids=["..."])``.

Waiting: every helper that waits has a deadline and fails with what it saw so
far; nothing asserts how fast anything happened.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Protocol

import pytest

from core_broker.config import BrokerConfig, FlushMode, StoreConfig
from core_broker.model import FilterExpression, FilterType, Message
from core_broker.pop_service import PoppedMessage
from gateway.context import RequestContext
from gateway.processor import MessagingProcessor, ProcessorConfig

CTX = RequestContext(protocol="test", client_id="processor-suite", remote_address="127.0.0.1:1")

# Something due at time T (a delay message, a retry after its back-off) may show up to
# this much before T (clock granularity); never earlier. Lateness is not asserted.
EARLY_SLACK_MS = 100

# ----------------------------------------------------------------------------- configuration


def store_config(data_dir: Path, **overrides: Any) -> StoreConfig:
    """A small store: 4 MiB segments, 1000-entry consume-queue files, a small index.

    Retention and offset persistence are pushed out of the way and the disk
    thresholds are zero, so the host's free space never changes an outcome.
    """
    kw: dict[str, Any] = dict(
        data_dir=data_dir,
        flush=FlushMode.ASYNC,
        commitlog_segment_size=4 * 1024 * 1024,
        cq_entries_per_file=1000,
        index_slots=4096,
        index_entries_per_file=16384,
        flush_interval_ms=20,
        checkpoint_interval_ms=100,
        retention_check_interval_s=3600.0,
        consumer_offset_persist_interval_s=3600.0,
        disk_min_free_ratio=0.0,
        disk_refuse_free_ratio=0.0,
    )
    kw.update(overrides)
    return StoreConfig(**kw)


def broker_config(**overrides: Any) -> BrokerConfig:
    """Broker clocks for tests: everything that waits in production waits milliseconds here."""
    kw: dict[str, Any] = dict(
        retry_backoff_ms=(0,),
        revive_interval_ms=50,
        transaction_check_immunity_ms=200,
        transaction_check_interval_ms=100,
        transaction_check_max=5,
        state_snapshot_interval_s=0.2,
        max_long_poll_ms=10_000,
    )
    kw.update(overrides)
    return BrokerConfig(**kw)


def processor_config(store: StoreConfig, **overrides: Any) -> ProcessorConfig:
    kw: dict[str, Any] = dict(default_queue_count=4, max_message_size=store.max_message_size)
    kw.update(overrides)
    return ProcessorConfig(**kw)


# ----------------------------------------------------------------------------- deployment shapes


class Deployment(Protocol):
    """One deployment shape: builds and starts a processor over ``data_dir``; stops it."""

    async def start(self) -> MessagingProcessor: ...
    async def stop(self, hard: bool = False) -> None: ...


class MergedDeployment:
    """Gateway and broker in one process (``unimq up``): ``gateway.deployment.merged_processor``."""

    def __init__(self, data_dir: Path, options: dict[str, dict[str, Any]]) -> None:
        self.data_dir = data_dir
        self.options = options
        self.processor: MessagingProcessor | None = None

    async def start(self) -> MessagingProcessor:
        from gateway.deployment import merged_processor

        sc = store_config(self.data_dir, **self.options.get("store", {}))
        bc = broker_config(**self.options.get("broker", {}))
        pc = processor_config(sc, **self.options.get("processor", {}))
        p = merged_processor(sc, bc, pc)
        self.processor = p
        return p

    async def stop(self, hard: bool = False) -> None:
        p, self.processor = self.processor, None
        if p is None:
            return
        if hard:
            # The broker process dies between two state snapshots: the store still shuts
            # down (a store crash is test_store_crash.py's business), but the broker's
            # snapshot is not rewritten, so the restart must replay the broker journal.
            controller = getattr(p.broker, "broker", None)
            if controller is not None:

                async def no_snapshot() -> None:
                    return None

                controller.write_snapshot = no_snapshot  # type: ignore[method-assign]
        await p.stop()


class SeparatedDeployment:
    """One nameserver, two brokers and two gateways as OS processes (``unimq nameserver|broker|gateway``).

    The test talks to the gateways through :class:`gateway.processor_rpc.RemoteProcessor`,
    which spreads calls over both (a pop through one gateway is acked through the other).
    Starting five processes per test would dominate the suite's time, so clusters are
    shared by the tests that use the same options, and each test runs in a namespace
    of its own (RocketMQ's namespaces: it sees only its own topics and groups).
    ``restart()`` restarts the test's cluster for real; ``hard=True`` is a crash: every
    process gets SIGKILL.
    """

    clusters: dict[str, Any] = {}  # options key -> running Cluster, shared across tests

    def __init__(self, data_dir: Path, options: dict[str, dict[str, Any]]) -> None:
        import uuid

        self.options = options
        self.namespace = "ns" + uuid.uuid4().hex[:10]
        self.cluster: Any = None
        self.processor: Any = None
        self.key = ""

    def _configs(self, root: Path) -> tuple[Path, Path, Any]:
        import dataclasses

        from unimq.local_cluster import write_toml

        sc = store_config(root, **self.options.get("store", {}))
        bc = broker_config(**self.options.get("broker", {}))
        pc = processor_config(sc, **self.options.get("processor", {}))
        store_table = {k: v for k, v in dataclasses.asdict(sc).items() if k != "data_dir"}
        broker_table = {k: v for k, v in dataclasses.asdict(bc).items() if k != "broker_name"}
        broker_toml = write_toml(root / "broker.toml", {}, {"store": store_table, "broker": broker_table})
        gateway_toml = write_toml(
            root / "gateway.toml",
            {"doors": [], "auto_create_topics": pc.auto_create_topics, "default_queue_count": pc.default_queue_count},
            {"store": {"max_message_size": pc.max_message_size}},
        )
        return broker_toml, gateway_toml, pc

    async def start(self) -> Any:
        import atexit
        import json
        import tempfile

        from gateway.processor_rpc import RemoteProcessor
        from unimq.local_cluster import Cluster

        self.key = json.dumps(self.options, sort_keys=True, default=str)
        cluster = self.clusters.get(self.key)
        if cluster is None:
            root = Path(tempfile.mkdtemp(prefix="unimq-cluster-"))
            broker_toml, gateway_toml, _ = self._configs(root)
            cluster = Cluster(root, brokers=2, gateways=2, broker_toml=broker_toml, gateway_toml=gateway_toml)
            await asyncio.to_thread(cluster.start)
            if not self.clusters:
                atexit.register(self.stop_all)
            self.clusters[self.key] = cluster
        self.cluster = cluster
        _, _, pc = self._configs(cluster.root)
        # each test sticks to one of the two gateways (both get used across the suite);
        # tests/test_separated.py spreads calls over both, pop through one, ack through the other
        self.processor = RemoteProcessor(cluster.gateway_rpc(), namespace=self.namespace,
                                         preferred=int(self.namespace[2:], 16) % 2)
        self.processor.config = pc
        return self.processor

    async def stop(self, hard: bool = False) -> None:
        """End of a test: the shared cluster keeps running."""
        p, self.processor = self.processor, None
        if p is not None:
            await p.stop()

    async def restart(self, hard: bool, options: dict[str, dict[str, Any]]) -> Any:
        """Restart this test's cluster (all five processes) on the same data, maybe with new options."""
        await self.stop()
        cluster = self.clusters.pop(self.key, None) or self.cluster
        await asyncio.to_thread(cluster.kill9 if hard else cluster.stop)
        self.options = options
        cluster.broker_toml, cluster.gateway_toml, _ = self._configs(cluster.root)
        cluster.brokers, cluster.gateways = {}, []
        await asyncio.to_thread(cluster.start)
        import json

        self.key = json.dumps(self.options, sort_keys=True, default=str)
        old = self.clusters.pop(self.key, None)
        if old is not None and old is not cluster:
            await asyncio.to_thread(old.stop)
        self.clusters[self.key] = cluster
        return await self.start()

    @classmethod
    def stop_all(cls) -> None:
        import shutil

        for c in cls.clusters.values():
            c.stop()
            shutil.rmtree(c.root, ignore_errors=True)
        cls.clusters.clear()


DEPLOYMENTS: dict[str, Callable[[Path, dict[str, dict[str, Any]]], Deployment]] = {
    "merged": MergedDeployment,
    "separated": SeparatedDeployment,
}
SHAPES = list(DEPLOYMENTS)


class ProcessorUnderTest:
    """The processor a test talks to, plus ``restart()``. Attribute access is forwarded."""

    def __init__(self, shape: str, data_dir: Path, options: dict[str, dict[str, Any]]) -> None:
        self.shape = shape
        self.data_dir = data_dir
        self.options = {k: dict(v) for k, v in options.items()}
        self.deployment: Deployment | None = None
        self.current: MessagingProcessor | None = None
        self.restarts = 0
        self._checker: Any = None

    async def start(self) -> "ProcessorUnderTest":
        self.deployment = DEPLOYMENTS[self.shape](self.data_dir, self.options)
        p = await self.deployment.start()
        if self._checker is not None:
            p.set_transaction_checker(self._checker)
        await p.start()
        self.current = p
        return self

    async def stop(self, hard: bool = False) -> None:
        d, self.deployment, self.current = self.deployment, None, None
        if d is not None:
            await d.stop(hard=hard)

    async def restart(self, *, hard: bool = False, **options: dict[str, Any]) -> "ProcessorUnderTest":
        """Stop, then build and start a new processor on the same data dir.

        ``options`` (``broker={...}``, ``processor={...}``, ``store={...}``) are
        merged into the configuration from now on.
        """
        for section, values in options.items():
            self.options.setdefault(section, {}).update(values)
        self.restarts += 1
        d = self.deployment
        if d is not None and hasattr(d, "restart"):  # shapes that restart in place (separated)
            self.current = None
            p = await d.restart(hard, self.options)
            if self._checker is not None:
                p.set_transaction_checker(self._checker)
            await p.start()
            self.current = p
            return self
        await self.stop(hard=hard)
        return await self.start()

    def set_transaction_checker(self, checker: Any) -> None:
        self._checker = checker
        assert self.current is not None, "processor is stopped"
        self.current.set_transaction_checker(checker)

    def __getattr__(self, name: str) -> Any:
        current = self.__dict__.get("current")
        if current is None:
            raise AttributeError(f"{name}: the processor under test is stopped")
        return getattr(current, name)


@pytest.fixture
def processor_options() -> dict[str, dict[str, Any]]:
    """Override in a module, class or with parametrize to change the configuration."""
    return {}


@pytest.fixture(params=SHAPES)
async def processor(
    request: pytest.FixtureRequest, tmp_path: Path, processor_options: dict[str, dict[str, Any]]
) -> AsyncIterator[ProcessorUnderTest]:
    put = ProcessorUnderTest(request.param, tmp_path / "data", processor_options)
    await put.start()
    try:
        yield put
    finally:
        await put.stop()


@pytest.fixture
async def merged_processor(tmp_path: Path) -> AsyncIterator[MessagingProcessor]:
    """A started MessagingProcessor over an in-process broker, for tests of the processor's own
    pieces (authorization, namespaces, its RPC) that need the object itself, not a shape."""
    from gateway.deployment import merged_processor as build

    sc = store_config(tmp_path / "data")
    p = build(sc, broker_config(), processor_config(sc))
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


# ----------------------------------------------------------------------------- helpers


def msg(topic: str, body: bytes | str = b"", **kw: Any) -> Message:
    if isinstance(body, str):
        body = body.encode()
    return Message(topic, body, **kw)


def tags(expr: str) -> FilterExpression:
    return FilterExpression(expr, FilterType.TAG)


def sql(expr: str) -> FilterExpression:
    return FilterExpression(expr, FilterType.SQL92)


def now_ms() -> int:
    return int(time.time() * 1000)


async def send_bodies(
    p: Any, topic: str, bodies: Iterable[bytes | str], batch: int = 256, **kw: Any
) -> list[Any]:
    """Send bodies in batches; returns every SendResult in order."""
    out: list[Any] = []
    chunk: list[Message] = []
    for b in bodies:
        chunk.append(msg(topic, b, **kw))
        if len(chunk) >= batch:
            out += await p.send(CTX, chunk)
            chunk = []
    if chunk:
        out += await p.send(CTX, chunk)
    return out


async def pop_until(
    p: Any,
    group: str,
    topic: str,
    count: int,
    *,
    timeout: float = 10.0,
    invisible_ms: int = 30_000,
    ack: bool = False,
    filter_expression: FilterExpression | None = None,
    max_count: int = 32,
    from_latest: bool = False,
) -> list[PoppedMessage]:
    """Pop (long-polling in short slices) until ``count`` messages came, or fail at ``timeout``."""
    got: list[PoppedMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(
                f"{group}/{topic}: got {len(got)} of {count} messages within {timeout}s: "
                f"{[m.message.body for m in got][:20]}"
            )
        batch = await p.pop(
            CTX, group, topic, min(max_count, count - len(got)), invisible_ms, filter_expression,
            wait_ms=int(min(left, 0.5) * 1000), from_latest=from_latest,
        )
        for m in batch:
            if ack:
                await p.ack(CTX, group, topic, m.receipt_handle)
        got += batch
    return got


async def pop_nothing(
    p: Any,
    group: str,
    topic: str,
    *,
    wait_ms: int = 300,
    filter_expression: FilterExpression | None = None,
) -> None:
    """Assert that a pop long-polling ``wait_ms`` gets nothing."""
    batch = await p.pop(CTX, group, topic, 32, 30_000, filter_expression, wait_ms=wait_ms)
    assert batch == [], f"{group}/{topic}: expected nothing, got {[m.message.body for m in batch]}"


async def eventually(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Call ``check`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout}s: {what or check!r} (last: {last!r})")
        await asyncio.sleep(interval)


def bodies(popped: Iterable[PoppedMessage]) -> list[bytes]:
    return [m.message.body for m in popped]


async def wait_for_topic(p: Any, name: str, timeout: float = 10.0) -> None:
    """Wait until ``name`` (a system topic the broker creates on demand, e.g. a DLQ) exists."""

    async def exists() -> bool:
        return name in {t.name for t in await p.list_topics(CTX, include_system=True)}

    await eventually(exists, timeout=timeout, what=f"topic {name!r} exists")
