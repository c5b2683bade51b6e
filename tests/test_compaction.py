"""Compacted topics through a real `unimq up`: keys overwritten and deleted, compaction forced
over HTTP, the table, pulls from offset 0, delete markers' retention, the doors' answers to a
message without a key, and a SIGKILL in the middle of a compaction.

Waiting: compaction copies only records the commitlog has flushed, so a test asks again (with
a deadline) until a forced compaction has covered what it wrote; nothing asserts how fast.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import paho.mqtt.publish as mqtt_publish
import pika
import pika.exceptions
import pytest
from compaction_helpers import (
    SMALL,
    compact_until_once_per_key,
    create,
    latest_of,
    pull_all,
    put,
    read_table,
    roll,
)
from conftest import TEST_STORE_ARGS
from grpc_helpers import raw_message
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

from core_broker.model import Message
from gateway.context import RequestContext
from gateway.processor_rpc import RemoteProcessor
from unimq.local_cluster import Cluster

pytestmark = pytest.mark.timeout(300)


def test_compaction_keeps_the_latest_value_per_key_and_the_table_reads_it(unimq_server) -> None:
    server = unimq_server(*SMALL)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "kv", delete_retention_ms="3600000")
        create(c, "kvd", delete_retention_ms="1")
        expected: dict[str, dict[str, bytes]] = {"kv": {}, "kvd": {}}
        for topic in expected:
            for rnd in range(4):
                for k in range(40):
                    body = f"{topic}-{rnd}-{k}".encode()
                    put(c, topic, f"key{k}", body)
                    expected[topic][f"key{k}"] = body
            for k in range(0, 40, 8):  # delete markers: an empty body
                put(c, topic, f"key{k}", b"")
                expected[topic][f"key{k}"] = b""
        before = {t: pull_all(c, t) for t in expected}
        roll(c)
        for topic, latest in expected.items():
            got = compact_until_once_per_key(c, topic)
            by_queue: dict[int, list[int]] = {}
            for m in got:
                by_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
            for offsets in by_queue.values():
                assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))
            # the records kept are the ones that were there, at the same offsets
            old = {(m["queue_id"], m["queue_offset"]): m["message_id"] for m in before[topic]}
            assert all(old[(m["queue_id"], m["queue_offset"])] == m["message_id"] for m in got)
            live = {k: v for k, v in latest.items() if v}
            if topic == "kv":  # markers kept for their retention (an hour): a late reader sees the deletes
                assert latest_of(got) == latest
            else:  # 1 ms: gone with the pass that found them expired
                assert latest_of(got) == live
            assert read_table(c, topic) == live
        # writes after compaction: the table has them at once, before any pass
        put(c, "kv", "key1", b"newer")
        put(c, "kv", "key3", b"")
        put(c, "kv", "fresh", b"hello")
        want = {k: v for k, v in expected["kv"].items() if v} | {"key1": b"newer", "fresh": b"hello"}
        want.pop("key3")
        assert read_table(c, "kv") == want
        # a normal topic has no table; compaction of it is refused
        c.post("/v1/topics", json={"name": "plain", "queues": 1})
        assert c.get("/v1/topics/plain/table").status_code == 400
        assert c.get("/v1/topics/kv/table", params={"cursor": "not-a-cursor"}).status_code == 400
        assert c.post("/v1/topics/plain/compact").status_code == 400


def test_a_message_without_a_key_is_refused_by_every_door(unimq_server) -> None:
    server = unimq_server(*SMALL)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "kv", queues=1)
        r = c.post("/v1/topics/kv/messages", content=b"no key")
        assert r.status_code == 400 and r.json()["error"] == "ILLEGAL_MESSAGE_KEY", r.text
        ce = c.post("/v1/topics/kv/events", headers={"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s",
                                                     "ce-type": "t"}, content=b"x")
        # a CloudEvent has a key only with http_index_event_ids on (its id); off by default
        assert ce.status_code == 400 and ce.json()["error"] == "ILLEGAL_MESSAGE_KEY", ce.text

        async def grpc_send() -> tuple[int, int]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as ch:
                stub = sgrpc.MessagingServiceStub(ch)
                bare = await stub.SendMessage(spb.SendMessageRequest(messages=[raw_message("kv", b"v")]), timeout=10)
                keyed = raw_message("kv", b"v")
                keyed.system_properties.keys.append("g1")
                ok = await stub.SendMessage(spb.SendMessageRequest(messages=[keyed]), timeout=10)
                return bare.status.code, ok.status.code

        bare, ok = asyncio.run(grpc_send())
        assert bare == pb.Code.ILLEGAL_MESSAGE_KEY and ok == pb.Code.OK
        # MQTT: the MQTT topic is the key (the latest publish per MQTT topic is kept)
        create(c, "dev", queues=2)
        for i in range(3):
            for d in ("dev/a/temp", "dev/b/temp"):
                mqtt_publish.single(d, f"{d}={i}", qos=1, hostname="127.0.0.1", port=server.ports["mqtt"])
        assert read_table(c, "dev") == {"dev/a/temp": b"dev/a/temp=2", "dev/b/temp": b"dev/b/temp=2"}
        # AMQP: the message-id is the key; without one a confirmed publish is nacked
        create(c, "akv", queues=1)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
        try:
            ch = conn.channel()
            ch.exchange_declare("akv", "fanout")
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("akv", "", b"no key")
            ch.basic_publish("akv", "", b"v1", properties=pika.BasicProperties(message_id="m1"))
        finally:
            conn.close()
        assert read_table(c, "akv") == {"m1": b"v1"}
        assert read_table(c, "kv") == {"g1": b"v"}  # the refused sends stored nothing


def _compacted_files(data_dir: Path) -> list[str]:
    d = data_dir / "compacted" / "big" / "0"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_sigkill_during_compaction_loses_nothing(unimq_server) -> None:
    throttled = (*SMALL, "--set", "store.compaction_max_bytes_per_s=400000", "--set", "store.compaction_map_entries=150")
    server = unimq_server(*throttled)
    expected: dict[str, bytes] = {}
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "big", queues=1)
        for rnd in range(6):
            for k in range(300):
                body = f"{rnd}:{k}:".encode() + bytes([65 + rnd]) * 600
                put(c, "big", f"k{k}", body)
                expected[f"k{k}"] = body
        roll(c)
        time.sleep(0.5)  # flushed (20 ms interval)
        answered: list[int] = []

        def compact() -> None:  # killed under it: the request fails, which is the point
            try:
                answered.append(httpx.post(server.url(path="/v1/topics/big/compact"), timeout=300).status_code)
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=compact, daemon=True)
        t.start()
        # wait for a pass that is writing its generation after at least one was switched in
        deadline = time.monotonic() + 120
        while True:
            names = _compacted_files(server.data_dir)
            if "state.json" in names and any(n.endswith(".tmp") for n in names):
                break
            assert not answered, "compaction finished before the kill: slow it down further"
            assert time.monotonic() < deadline, f"no compaction in progress seen: {names}"
            time.sleep(0.02)
    server.stop(signal.SIGKILL)
    t.join(timeout=30)
    assert any(n.endswith(".tmp") for n in names)

    again = unimq_server(*SMALL, data_dir=server.data_dir)
    with httpx.Client(base_url=again.url(), timeout=30) as c:
        assert not any(n.endswith(".tmp") for n in _compacted_files(again.data_dir))  # cleaned at start
        got = pull_all(c, "big")
        offsets = [m["queue_offset"] for m in got]
        assert offsets == sorted(set(offsets))
        assert latest_of(got) == expected  # a reader from the start: the latest value of every key
        assert read_table(c, "big", page=64) == expected
        got = compact_until_once_per_key(c, "big")
        assert latest_of(got) == expected and len(got) == len(expected)
        assert read_table(c, "big", page=64) == expected


def test_separated_deployment_reads_the_table_and_compacts_through_the_rpcs(tmp_path) -> None:
    """Gateway -> processor RPC -> broker RPC: the table read and the trigger cross both wires."""
    ctx = RequestContext("test", client_id="compaction-tests")
    cluster = Cluster(tmp_path, brokers=2, gateways=1, lease_s=4.0, heartbeat_s=1.0,
                      extra_broker_args=TEST_STORE_ARGS).start()
    try:
        async def main() -> None:
            rp = RemoteProcessor(cluster.gateway_rpc())
            try:
                await rp.create_topic(ctx, "skv", queues=2, message_type="COMPACTED")
                want: dict[str, bytes] = {}
                for rnd in range(3):
                    sent = await rp.send(ctx, [Message("skv", f"{rnd}-{k}".encode(), keys=(f"k{k}",))
                                               for k in range(40)])
                    want.update({f"k{k}": f"{rnd}-{k}".encode() for k in range(40)})
                assert {r.broker for r in sent} == {"broker-a", "broker-b"}  # both brokers hold keys
                route = await rp.query_route(ctx, "skv")
                done = await rp.compact_topic(ctx, "skv")  # every queue of every broker of the topic
                assert set(done) == {"passes", "queues", "removed"} and done["queues"] == len(route.queues)
                got: dict[str, bytes] = {}
                for q in route.queues:
                    off = 0
                    while True:
                        r = await rp.read_table(ctx, "skv", q.queue_id, off, 7)
                        got.update({m.keys[0]: bytes(m.body) for m in r.messages})
                        if r.next_offset >= r.max_offset:
                            break
                        off = r.next_offset
                assert got == want
                with pytest.raises(Exception, match="ILLEGAL_MESSAGE_KEY|needs a key"):
                    await rp.send(ctx, [Message("skv", b"no key")])
            finally:
                await rp.stop()

        asyncio.run(main())
    finally:
        cluster.stop()
