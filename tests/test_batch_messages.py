"""Batch messages through a real `unimq up`: a producer's batch stored as one record in a batch
topic (attribute batch=true) and read back one message at a time, with dense offsets, by every
reading door; one message of a batch acked while the others come back; compressed batches; a
restart; what batch topics refuse.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import threading
import time

import grpc
import httpx
import paho.mqtt.client as mqtt
import pika
import pytest
from grpc_helpers import raw_message, receive_until, simple_consumer, started
from http_helpers import start_server
from rocketmq import FilterExpression
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

from adapters.cloudevents.http_ingest import BATCH_JSON, BATCH_PACKED

pytestmark = pytest.mark.timeout(300)


def create(c: httpx.Client, topic: str, queues: int = 1, **attrs: str) -> None:
    r = c.post("/v1/topics", json={"name": topic, "queues": queues, "attributes": {"batch": "true", **attrs}})
    assert r.status_code in (200, 201), r.text


def send_batch(c: httpx.Client, topic: str, bodies: list[bytes], **extra: object) -> list[dict]:
    data = json.dumps([{"body_base64": base64.b64encode(b).decode(), **extra} for b in bodies])
    r = c.post(f"/v1/topics/{topic}/messages", content=data, headers={"content-type": BATCH_JSON})
    assert r.status_code == 200, r.text
    return r.json()


def pull_all(c: httpx.Client, topic: str, queue: int = 0, start: int = 0, step: int = 7) -> list[dict]:
    out, off = [], start
    while True:
        page = c.get(f"/v1/topics/{topic}/queues/{queue}/messages", params={"offset": off, "max": step}).json()
        out += page["messages"]
        if page["next_offset"] >= page["max_offset"]:
            return out
        off = page["next_offset"]


def bodies_of(msgs: list[dict]) -> list[bytes]:
    return [base64.b64decode(m["body_base64"]) for m in msgs]


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_http_batch_is_one_record_read_back_one_message_at_a_time(unimq_server, tmp_path, compression) -> None:
    server = start_server(unimq_server, tmp_path)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "b", **{"batch.compression": compression})
        sent = [f"m{i}".encode() * 10 for i in range(250)]
        res = send_batch(c, "b", sent[:100], keys=["k1"], properties={"p": "v"}) + send_batch(c, "b", sent[100:])
        assert [r["queue_offset"] for r in res] == list(range(250))
        assert len({r["message_id"] for r in res}) == 250
        got = pull_all(c, "b")
        assert bodies_of(got) == sent
        assert [m["queue_offset"] for m in got] == list(range(250))
        assert [m["message_id"] for m in got] == [r["message_id"] for r in res]
        assert got[0]["keys"] == ["k1"] and got[0]["properties"]["p"] == "v"
        assert not any(k.startswith("__") for m in got for k in m["properties"])
        # a read from the middle of a batch starts at that message
        mid = c.get("/v1/topics/b/queues/0/messages", params={"offset": 57, "max": 5}).json()
        assert [m["queue_offset"] for m in mid["messages"]] == [57, 58, 59, 60, 61]
        assert mid["next_offset"] == 62 and mid["max_offset"] == 250
        # the store holds 2 records: the consume queue has 2 entries for 250 offsets
        stats = c.get("/v1/topics/b").json()
        assert stats["queues"][0]["max_offset"] == 250
    files = list((server.data_dir / "batchqueue" / "b" / "0").iterdir())
    assert files and not (server.data_dir / "consumequeue" / "b").exists()


def _mqtt_sub(port: int, topic: str) -> tuple[mqtt.Client, list[bytes]]:
    got: list[bytes] = []
    ready = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bsub-{time.monotonic_ns()}", protocol=mqtt.MQTTv311)
    c.on_message = lambda client, userdata, msg: got.append(msg.payload)
    c.on_subscribe = lambda *a: ready.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.subscribe(topic, qos=1)
    assert ready.wait(20)
    return c, got


def _until(pred, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (v := pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return v


def test_every_sending_door_batches_and_every_reading_door_sees_single_messages(unimq_server, tmp_path) -> None:
    """HTTP batch, CloudEvents batch mode and a gRPC SendMessage of several messages, each stored as
    one record; read back by pull, HTTP pop, the official gRPC consumer, an MQTT subscriber and an
    AMQP queue, one message at a time, offsets dense and in order."""
    server = start_server(unimq_server, tmp_path)
    sub, mqtt_got = _mqtt_sub(server.ports["mqtt"], "bd/#")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
    ch = conn.channel()
    ch.queue_declare("bq")
    ch.queue_bind("bq", "amq.topic", routing_key="bd.#")
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "bd", **{"batch.compression": "zstd"})
        http_bodies = [b"h%d" % i for i in range(40)]
        res = send_batch(c, "bd", http_bodies, properties={"mqtt_topic": "bd/http"})
        events = [{"specversion": "1.0", "id": f"e{i}", "source": "/s", "type": "t", "mqtttopic": "bd/ce",
                   "datacontenttype": "text/plain", "data": f"c{i}"} for i in range(30)]
        r = c.post("/v1/topics/bd/events", content=json.dumps(events),
                   headers={"content-type": "application/cloudevents-batch+json"})
        assert r.status_code == 200, r.text
        res += r.json()

        async def grpc_send() -> list:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as gch:
                stub = sgrpc.MessagingServiceStub(gch)
                msgs = [raw_message("bd", b"g%d" % i) for i in range(20)]
                for m in msgs:
                    m.user_properties["mqtt_topic"] = "bd/grpc"
                a = await stub.SendMessage(spb.SendMessageRequest(messages=msgs), timeout=10)
                assert a.status.code == pb.Code.OK, a.status
                return [(e.message_id, e.offset) for e in a.entries]

        entries = asyncio.run(grpc_send())
        assert [o for _, o in entries] == list(range(70, 90))
        want = http_bodies + [f"c{i}".encode() for i in range(30)] + [b"g%d" % i for i in range(20)]
        assert [x["queue_offset"] for x in res] == list(range(70))
        # the store holds three records for 90 offsets: three batch-queue entries
        entries_file = sorted((server.data_dir / "batchqueue" / "bd" / "0").iterdir())[0].read_bytes()
        assert entries_file[3 * 32 + 28: 3 * 32 + 32] == b"\0\0\0\0"  # no 4th entry (count 0)
        assert entries_file[2 * 32 + 28: 2 * 32 + 32] == (20).to_bytes(4, "little")
        # pull, one message at a time, from every offset
        got = pull_all(c, "bd", step=1)
        assert bodies_of(got) == want and [m["queue_offset"] for m in got] == list(range(90))
        # each message's id is the one its send answered (the gRPC ones: their client ids), and
        # any message of a batch is found by it
        assert [m["message_id"] for m in got] == [x["message_id"] for x in res] + [mid for mid, _ in entries]
        for k in (0, 1, 39, 40, 69, 70, 71, 89):
            found = c.get("/v1/admin/messages", params={"id": got[k]["message_id"]}).json()["items"]
            assert bodies_of(found) == [want[k]] and found[0]["queue_offset"] == k, k
        # HTTP pop: each message once, acked one by one
        popped: list[dict] = []
        while len(popped) < 90:
            r = c.post("/v1/topics/bd/groups/hp/pop", params={"max": 32, "invisible_s": 60, "wait_s": 1})
            assert r.status_code == 200, r.text
            popped += r.json()["messages"]
        assert sorted(bodies_of(popped)) == sorted(want)
        r = c.post("/v1/topics/bd/groups/hp/ack", json={"receipt_handles": [m["receipt_handle"] for m in popped]})
        assert r.status_code == 200 and r.json()["acked"] == 90
    # the official gRPC consumer
    with started(simple_consumer(server.ports["grpc"], "gc", {"bd": FilterExpression()})) as cons:
        g = receive_until(cons, 90)
    assert sorted(m.body for m in g) == sorted(want)
    # MQTT subscriber and AMQP queue: each message of each batch, in order per source
    _until(lambda: len(mqtt_got) >= 90, what=f"90 MQTT messages (got {len(mqtt_got)})")
    assert mqtt_got == want
    amqp_got: list[bytes] = []

    def drain() -> bool:
        while (b := ch.basic_get("bq", auto_ack=True)[2]) is not None:
            amqp_got.append(b)
        return len(amqp_got) >= 90

    _until(drain, what="90 AMQP messages")
    assert amqp_got == want
    sub.loop_stop()
    sub.disconnect()
    conn.close()


def test_acking_one_message_of_a_batch_redelivers_the_others(unimq_server, tmp_path) -> None:
    server = start_server(unimq_server, tmp_path, "--set", "broker.retry_backoff_ms=[0]",
                          "--set", "broker.revive_interval_ms=100")
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "ba")
        send_batch(c, "ba", [b"a%d" % i for i in range(10)])
        r = c.post("/v1/topics/ba/groups/g/pop", params={"max": 10, "invisible_s": 1})
        first = r.json()["messages"]
        assert [m["queue_offset"] for m in first] == list(range(10))
        acked = first[3]
        r = c.post("/v1/topics/ba/groups/g/ack", json={"receipt_handles": [acked["receipt_handle"]]})
        assert r.status_code == 200 and r.json()["acked"] == 1
        again: list[dict] = []
        deadline = time.monotonic() + 30
        while len(again) < 9:
            assert time.monotonic() < deadline, f"redelivered {bodies_of(again)}"
            r = c.post("/v1/topics/ba/groups/g/pop", params={"max": 10, "invisible_s": 30, "wait_s": 1})
            again += r.json()["messages"]
        # every other message of the batch, each once, as itself; the acked one never again
        assert sorted(bodies_of(again)) == sorted(b"a%d" % i for i in range(10) if i != 3)
        assert all(m["delivery_attempt"] == 2 for m in again)
        assert {m["message_id"] for m in again} == {m["message_id"] for m in first} - {acked["message_id"]}
        time.sleep(0.5)
        assert not c.post("/v1/topics/ba/groups/g/pop", params={"max": 10}).json()["messages"]


def test_batches_survive_a_clean_restart_and_a_kill(unimq_server, tmp_path) -> None:
    data = tmp_path / "data"
    server = start_server(unimq_server, tmp_path, data_dir=data)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "br", **{"batch.compression": "lz4"})
        send_batch(c, "br", [b"x%d" % i for i in range(50)])
        c.post("/v1/topics", json={"name": "plain", "queues": 1})  # a classic queue beside it
        c.post("/v1/topics/plain/messages", content=b"p0")
    assert server.stop() == 0
    server = start_server(unimq_server, tmp_path, data_dir=data)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        send_batch(c, "br", [b"y%d" % i for i in range(50)])
        assert [m["queue_offset"] for m in pull_all(c, "br")] == list(range(100))
        assert bodies_of(pull_all(c, "plain")) == [b"p0"]
    server.stop(signal.SIGKILL)
    # a kill: recovery re-dispatches the commitlog; the batch entries come back once each
    (data / "checkpoint").unlink(missing_ok=True)
    server = start_server(unimq_server, tmp_path, data_dir=data)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        got = pull_all(c, "br")
        assert bodies_of(got) == [b"x%d" % i for i in range(50)] + [b"y%d" % i for i in range(50)]
        assert [m["queue_offset"] for m in got] == list(range(100))
        res = send_batch(c, "br", [b"z0", b"z1"])
        assert [r["queue_offset"] for r in res] == [100, 101]
        assert bodies_of(pull_all(c, "plain")) == [b"p0"]


def test_batch_topics_refuse_what_they_cannot_do_with_clear_errors(unimq_server, tmp_path) -> None:
    server = start_server(unimq_server, tmp_path)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "bx")
        # delay and FIFO messages: the send's type error
        r = c.post("/v1/topics/bx/messages", content=b"d", params={"delay_ms": 1000})
        assert r.status_code == 400 and r.json()["error"] == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        assert "batch topic" in r.json()["message"]
        r = c.post("/v1/topics/bx/messages", content=b"f", params={"message_group": "g"})
        assert r.status_code == 400 and r.json()["error"] == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        # a batch topic of another type, or batch switched on or off later
        for mtype in ("FIFO", "DELAY", "TRANSACTION", "COMPACTED"):
            r = c.post("/v1/topics", json={"name": f"bx-{mtype}", "type": mtype, "attributes": {"batch": "true"}})
            assert r.status_code == 400 and "batch topic" in r.json()["message"], r.text
        r = c.post("/v1/topics", json={"name": "bx-static", "attributes": {"batch": "true", "static": "true"}})
        assert r.status_code == 400 and "static" in r.json()["message"], r.text
        r = c.patch("/v1/topics/bx", json={"attributes": {"batch": "false"}})
        assert r.status_code == 400 and "fixed" in r.json()["message"]
        r = c.post("/v1/topics", json={"name": "bx2", "attributes": {"batch.compression": "gzip"}})
        assert r.status_code == 400
        # SQL92 filters: refused; tag filters work (a batch has one tag)
        send_batch(c, "bx", [b"t1", b"t2"], tag="red")
        send_batch(c, "bx", [b"u1", b"u2"], tag="blue")
        r = c.get("/v1/topics/bx/queues/0/messages", params={"offset": 0, "sql": "a = 'b'"})
        assert r.status_code == 400 and r.json()["error"] == "ILLEGAL_FILTER_EXPRESSION"
        r = c.get("/v1/topics/bx/queues/0/messages", params={"offset": 0, "tag": "blue"})
        assert bodies_of(r.json()["messages"]) == [b"u1", b"u2"]
        assert [m["queue_offset"] for m in r.json()["messages"]] == [2, 3]
        # a malformed batch
        r = c.post("/v1/topics/bx/messages", content=b'[{"nobody": 1}]', headers={"content-type": BATCH_JSON})
        assert r.status_code == 400 and r.json()["error"] == "BAD_REQUEST"


def test_arrow_pages_of_a_batch_topic_are_built_per_batch(unimq_server, tmp_path) -> None:
    """What the Spark source reads: Arrow pages of a batch topic, from any offset, equal to a pull,
    whether a page spans plain records (built column by column for the page) or not."""
    pa = pytest.importorskip("pyarrow")
    server = start_server(unimq_server, tmp_path)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "bw", **{"batch.compression": "zstd"})
        send_batch(c, "bw", [b"w%d" % i for i in range(300)])
        for k in range(3):  # short plain records: the pages from 256 on span several of them
            send_batch(c, "bw", [b"u%d-%d" % (k, i) * (i % 3) for i in range(10 + k)])
        send_batch(c, "bw", [b"v%d" % i for i in range(5)], keys=["a", "b"], properties={"mqtt_topic": "bw/x"})
        total = 300 + 33 + 5
        want = pull_all(c, "bw")
        for step in (64, 17):
            rows: list[dict] = []
            off = 0
            while off < total:
                r = c.get("/v1/topics/bw/queues/0/messages", params={"offset": off, "max": step, "format": "arrow"})
                assert r.status_code == 200, r.text
                batches = list(pa.ipc.open_stream(r.content))
                assert len(batches) == 1, "a page is one batch, whatever records it spans (Spark pays per batch)"
                batches[0].validate(full=True)
                t = pa.Table.from_batches(batches)
                rows += t.to_pylist()
                off = int(r.headers["unimq-next-offset"]) if "unimq-next-offset" in r.headers else off + t.num_rows
            assert [x["queue_offset"] for x in rows] == list(range(total))
            assert [x["body"] for x in rows] == bodies_of(want)
            assert [x["message_id"] for x in rows] == [m["message_id"] for m in want]
            assert [int(x["born_timestamp"].timestamp() * 1000) for x in rows] == [m["born_timestamp"] for m in want]
            assert [int(x["store_timestamp"].timestamp() * 1000) for x in rows] == [m["store_timestamp"] for m in want]
            assert rows[-4]["keys"] == ["a", "b"] and rows[-4]["mqtt_topic"] == "bw/x" and rows[0]["keys"] == []
            assert {x["protocol"] for x in rows} == {want[0]["protocol"]} and rows[0]["properties"] == []


def test_a_batch_packed_by_its_producer_is_stored_as_it_came(unimq_server, tmp_path) -> None:
    """``application/vnd.unimq.batch``: the producer packs (and compresses); the server checks and
    stores the bytes; with properties (what MQTT and AMQP route by) the gateway routes each message."""
    from gateway.batch_codec import pack

    from core_broker.model import Message

    server = start_server(unimq_server, tmp_path)
    sub, mqtt_got = _mqtt_sub(server.ports["mqtt"], "bp/#")
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "bp")
        body = pack([Message("bp", b"p%d" % i, keys=("k",) if i == 2 else ()) for i in range(500)], "zstd")
        r = c.post("/v1/topics/bp/messages", content=body, headers={"content-type": BATCH_PACKED})
        assert r.status_code == 200, r.text
        assert r.json()["queue_offset"] == 0 and r.json()["count"] == 500
        routed = pack([Message("bp", b"r%d" % i, properties={"mqtt_topic": "bp/x"}) for i in range(3)])
        r = c.post("/v1/topics/bp/messages", content=routed, headers={"content-type": BATCH_PACKED})
        assert r.status_code == 200 and r.json()["queue_offset"] == 500 and r.json()["count"] == 3
        got = pull_all(c, "bp", step=100)
        assert bodies_of(got) == [b"p%d" % i for i in range(500)] + [b"r0", b"r1", b"r2"]
        assert got[2]["keys"] == ["k"] and [m["queue_offset"] for m in got] == list(range(503))
        _until(lambda: len(mqtt_got) >= 3, what="the routed messages over MQTT")
        assert mqtt_got == [b"r0", b"r1", b"r2"]
        # the stored record is the producer's bytes
        rec = (server.data_dir / "commitlog").iterdir().__next__().read_bytes()
        assert body in rec
        # not a batch, or not a batch topic: 400
        r = c.post("/v1/topics/bp/messages", content=b"nope" * 8, headers={"content-type": BATCH_PACKED})
        assert r.status_code == 400 and r.json()["error"] == "ILLEGAL_BATCH"
        c.post("/v1/topics", json={"name": "np", "queues": 1})
        r = c.post("/v1/topics/np/messages", content=body, headers={"content-type": BATCH_PACKED})
        assert r.status_code == 400 and "not a batch topic" in r.json()["message"]
    sub.loop_stop()
    sub.disconnect()


def test_linger_groups_single_sends_from_any_door_into_batches(unimq_server, tmp_path) -> None:
    """``batch.linger_ms``: single sends (HTTP posts, MQTT publishes) to a batch topic wait up to the
    linger and are stored together; each sender still gets its own offset."""
    server = start_server(unimq_server, tmp_path)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "bl", **{"batch.linger_ms": "300"})
        send_batch(c, "bl", [b"warm"])  # the gateway's plan of the topic exists from here on

    async def posts() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url(), timeout=30) as ac:
            rs = await asyncio.gather(*(ac.post("/v1/topics/bl/messages", content=b"s%d" % i) for i in range(40)))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        return [r.json()["queue_offset"] for r in rs]

    offsets = asyncio.run(posts())
    assert sorted(offsets) == list(range(1, 41))
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bl-pub", protocol=mqtt.MQTTv311)
    pub.connect("127.0.0.1", server.ports["mqtt"])
    pub.loop_start()
    infos = [pub.publish("bl/dev", b"q%d" % i, qos=1) for i in range(10)]
    for info in infos:
        info.wait_for_publish(30)
    pub.loop_stop()
    pub.disconnect()
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        got = pull_all(c, "bl")
        assert [m["queue_offset"] for m in got] == list(range(51)), [(m["queue_offset"], base64.b64decode(m["body_base64"]), m["properties"], m["born_timestamp"]) for m in got if m["protocol"] == "mqtt"]
        assert sorted(bodies_of(got)) == sorted([b"warm"] + [b"s%d" % i for i in range(40)] +
                                                [b"q%d" % i for i in range(10)])
        assert {m["protocol"] for m in got if m["body_base64"].startswith("cT")} == {"mqtt"}  # b"q..." base64
        r = c.patch("/v1/topics/bl", json={"attributes": {"batch.linger_ms": "5000"}})
        assert r.status_code == 400
    # far fewer records than messages: the batch queue has fewer entries than offsets
    f = sorted((server.data_dir / "batchqueue" / "bl" / "0").iterdir())[0].read_bytes()
    entries = sum(1 for i in range(0, len(f), 32) if f[i + 28:i + 32] != b"\0\0\0\0")
    assert entries < 20, entries
