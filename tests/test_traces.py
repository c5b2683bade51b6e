"""Message traces against a real `unimq up` with real clients: a message published over MQTT
(paho) on a traced topic and consumed over AMQP (pika basic_consume + ack) shows stored by
MQTT, delivered over AMQP and acked; a nack with requeue shows a retry; pop consumers over
HTTP are traced with their acks and releases; a topic with tracing off records nothing;
a sample rate records about that share; the CLI prints the timeline; AMQP to MQTT
subscribers (live and read back) and push subscriptions (failed POSTs retried) likewise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable

import httpx
import paho.mqtt.client as mqtt
import pika
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from http_helpers import Webhook, start_server, until
from tests.conftest import REPO_ROOT
from polling import wait_for


def publish_mqtt(port: int, topic: str, payload: bytes, key: str) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"tracer-{key}", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("keys", key)
    c.publish(topic, payload, qos=1, properties=props).wait_for_publish(10)
    c.loop_stop()
    c.disconnect()


def find_id(h: httpx.Client, topic: str, key: str) -> str:
    items = wait_for(lambda: h.get("/v1/admin/messages", params={"topic": topic, "key": key}).json()["items"],
                     what=f"message {key} to be found")
    return items[0]["message_id"]


def trace_of(h: httpx.Client, mid: str, until: Callable[[list[str]], bool]) -> dict[str, Any]:
    def get() -> dict[str, Any] | None:
        r = h.get(f"/v1/messages/{mid}/trace")
        if r.status_code != 200:
            return None
        t = r.json()
        return t if until([e["event"] for e in t["events"]]) else None
    return wait_for(get, what=f"the trace of {mid}")


def amqp_queue(port: int, queue: str, binding: str) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, client_properties={"connection_name": "trace-consumer"}))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, "amq.topic", binding)
    return conn, ch


def consume_one(conn: pika.BlockingConnection, ch: Any, queue: str, ack: bool = True,
                requeue_first: bool = False) -> bytes:
    """basic_consume; nack (requeue) the first delivery when asked, ack the next."""
    got: list[bytes] = []
    seen = [0]

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        seen[0] += 1
        if requeue_first and seen[0] == 1:
            ch.basic_nack(method.delivery_tag, requeue=True)
            return
        if ack:
            ch.basic_ack(method.delivery_tag)
        got.append(body)

    tag = ch.basic_consume(queue, on_message)
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    ch.basic_cancel(tag)
    assert got, "no AMQP delivery"
    return got[0]


def test_mqtt_to_amqp_trace_with_ack_retry_and_cli(unimq_server: Any) -> None:
    srv = unimq_server()
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        assert h.post("/v1/topics", json={"name": "plant", "queues": 2,
                                          "attributes": {"trace_enabled": "true"}}).status_code == 201
        assert h.post("/v1/topics", json={"name": "quiet", "queues": 2}).status_code == 201
        bad = h.post("/v1/topics", json={"name": "wrong", "attributes": {"trace_sample_rate": "2"}})
        assert bad.status_code == 400 and "trace_sample_rate" in bad.text
        conn, ch = amqp_queue(srv.ports["amqp"], "plant-q", "plant.#")
        ch.queue_declare("quiet-q", durable=True)
        ch.queue_bind("quiet-q", "amq.topic", "quiet.#")

        # published over MQTT, consumed and acked over AMQP
        publish_mqtt(srv.ports["mqtt"], "plant/line1/temp", b"21.5", "p-1")
        assert consume_one(conn, ch, "plant-q") == b"21.5"
        mid = find_id(h, "plant", "p-1")
        t = trace_of(h, mid, lambda ev: "acked" in ev)
        ev = t["events"]
        assert [e["event"] for e in ev] == ["stored", "delivered", "acked"]
        stored, delivered, acked = ev
        assert stored["door"] == "mqtt" and stored["client"] == "tracer-p-1" and stored["topic"] == "plant"
        assert stored["broker"] and "offset" in stored
        assert delivered["door"] == "amqp" and delivered["group"] == "plant-q" and delivered["via"] == "consume"
        assert delivered["client"] == "trace-consumer"
        assert acked["door"] == "amqp" and acked["group"] == "plant-q"
        assert t["doors"] == ["mqtt", "amqp"]
        assert [e["at"] for e in ev] == sorted(e["at"] for e in ev)
        # the admin API answers the same timeline
        assert h.get(f"/v1/admin/messages/{mid}/trace").json()["events"] == ev
        assert h.get("/v1/admin/messages/nope/trace").json()["events"] == []

        # a nack with requeue: delivered, retried, delivered again (redelivered), acked
        publish_mqtt(srv.ports["mqtt"], "plant/line1/temp", b"22.0", "p-2")
        assert consume_one(conn, ch, "plant-q", requeue_first=True) == b"22.0"
        mid2 = find_id(h, "plant", "p-2")
        ev2 = trace_of(h, mid2, lambda ev: "acked" in ev)["events"]
        assert [e["event"] for e in ev2] == ["stored", "delivered", "retried", "delivered", "acked"]
        assert ev2[2]["requeue"] is True and ev2[3]["redelivered"] is True and ev2[3]["attempt"] == 2

        # tracing off: the message is stored and consumed, and nothing is recorded
        publish_mqtt(srv.ports["mqtt"], "quiet/x", b"q", "q-1")
        assert consume_one(conn, ch, "quiet-q") == b"q"
        qid = find_id(h, "quiet", "q-1")
        time.sleep(0.5)  # two flush intervals: an event, were there one, would be written by now
        r = h.get(f"/v1/messages/{qid}/trace")
        assert r.status_code == 404 and r.json()["error"] == "NOT_TRACED"

        # the CLI: a table, and --json (exit 0); an untraced message exits non-zero
        cli = [sys.executable, "-m", "unimq", "admin", "messages", "trace", "--endpoint", srv.url().rstrip("/")]
        out = subprocess.run([*cli, mid], capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "EVENT" in lines[0] and "DOOR" in lines[0]
        assert [ln.split()[1] for ln in lines[1:]] == ["stored", "delivered", "acked"]
        out = subprocess.run([*cli, mid, "--json"], capture_output=True, text=True,
                             cwd=REPO_ROOT, timeout=60)
        assert out.returncode == 0 and json.loads(out.stdout)["events"] == ev
        out = subprocess.run([*cli, qid], capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=60)
        assert out.returncode == 4 and "no trace" in out.stderr
        conn.close()


def test_pop_consumers_sampling_and_turning_tracing_on(unimq_server: Any) -> None:
    srv = unimq_server()
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        # a topic created untraced, then traced through PATCH: HTTP pop, release (retry), ack
        assert h.post("/v1/topics", json={"name": "jobs", "queues": 1}).status_code == 201
        assert h.patch("/v1/topics/jobs", json={"attributes": {"trace_enabled": "true"}}).is_success
        mid = h.post("/v1/topics/jobs/messages", params={"keys": "j-1"}, content=b"job").json()["message_id"]
        got = h.post("/v1/topics/jobs/groups/workers/pop", params={"max": 1}).json()["messages"]
        assert [m["message_id"] for m in got] == [mid]
        r = h.post("/v1/topics/jobs/groups/workers/invisible",
                   json={"receipt_handle": got[0]["receipt_handle"], "invisible_s": 0})
        assert r.is_success, r.text
        again = wait_for(lambda: h.post("/v1/topics/jobs/groups/workers/pop", params={"max": 1}).json()["messages"],
                         what="the released job")
        assert h.post("/v1/topics/jobs/groups/workers/ack",
                      json={"receipt_handles": [again[0]["receipt_handle"]]}).is_success
        ev = trace_of(h, mid, lambda ev: "acked" in ev)["events"]
        assert [e["event"] for e in ev] == ["stored", "delivered", "retried", "delivered", "acked"]
        assert {e["door"] for e in ev} == {"http"} and ev[1]["via"] == "pop" and ev[1]["group"] == "workers"
        assert ev[3]["attempt"] == 2

        # sampling: a rate of 0.3 traces about that share of 400 messages (loose bounds)
        assert h.post("/v1/topics", json={"name": "sampled", "queues": 2,
                                          "attributes": {"trace_sample_rate": "0.3"}}).status_code == 201
        ids = []
        for i in range(4):
            batch = [{"specversion": "1.0", "id": f"s-{i}-{j}", "source": "/t", "type": "t", "data": j}
                     for j in range(100)]
            r = h.post("/v1/topics/sampled/events", json=batch,
                       headers={"content-type": "application/cloudevents-batch+json"})
            assert r.is_success, r.text
            ids += [x["message_id"] for x in r.json()]
        assert len(ids) == 400
        time.sleep(0.5)
        traced = sum(h.get(f"/v1/messages/{m}/trace").status_code == 200 for m in ids)
        assert 60 <= traced <= 180, traced

        # turned off again: new messages are not traced
        assert h.patch("/v1/topics/sampled", json={"attributes": {"trace_sample_rate": "0"}}).is_success
        off = h.post("/v1/topics/sampled/messages", content=b"x").json()["message_id"]
        time.sleep(0.5)
        assert h.get(f"/v1/messages/{off}/trace").status_code == 404


def test_amqp_to_mqtt_subscriber_trace(unimq_server: Any) -> None:
    """Published over AMQP (amq.topic), delivered to a QoS 1 MQTT subscriber (paho) and PUBACKed;
    a second subscriber online later reads it back from the store: delivered to it as well."""
    srv = unimq_server()
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        assert h.post("/v1/topics", json={"name": "plant", "attributes": {"trace_enabled": "true"}}).status_code == 201
        got: list[bytes] = []
        sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="panel-1", clean_session=False)
        sub.on_message = lambda c, u, m: got.append(m.payload)
        sub.connect("127.0.0.1", srv.ports["mqtt"])
        sub.loop_start()
        sub.subscribe("plant/#", qos=1)[1]
        # a persistent session that is offline when the message comes: read back at reconnect
        late = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="panel-2", clean_session=False)
        late_got: list[bytes] = []
        late.on_message = lambda c, u, m: late_got.append(m.payload)
        late.connect("127.0.0.1", srv.ports["mqtt"])
        late.loop_start()
        late.subscribe("plant/+/pressure", qos=1)
        time.sleep(0.5)
        late.loop_stop()
        late.disconnect()
        time.sleep(0.3)
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", srv.ports["amqp"], client_properties={"connection_name": "plc-3"}))
        conn.channel().basic_publish("amq.topic", "plant.line3.pressure", b"1.02",
                                     pika.BasicProperties(message_id="press-1"))
        wait_for(lambda: got, what="the MQTT delivery")
        late.reconnect()
        late.loop_start()
        wait_for(lambda: late_got, what="the read-back delivery")
        mid = find_id(h, "plant", "press-1")
        ev = wait_for(lambda: (t := h.get(f"/v1/messages/{mid}/trace").json()) and
                      sum(e["event"] == "acked" for e in t["events"]) == 2 and t["events"], what="both acks")
        assert ev[0]["event"] == "stored" and ev[0]["door"] == "amqp" and ev[0]["client"] == "plc-3"
        mqtt_ev = [(e["event"], e["client"]) for e in ev[1:]]
        assert sorted(mqtt_ev) == [("acked", "panel-1"), ("acked", "panel-2"),
                                   ("delivered", "panel-1"), ("delivered", "panel-2")]
        assert mqtt_ev.index(("delivered", "panel-1")) < mqtt_ev.index(("acked", "panel-1"))
        assert all(e["door"] == "mqtt" for e in ev[1:])
        d = next(e for e in ev if e["event"] == "delivered" and e["client"] == "panel-1")
        assert d["group"] == "plant/#" and d["qos"] == 1 and d["mqtt_topic"] == "plant/line3/pressure"
        conn.close()
        for c in (sub, late):
            c.loop_stop()
            c.disconnect()


async def test_push_subscription_trace(unimq_server: Any, tmp_path: Any) -> None:
    """A push subscription's webhook answers 500 twice, then 200: the trace shows the pop
    delivery, two failed pushes (retried) and the ack, over the CloudEvents door."""
    server = start_server(unimq_server, tmp_path)
    async with Webhook(fail_first=2) as hook, httpx.AsyncClient(base_url=server.url("http", ""), timeout=30) as c:
        r = await c.post("/v1/topics", json={"name": "hooks", "queues": 1, "attributes": {"trace_enabled": "true"}})
        assert r.status_code == 201, r.text
        r = await c.post("/v1/subscriptions", json={"topic": "hooks", "sink": hook.url, "initial_backoff_ms": 50,
                                                    "max_attempts": 5})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        mid = (await c.post("/v1/topics/hooks/messages", content=b"ping")).json()["message_id"]
        await until(lambda: 200 in hook.answers, 60, "a successful push")

        async def acked() -> list[dict[str, Any]] | None:
            t = (await c.get(f"/v1/admin/messages/{mid}/trace")).json()["events"]
            return t if "acked" in [e["event"] for e in t] else None

        ev = await until(acked, 30, "the ack in the trace")
        assert [e["event"] for e in ev] == ["stored", "delivered", "retried", "retried", "acked"]
        assert ev[0]["door"] == "http" and {e["door"] for e in ev[1:]} == {"cloudevents"}
        assert ev[2]["subscription"] == sid and ev[3]["attempt"] == 2 and ev[1]["group"] == f"push-{sid}"


def test_mqtt_shared_subscription_trace_with_expiry(unimq_server: Any) -> None:
    """A shared subscription's member (paho, MQTT 5) is offline while two messages come, one
    with a 1 s message expiry: back online, the expired one shows ``expired`` (dropped by the
    door, never sent) and the other ``delivered`` to the member and ``acked`` by its PUBACK."""
    srv = unimq_server()
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        assert h.post("/v1/topics", json={"name": "plant", "attributes": {"trace_enabled": "true"}}).status_code == 201
        got: list[bytes] = []
        member = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="worker-1", protocol=mqtt.MQTTv5)
        member.on_message = lambda c, u, m: got.append(m.payload)
        start = Properties(PacketTypes.CONNECT)
        start.SessionExpiryInterval = 300
        member.connect("127.0.0.1", srv.ports["mqtt"], clean_start=False, properties=start)
        member.loop_start()
        subscribed = member.subscribe("$share/workers/plant/#", qos=1)
        assert subscribed[0] == mqtt.MQTT_ERR_SUCCESS
        time.sleep(0.5)
        member.loop_stop()
        member.disconnect()

        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sensor-9", protocol=mqtt.MQTTv5)
        pub.connect("127.0.0.1", srv.ports["mqtt"])
        pub.loop_start()
        for key, payload, expiry in (("s-old", b"stale", 1), ("s-new", b"fresh", 0)):
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = ("keys", key)
            if expiry:
                props.MessageExpiryInterval = expiry
            pub.publish("plant/line2/temp", payload, qos=1, properties=props).wait_for_publish(10)
        pub.loop_stop()
        pub.disconnect()
        old = find_id(h, "plant", "s-old")
        time.sleep(1.5)  # past the first message's expiry

        member.reconnect()
        member.loop_start()
        wait_for(lambda: got, what="the fresh message")
        assert got == [b"fresh"]
        new = find_id(h, "plant", "s-new")
        ev = trace_of(h, new, lambda ev: "acked" in ev)["events"]
        assert [(e["event"], e["door"]) for e in ev] == [("stored", "mqtt"), ("delivered", "mqtt"), ("acked", "mqtt")]
        assert ev[1]["client"] == "worker-1" and ev[1]["group"] == "$share/workers/plant/#" and ev[1]["qos"] == 1
        assert ev[1]["topic"] == "plant" and ev[2]["client"] == "worker-1"
        ev = trace_of(h, old, lambda ev: "expired" in ev)["events"]
        assert [(e["event"], e["door"]) for e in ev] == [("stored", "mqtt"), ("expired", "mqtt")]
        assert ev[1]["client"] == "worker-1" and ev[1]["mqtt_topic"] == "plant/line2/temp"
        member.loop_stop()
        member.disconnect()
