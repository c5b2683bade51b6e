"""Static topics (logic queues) in the separated deployment: a nameserver, three brokers and two
gateways as real processes, shared by the tests of this module (each uses its own topic).

A logic queue remapped while producers and consumers run loses nothing and delivers nothing
twice; a key stays in its logic queue; logic offsets stay dense; a consumer group's committed
offsets and a message group's order hold across remaps, for pull and for pop; old offsets are
read where they were written (nothing is copied); scale-in releases a drained old part only.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest

from core_broker.logic_queue import MappingItem, QueueMapping
from core_broker.model import GetStatus, Message
from core_broker.remoting.client import RpcClient
from gateway.context import RequestContext
from gateway.processor_rpc import RemoteProcessor
from nameserver.client import NameserverClient, parse_addresses
from unimq.local_cluster import Cluster
from conftest import REPO_ROOT, TEST_STORE_ARGS

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

CTX = RequestContext("test", client_id="static-topics")
BROKERS = ["broker-a", "broker-b", "broker-c"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: Any) -> Any:
    c = Cluster(tmp_path_factory.mktemp("static"), brokers=3, gateways=2, lease_s=10.0, heartbeat_s=1.0,
                extra_broker_args=TEST_STORE_ARGS).start()
    yield c
    c.stop()


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    url = f"http://127.0.0.1:{cluster.gateways[0].ports['http']}"
    return subprocess.run([sys.executable, "-m", "unimq", "topic", *args, "--endpoint", url],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


async def _broker_rpc(cluster: Cluster, broker: str, method: str, *args: Any) -> Any:
    ns = NameserverClient(parse_addresses(cluster.namesrv))
    try:
        addr = {b["name"]: b["address"] for b in await ns.call_any("list_brokers")}[broker]
    finally:
        await ns.close()
    host, _, port = addr.rpartition(":")
    c = RpcClient(host, int(port))
    try:
        return await c.call(method, *args)
    finally:
        await c.close()


def _mapping(rp_answer: Any) -> QueueMapping:
    return QueueMapping.from_json(rp_answer)


def test_remapped_three_times_while_producing_and_consuming(cluster: Cluster) -> None:
    """Producer through one gateway, pull consumer through the other (restarted half way from its
    committed offsets), and one logic queue remapped a -> b -> c -> a meanwhile (twice by the
    processor API of the other gateway, whose routes go stale, once by the CLI)."""
    topic, n_keys, total = "orders-static", 12, 720

    async def main() -> None:
        producer = RemoteProcessor(cluster.gateway_rpc(), preferred=0)
        admin = RemoteProcessor(cluster.gateway_rpc(), preferred=1)
        await producer.create_topic(CTX, topic, queues=4, message_type="FIFO", attributes={"static": "true"})
        sent: dict[int, tuple[str, int, int]] = {}  # seq -> (key, logic queue, logic offset)
        hot: list[int] = []  # the logic queue of key k0, remapped
        remaps: list[str] = []
        produced = asyncio.Event()

        async def produce() -> None:
            seq = 0
            while seq < total:
                batch = [Message(topic, str(seq + i).encode(), message_group=f"k{(seq + i) % n_keys}")
                         for i in range(6)]
                for m, r in zip(batch, await producer.send(CTX, batch)):
                    sent[int(m.body)] = (m.message_group, r.queue_id, r.queue_offset)
                seq += len(batch)
                if not hot:
                    hot.append(sent[0][1])
                if seq in (180, 360, 540):  # three remaps while sending and reading
                    start = (await producer.describe_topic(CTX, topic)).config.mapping
                    lead = QueueMapping.from_json(start).last(hot[0]).broker
                    to = BROKERS[(BROKERS.index(lead) + 1) % 3]
                    if seq == 360:
                        done = await asyncio.to_thread(_cli, cluster, "remap", topic, "--queue", str(hot[0]),
                                                       "--to", to)
                        assert done.returncode == 0, done.stderr
                        assert f"remapped: {topic} logic queue {hot[0]}" in done.stdout
                    else:
                        await admin.remap_queue(CTX, topic, hot[0], to)
                    remaps.append(to)
                await asyncio.sleep(0)
            produced.set()

        read: list[tuple[int, int, int]] = []  # (logic queue, logic offset, seq) in read order
        group = "analytics"

        async def consume(rp: RemoteProcessor, stop_after: int | None) -> None:
            pos = {}
            for q in range(4):
                c = await rp.get_offset(CTX, group, topic, q)
                pos[q] = c or 0
                if stop_after is None:  # restarted: it continues exactly where it committed
                    assert c == last_commit.get(q), (q, c, last_commit)
            while True:
                idle = True
                for q in range(4):
                    r = await rp.pull(CTX, topic, q, pos[q], 16, wait_ms=0)
                    for m in r.messages:
                        read.append((q, m.queue_offset, int(m.body)))
                    if r.messages:
                        idle = False
                    pos[q] = r.next_offset
                    await rp.commit_offset(CTX, group, topic, q, pos[q])
                    last_commit[q] = pos[q]
                if stop_after is not None and len(read) >= stop_after:
                    return
                if idle:
                    if produced.is_set() and len(read) >= total:
                        return
                    await asyncio.sleep(0.05)

        last_commit: dict[int, int] = {}
        first = RemoteProcessor(cluster.gateway_rpc(), preferred=1)
        await asyncio.gather(produce(), consume(first, total // 2))
        await first.stop()
        second = RemoteProcessor(cluster.gateway_rpc(), preferred=0)  # the other gateway
        await asyncio.wait_for(consume(second, None), 60)
        await second.stop()

        assert len(remaps) == 3
        seqs = [s for _, _, s in read]
        assert sorted(seqs) == list(range(total))  # nothing lost, nothing twice
        queue_of: dict[str, int] = {}
        for q, off, s in read:
            key, sq, soff = sent[s]
            assert (sq, soff) == (q, off)  # the send's answer names where it is read
            assert queue_of.setdefault(key, q) == q  # a key always lands in its logic queue
        for q in range(4):
            offs = [off for qq, off, _ in read if qq == q]
            assert offs == list(range(len(offs)))  # logic offsets dense, read in order
        last: dict[str, int] = {}
        for q, off, s in read:
            key = sent[s][0]
            assert s > last.get(key, -1)  # FIFO order within a message group
            last[key] = s
        mp = QueueMapping.from_json((await admin.describe_topic(CTX, topic)).config.mapping)
        chain = mp.chain(hot[0])
        assert [i.broker for i in chain][1:] == remaps and len(chain) == 4
        assert chain[-1].broker == chain[0].broker  # back on its first broker: its queue continues
        assert chain[-1].phys_start == chain[0].phys_end
        assert sum(1 for _, _, _ in read) == total
        await producer.stop()
        await admin.stop()

    asyncio.run(main())


def test_fifo_pop_across_a_remap_keeps_group_order(cluster: Cluster) -> None:
    """Messages popped and not acked on the old broker come back first: the new broker's part of
    the logic queue waits until the old part is consumed, so each message group stays in order."""
    topic = "pop-static"

    async def main() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, topic, queues=2, message_type="FIFO", attributes={"static": "true"})
        first = await rp.send(CTX, [Message(topic, str(i).encode(), message_group=f"g{i % 4}") for i in range(40)])
        held = await rp.pop(CTX, "workers", topic, 8, 2_000, wait_ms=1000)  # in flight, never acked
        assert held
        for q in sorted({r.queue_id for r in first}):
            lead = QueueMapping.from_json((await rp.describe_topic(CTX, topic)).config.mapping).last(q).broker
            await rp.remap_queue(CTX, topic, q, BROKERS[(BROKERS.index(lead) + 1) % 3])
        second = await rp.send(CTX, [Message(topic, str(i).encode(), message_group=f"g{i % 4}")
                                     for i in range(40, 80)])
        for a, b in zip(first, second):  # same groups, same logic queues, on the new brokers
            assert a.queue_id == b.queue_id and a.broker != b.broker
        acked: list[tuple[str, int]] = []
        deadline = time.monotonic() + 60
        while len(acked) < 80 and time.monotonic() < deadline:
            got = await rp.pop(CTX, "workers", topic, 16, 10_000, wait_ms=500)
            for p in got:
                acked.append((p.message.message_group, int(p.message.body)))
            if got:
                await rp.ack_batch(CTX, "workers", topic, [p.receipt_handle for p in got])
        assert sorted(s for _, s in acked) == list(range(80))  # each once, the held ones again
        for g in {g for g, _ in acked}:
            order = [s for gg, s in acked if gg == g]
            assert order == sorted(order), (g, order)
        await rp.stop()

    asyncio.run(main())


def test_fifo_pop_when_a_queue_comes_back_to_its_first_broker(cluster: Cluster) -> None:
    """a -> b -> a with messages held in flight on a: the first broker's two parts of the queue
    are one physical queue; every message comes once and each group in order (see the README's
    limits for the interleaving this does not cover)."""
    topic = "pop-back-static"

    async def main() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, topic, queues=1, message_type="FIFO", attributes={"static": "true"})

        async def send(first: int) -> None:
            await rp.send(CTX, [Message(topic, str(i).encode(), message_group=f"g{i % 2}") for i in range(first, first + 10)])

        await send(0)
        held = await rp.pop(CTX, "workers", topic, 4, 1_500, wait_ms=1000)  # in flight, never acked
        assert held
        first = QueueMapping.from_json((await rp.describe_topic(CTX, topic)).config.mapping).last(0).broker
        await rp.remap_queue(CTX, topic, 0, BROKERS[(BROKERS.index(first) + 1) % 3])
        await send(10)
        mp = _mapping(await rp.remap_queue(CTX, topic, 0, first))
        assert [i.broker for i in mp.chain(0)] == [first, BROKERS[(BROKERS.index(first) + 1) % 3], first]
        await send(20)
        acked: list[tuple[str, int]] = []
        deadline = time.monotonic() + 40
        while len(acked) < 30 and time.monotonic() < deadline:
            got = await rp.pop(CTX, "workers", topic, 32, 10_000, wait_ms=300)
            acked += [(p.message.message_group, int(p.message.body)) for p in got]
            if got:
                await rp.ack_batch(CTX, "workers", topic, [p.receipt_handle for p in got])
        assert sorted(s for _, s in acked) == list(range(30))
        for g in ("g0", "g1"):
            order = [s for gg, s in acked if gg == g]
            assert order == sorted(order), (g, order)
        await rp.stop()

    asyncio.run(main())


def test_fifo_group_waits_for_the_part_in_between(cluster: Cluster) -> None:
    """a -> b -> a, one group (g1) still holding a message of a's first part: the other group (g0),
    whose first-part messages are acked, gets nothing from a's newer part before its message on b."""
    topic = "pop-between-static"

    async def main() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, topic, queues=1, message_type="FIFO", attributes={"static": "true"})
        await rp.send(CTX, [Message(topic, b"0", message_group="g1"), Message(topic, b"1", message_group="g0")])
        first = await rp.pop(CTX, "workers", topic, 32, 60_000, wait_ms=1000)
        assert sorted(p.message.body for p in first) == [b"0", b"1"]
        held = next(p for p in first if p.message.message_group == "g1")
        await rp.ack(CTX, "workers", topic, next(p for p in first if p.message.message_group == "g0").receipt_handle)
        a = QueueMapping.from_json((await rp.describe_topic(CTX, topic)).config.mapping).last(0).broker
        b = BROKERS[(BROKERS.index(a) + 1) % 3]
        await rp.remap_queue(CTX, topic, 0, b)
        await rp.send(CTX, [Message(topic, b"2", message_group="g0")])  # on b
        await rp.remap_queue(CTX, topic, 0, a)
        await rp.send(CTX, [Message(topic, b"3", message_group="g0")])  # on a again
        assert await rp.pop(CTX, "workers", topic, 32, 60_000, wait_ms=500) == []  # "3" must wait for "2"
        await rp.ack(CTX, "workers", topic, held.receipt_handle)  # a's first part consumed
        order = []
        deadline = time.monotonic() + 30
        while len(order) < 2 and time.monotonic() < deadline:
            got = await rp.pop(CTX, "workers", topic, 32, 60_000, wait_ms=300)
            order += [p.message.body for p in got]
            for p in got:
                await rp.ack(CTX, "workers", topic, p.receipt_handle)
        assert order == [b"2", b"3"]
        await rp.stop()

    asyncio.run(main())


def test_old_offsets_are_read_from_the_old_broker_nothing_copied(cluster: Cluster) -> None:
    topic = "reads-static"
    made = _cli(cluster, "create", topic, "--static", "--queues", "2")
    assert made.returncode == 0, made.stderr
    assert "logic queue 0: broker-a from 0 (written now)" in made.stdout

    async def main() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        old = await rp.send(CTX, [Message(topic, f"old{i}".encode(), keys=("device-7",)) for i in range(10)])
        q = old[0].queue_id
        assert {r.queue_id for r in old} == {q} and [r.queue_offset for r in old] == list(range(10))
        lead = QueueMapping.from_json((await rp.describe_topic(CTX, topic)).config.mapping).last(q).broker
        to = "broker-c" if lead != "broker-c" else "broker-a"
        mp = _mapping(await rp.remap_queue(CTX, topic, q, to))
        assert mp.chain(q) == [MappingItem(lead, 0, 0, 10), MappingItem(to, 10, 0)]
        new = await rp.send(CTX, [Message(topic, f"new{i}".encode(), keys=("device-7",)) for i in range(10)])
        assert [(r.queue_id, r.queue_offset, r.broker) for r in new] == [(q, 10 + i, to) for i in range(10)]
        # each broker holds its own part only: nothing was copied
        old_part = await _broker_rpc(cluster, lead, "describe_topic", topic)
        new_part = await _broker_rpc(cluster, to, "describe_topic", topic)
        assert old_part.queues[q].max_offset == 10 and new_part.queues[q].max_offset == 10
        r = await rp.pull(CTX, topic, q, 3, 100)  # an old offset: served by the old broker
        assert [m.body for m in r.messages] == [f"old{i}".encode() for i in range(3, 10)]
        assert [m.queue_offset for m in r.messages] == list(range(3, 10)) and r.next_offset == 10
        r = await rp.pull(CTX, topic, q, r.next_offset, 100)
        assert [m.body for m in r.messages] == [f"new{i}".encode() for i in range(10)] and r.next_offset == 20
        assert await rp.query_offset(CTX, topic, q, "end") == 20
        assert await rp.query_offset(CTX, topic, q, "begin") == 0
        stats = await rp.describe_topic(CTX, topic)
        assert [(s.queue_id, s.min_offset, s.max_offset) for s in stats.queues][q] == (q, 0, 20)
        # a reset moves the group on every broker of the chain; reading its offset back agrees
        assert await rp.reset_offset(CTX, "resetters", topic, q, offset=4) == [(q, 4)]
        assert await rp.get_offset(CTX, "resetters", topic, q) == 4
        await rp.commit_offset(CTX, "resetters", topic, q, 15)
        assert await rp.get_offset(CTX, "resetters", topic, q) == 15
        await rp.stop()

    asyncio.run(main())
    shown = _cli(cluster, "describe", topic)
    assert shown.returncode == 0 and "then broker-" in shown.stdout, shown.stdout
    refused = _cli(cluster, "update", topic, "--attr", "static=false")
    assert refused.returncode == 1
    body = json.loads(_cli(cluster, "describe", topic, "--json").stdout)
    assert body["attributes"]["static"] == "true" and body["mapping"]["epoch"] >= 3


def test_scale_in_drains_then_releases_the_old_part(cluster: Cluster) -> None:
    topic = "scale-static"

    async def main() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, topic, queues=1, attributes={"static": "true"})
        await rp.send(CTX, [Message(topic, f"a{i}".encode()) for i in range(10)])
        r = await rp.pull(CTX, topic, 0, 0, 5)
        await rp.commit_offset(CTX, "slow", topic, 0, r.next_offset)  # 5 of 10 consumed
        first = QueueMapping.from_json((await rp.describe_topic(CTX, topic)).config.mapping).last(0).broker
        to = BROKERS[(BROKERS.index(first) + 1) % 3]
        await rp.remap_queue(CTX, topic, 0, to)
        await rp.send(CTX, [Message(topic, f"b{i}".encode()) for i in range(10)])
        with pytest.raises(Exception, match="not drained"):
            await rp.release_queue(CTX, topic, 0, first)
        with pytest.raises(Exception, match="no closed item"):
            await rp.release_queue(CTX, topic, 0, to)  # the part written now never goes
        r = await rp.pull(CTX, topic, 0, 5, 100)
        assert [m.body for m in r.messages] == [f"a{i}".encode() for i in range(5, 10)]
        await rp.commit_offset(CTX, "slow", topic, 0, r.next_offset)  # the old part consumed
        mp = _mapping(await rp.release_queue(CTX, topic, 0, first))
        assert mp.chain(0) == [MappingItem(to, 10, 0)]
        ns = NameserverClient(parse_addresses(cluster.namesrv))
        deadline = time.monotonic() + 10
        while True:  # the old broker dropped its copy of the topic: it leaves the route
            route = await ns.call_any("query_route", topic)
            if {e["broker"] for e in route["queues"]} == {to} or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        await ns.close()
        assert {e["broker"] for e in route["queues"]} == {to}
        assert await _broker_rpc(cluster, first, "get_topic", topic) is None
        gone = await rp.pull(CTX, topic, 0, 0, 100)  # released offsets: start at the oldest kept
        assert gone.status == GetStatus.OFFSET_MOVED and gone.next_offset == 10
        rest = await rp.pull(CTX, topic, 0, 10, 100)
        assert [m.body for m in rest.messages] == [f"b{i}".encode() for i in range(10)]
        assert await rp.get_offset(CTX, "slow", topic, 0) == 10
        more = await rp.send(CTX, [Message(topic, b"c0")])
        assert more[0].queue_offset == 20 and more[0].broker == to
        await rp.stop()

    asyncio.run(main())


def test_static_topic_rules(cluster: Cluster) -> None:
    async def main() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        with pytest.raises(Exception, match="NORMAL or FIFO"):
            await rp.create_topic(CTX, "delay-static", queues=2, message_type="DELAY", attributes={"static": "true"})
        await rp.create_topic(CTX, "rules-static", queues=6, attributes={"static": "true"})
        stats = await rp.describe_topic(CTX, "rules-static")
        assert len(stats.queues) == 6  # six logic queues over three brokers, not eighteen
        assert sorted(QueueMapping.from_json(stats.config.mapping).brokers()) == BROKERS
        with pytest.raises(Exception, match="logic queues are fixed"):
            await rp.update_topic(CTX, "rules-static", queues=8)
        with pytest.raises(Exception, match="delay and transaction"):
            await rp.send(CTX, [Message("rules-static", b"x", delivery_time_ms=int(time.time() * 1000) + 60_000)])
        with pytest.raises(Exception, match="no broker"):
            await rp.remap_queue(CTX, "rules-static", 0, "broker-z")
        with pytest.raises(Exception, match="logic queues 0 to 5"):
            await rp.remap_queue(CTX, "rules-static", 6, "broker-a")
        await rp.create_topic(CTX, "plain-topic", queues=2)
        with pytest.raises(Exception, match="not static"):
            await rp.remap_queue(CTX, "plain-topic", 0, "broker-a")
        # keys and groups hash to a fixed logic queue; messages without either go round robin
        a = await rp.send(CTX, [Message("rules-static", b"k", keys=("sensor-1",)) for _ in range(5)])
        assert len({r.queue_id for r in a}) == 1
        b = await rp.send(CTX, [Message("rules-static", b"n") for _ in range(12)])
        assert len({r.queue_id for r in b}) == 6
        await rp.stop()

    asyncio.run(main())


def test_a_restarted_old_broker_keeps_its_sealed_part(cluster: Cluster) -> None:
    """The seal is durable: an old leader killed and started again still knows its part is closed
    (it takes no send for the queue) and serves its old offsets."""
    topic = "restart-static"

    async def main() -> str:
        rp = RemoteProcessor(cluster.gateway_rpc())
        await rp.create_topic(CTX, topic, queues=1, attributes={"static": "true"})
        await rp.send(CTX, [Message(topic, f"a{i}".encode()) for i in range(5)])
        old = QueueMapping.from_json((await rp.describe_topic(CTX, topic)).config.mapping).last(0).broker
        await rp.remap_queue(CTX, topic, 0, BROKERS[(BROKERS.index(old) + 1) % 3])
        await rp.stop()
        return old

    old = asyncio.run(main())
    cluster.brokers[old].kill9()
    cluster.start_broker(old)

    async def after() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        tc = await _broker_rpc(cluster, old, "get_topic", topic)
        assert QueueMapping.from_json(tc.mapping).chain(0)[0] == MappingItem(old, 0, 0, 5)
        sent = await rp.send(CTX, [Message(topic, f"b{i}".encode()) for i in range(5)])
        assert [r.queue_offset for r in sent] == list(range(5, 10)) and old not in {r.broker for r in sent}
        deadline = time.monotonic() + 30
        got: list = []
        while len(got) < 10 and time.monotonic() < deadline:  # the gateways find the restarted broker
            try:
                r = await rp.pull(CTX, topic, 0, len(got), 100)
                got += r.messages
            except Exception:
                await asyncio.sleep(0.3)
        assert [m.body for m in got] == [f"a{i}".encode() for i in range(5)] + [f"b{i}".encode() for i in range(5)]
        await rp.stop()

    asyncio.run(after())
