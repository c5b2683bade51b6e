"""The separated deployment: nameserver + brokers + stateless gateways as real processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from core_broker.model import Message
from core_broker.remoting.client import RpcClient
from gateway.context import RequestContext
from gateway.processor_rpc import RemoteProcessor
from nameserver.client import NameserverClient, parse_addresses
from unimq.local_cluster import Cluster
from conftest import TEST_STORE_ARGS

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

CTX = RequestContext("test", client_id="separated-tests")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, brokers=2, gateways=2, lease_s=4.0, heartbeat_s=1.0, extra_broker_args=TEST_STORE_ARGS).start()
    yield c
    c.stop()


async def _drain(rp: RemoteProcessor, group: str, topic: str, expect: int, timeout: float = 30.0) -> list:
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        batch = await rp.pop(CTX, group, topic, 32, 30_000, wait_ms=500)
        for p in batch:
            await rp.ack(CTX, group, topic, p.receipt_handle)
        got += batch
    return got


async def _route_brokers(namesrv: str, topic: str) -> set[str]:
    ns = NameserverClient(parse_addresses(namesrv))
    try:
        r = await ns.call_any("query_route", topic)
        return {e["broker"] for e in r["queues"]} if r else set()
    finally:
        await ns.close()


def test_topic_spans_brokers_and_ack_through_other_gateway(cluster):
    async def main():
        g1 = RemoteProcessor(cluster.gateway_rpc()[:1])
        g2 = RemoteProcessor(cluster.gateway_rpc()[1:])
        await g1.create_topic(CTX, "orders", queues=2)
        sent = await g1.send(CTX, [Message("orders", f"m{i}".encode()) for i in range(20)])
        assert {r.broker for r in sent} == {"broker-a", "broker-b"}
        popped = []
        while len(popped) < 20:
            popped += await g1.pop(CTX, "g", "orders", 32, 2_000, wait_ms=1000)
        for p in popped:  # acked through the other gateway: gateways share nothing
            await g2.ack(CTX, "g", "orders", p.receipt_handle)
        await asyncio.sleep(3.0)  # past the invisible time: nothing may come back
        again = await g2.pop(CTX, "g", "orders", 32, 2_000, wait_ms=500)
        assert again == []
        assert sorted(p.message.body for p in popped) == sorted(f"m{i}".encode() for i in range(20))
        await g1.stop()
        await g2.stop()

    asyncio.run(main())


def test_kill9_broker_keeps_topic_writable_and_lease_expiry_drops_it(cluster):
    async def main():
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, "t", queues=4)
        assert await _route_brokers(cluster.namesrv, "t") == {"broker-a", "broker-b"}
        cluster.brokers["broker-b"].kill9()
        results = await rp.send(CTX, [Message("t", f"x{i}".encode()) for i in range(30)])
        assert len(results) == 30 and {r.broker for r in results} == {"broker-a"}
        got = await _drain(rp, "g", "t", 30)
        assert sorted(p.message.body for p in got) == sorted(f"x{i}".encode() for i in range(30))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "broker-b" in await _route_brokers(cluster.namesrv, "t"):
            await asyncio.sleep(0.5)
        assert await _route_brokers(cluster.namesrv, "t") == {"broker-a"}
        # the broker comes back with its data: its unread messages are consumed
        await rp.stop()

    asyncio.run(main())


def test_restarted_broker_serves_its_unread_messages(cluster):
    async def main():
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, "r", queues=2)
        sent = await rp.send(CTX, [Message("r", f"y{i}".encode()) for i in range(20)])
        on_b = sum(1 for s in sent if s.broker == "broker-b")
        assert on_b > 0
        cluster.brokers["broker-b"].kill9()
        first = await _drain(rp, "g", "r", 20 - on_b, timeout=15)
        assert len(first) == 20 - on_b
        cluster.start_broker("broker-b")
        await asyncio.sleep(2.0)
        rest = await _drain(rp, "g", "r", on_b, timeout=40)
        assert sorted(p.message.body for p in first + rest) == sorted(f"y{i}".encode() for i in range(20))
        await rp.stop()

    asyncio.run(main())


def test_gateways_serve_cached_routes_when_every_nameserver_is_down(cluster):
    async def main():
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, "c", queues=2)
        await rp.send(CTX, [Message("c", b"warm")])  # both gateways now hold the route
        await rp.send(CTX, [Message("c", b"warm2")])
        cluster.nameserver.kill9()
        results = await rp.send(CTX, [Message("c", f"z{i}".encode()) for i in range(10)])
        assert len(results) == 10
        got = await _drain(rp, "g", "c", 12)
        assert len(got) == 12
        await rp.stop()

    asyncio.run(main())


def test_write_blocked_broker_drains_without_loss(cluster):
    async def main():
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, "d", queues=2)
        before = await rp.send(CTX, [Message("d", f"a{i}".encode()) for i in range(20)])
        assert {r.broker for r in before} == {"broker-a", "broker-b"}
        b = cluster.brokers["broker-b"]
        client = RpcClient("127.0.0.1", b.ports["broker"])
        await client.call("set_perm", 0x4)  # read-only: producers stop, consumers drain
        await client.close()
        after = await rp.send(CTX, [Message("d", f"b{i}".encode()) for i in range(20)])
        assert {r.broker for r in after} == {"broker-a"}
        got = await _drain(rp, "g", "d", 40)
        want = sorted([f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(20)])
        assert sorted(p.message.body for p in got) == want
        assert await _route_brokers(cluster.namesrv, "d") == {"broker-a", "broker-b"}
        await rp.stop()

    asyncio.run(main())


async def _broker_copy(cluster, broker: str, ns: str, key: str) -> list:
    """(version, value) of a door-state entry as one broker holds it (asked directly)."""
    client = RpcClient("127.0.0.1", cluster.brokers[broker].ports["broker"])
    try:
        return await client.call("kv_get_versioned", ns, key)
    finally:
        await client.close()


def test_door_state_is_kept_on_every_broker_and_the_newest_copy_wins(cluster):
    """Door state (retained messages, sessions, definitions) does not depend on which broker
    answers: every broker holds a versioned copy, a read returns the newest one, a broker
    that missed writes is repaired by reads, and a delete is not undone by a stale copy."""

    async def main():
        g1 = RemoteProcessor(cluster.gateway_rpc()[:1])
        g2 = RemoteProcessor(cluster.gateway_rpc()[1:])
        await g1.kv_put(CTX, "doors.test", "k", b"v1")
        await g1.kv_put(CTX, "doors.test", "gone", b"x")
        for b in ("broker-a", "broker-b"):
            assert (await _broker_copy(cluster, b, "doors.test", "k"))[1] == b"v1"
        assert await g2.kv_get(CTX, "doors.test", "k") == b"v1"

        # the broker first by name dies (where door state used to live): nothing is lost
        cluster.brokers["broker-a"].kill9()
        assert await g2.kv_get(CTX, "doors.test", "k") == b"v1"
        await g2.kv_put(CTX, "doors.test", "k", b"v2")  # written while broker-a is down
        await g2.kv_put(CTX, "doors.test", "gone", None)
        assert await g1.kv_items(CTX, "doors.test") == {"k": b"v2"}

        # broker-a comes back with its old copies: reads return the newest and repair it
        cluster.start_broker("broker-a")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            assert await g1.kv_get(CTX, "doors.test", "k") == b"v2"
            assert await g1.kv_items(CTX, "doors.test") == {"k": b"v2"}
            if (await _broker_copy(cluster, "broker-a", "doors.test", "k"))[1] == b"v2" and (
                await _broker_copy(cluster, "broker-a", "doors.test", "gone")
            )[1] is None:
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("broker-a was not repaired by reads")

        # now only broker-a is left: it serves the newest state, the delete included
        cluster.brokers["broker-b"].kill9()
        assert await g2.kv_get(CTX, "doors.test", "k") == b"v2"
        assert await g2.kv_get(CTX, "doors.test", "gone") is None
        assert await g2.kv_items(CTX, "doors.test") == {"k": b"v2"}
        await g1.stop()
        await g2.stop()

    asyncio.run(main())
