"""Message traces in the separated deployment (a nameserver, two brokers and two gateways as
real processes): the gateways' processors write trace events through the broker RPC into the
trace topic, and either gateway answers a message's timeline. A message published over MQTT
through one gateway and consumed over AMQP there, and messages popped over HTTP through the
other, show their stored / delivered / acked events wherever their brokers are.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import TEST_STORE_ARGS
from unimq.local_cluster import Cluster
from polling import wait_for


@pytest.fixture
def cluster(tmp_path: Any) -> Any:
    c = Cluster(tmp_path, brokers=2, gateways=2, lease_s=4.0, heartbeat_s=1.0, extra_broker_args=TEST_STORE_ARGS).start()
    yield c
    c.stop()


def events_of(h: httpx.Client, mid: str, last: str) -> list[dict[str, Any]]:
    def get() -> list[dict[str, Any]] | None:
        r = h.get(f"/v1/messages/{mid}/trace")
        ev = r.json()["events"] if r.status_code == 200 else []
        return ev if last in [e["event"] for e in ev] else None
    return wait_for(get, what=f"the {last} event of {mid}")


@pytest.mark.timeout(240)
def test_traces_across_gateways_and_brokers(cluster: Any) -> None:
    gw0, gw1 = cluster.gateways
    h0 = httpx.Client(base_url=f"http://127.0.0.1:{gw0.ports['http']}", timeout=20)
    h1 = httpx.Client(base_url=f"http://127.0.0.1:{gw1.ports['http']}", timeout=20)
    assert h0.post("/v1/topics", json={"name": "fleet", "queues": 2,
                                       "attributes": {"trace_enabled": "true"}}).status_code == 201

    # MQTT in, AMQP out, through gateway 0
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", gw0.ports["amqp"], client_properties={"connection_name": "fleet-reader"}))
    ch = conn.channel()
    ch.queue_declare("fleet-q", durable=True)
    ch.queue_bind("fleet-q", "amq.topic", "fleet.#")
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="truck-7", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", gw0.ports["mqtt"])
    pub.loop_start()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("keys", "truck-7-pos")
    pub.publish("fleet/truck-7/pos", b"52.1,4.3", qos=1, properties=props).wait_for_publish(10)
    got: list[bytes] = []

    def on_message(c: Any, method: Any, p: Any, body: bytes) -> None:
        c.basic_ack(method.delivery_tag)
        got.append(body)

    ch.basic_consume("fleet-q", on_message)
    wait_for(lambda: conn.process_data_events(time_limit=0.2) or got, what="the AMQP delivery")
    [found] = wait_for(lambda: h1.get("/v1/admin/messages", params={"topic": "fleet", "key": "truck-7-pos"})
                       .json()["items"], what="the message by key")
    ev = events_of(h1, found["message_id"], "acked")  # asked through the other gateway
    assert [(e["event"], e["door"]) for e in ev] == [("stored", "mqtt"), ("delivered", "amqp"), ("acked", "amqp")]
    assert ev[0]["broker"] in ("broker-a", "broker-b") and ev[0]["client"] == "truck-7"

    # HTTP pops through gateway 1 of messages on both brokers. A gateway applies a change of
    # trace attributes made through it at once (others read them every few seconds): set
    # through gateway 1 too, so its pops are traced from now on whatever the timing
    assert h1.patch("/v1/topics/fleet", json={"attributes": {"trace_enabled": "true"}}).is_success
    sent = [h0.post("/v1/topics/fleet/messages", content=f"m{i}".encode()).json() for i in range(8)]
    assert len({s["queue_id"] for s in sent}) == 2  # one queue on each broker
    wait_for(lambda: all(events_of(h1, s["message_id"], "stored") for s in sent), what="the stored events")
    popped: list[dict[str, Any]] = []
    while len(popped) < 9:  # the eight and the MQTT message
        popped += h1.post("/v1/topics/fleet/groups/dispatch/pop", params={"max": 9}).json()["messages"]
    assert h1.post("/v1/topics/fleet/groups/dispatch/ack",
                   json={"receipt_handles": [m["receipt_handle"] for m in popped]}).is_success
    brokers = set()
    for s in sent:
        ev = events_of(h0, s["message_id"], "acked")
        assert [(e["event"], e["door"]) for e in ev] == [("stored", "http"), ("delivered", "http"), ("acked", "http")]
        assert ev[1]["group"] == "dispatch"
        brokers.add(ev[0]["broker"])
    assert brokers == {"broker-a", "broker-b"}
    conn.close()
    pub.loop_stop()
    pub.disconnect()
    h0.close()
    h1.close()


@pytest.fixture
def retrying_cluster(tmp_path: Any) -> Any:
    c = Cluster(tmp_path, brokers=1, gateways=2, lease_s=4.0, heartbeat_s=1.0,
                extra_broker_args=[*TEST_STORE_ARGS, "--set=broker.max_delivery_attempts=2",
                                   "--set=broker.retry_backoff_ms=[100]"]).start()
    yield c
    c.stop()


@pytest.mark.timeout(240)
def test_ack_through_another_gateway_and_the_brokers_own_events(retrying_cluster: Any) -> None:
    """A message popped over HTTP through gateway 0 and acked through gateway 1 shows the ack
    (gateway 1 finds the message by the receipt handle); a message popped and never acked
    shows the broker process's own retried and dead_lettered events."""
    gw0, gw1 = retrying_cluster.gateways
    h0 = httpx.Client(base_url=f"http://127.0.0.1:{gw0.ports['http']}", timeout=20)
    h1 = httpx.Client(base_url=f"http://127.0.0.1:{gw1.ports['http']}", timeout=20)
    assert h0.post("/v1/topics", json={"name": "orders", "queues": 1,
                                       "attributes": {"trace_enabled": "true"}}).status_code == 201
    # set through gateway 1 too: it applies the attributes at once (else within 5 s)
    assert h1.patch("/v1/topics/orders", json={"attributes": {"trace_enabled": "true"}}).is_success
    mid = h0.post("/v1/topics/orders/messages", content=b"o-1").json()["message_id"]
    got = wait_for(lambda: h0.post("/v1/topics/orders/groups/billing/pop", params={"max": 1, "wait_s": 1})
                   .json()["messages"], what="the pop")
    assert [m["message_id"] for m in got] == [mid]
    r = h1.post("/v1/topics/orders/groups/billing/ack", json={"receipt_handles": [got[0]["receipt_handle"]]})
    assert r.is_success, r.text
    ev = events_of(h0, mid, "acked")
    assert [(e["event"], e["door"]) for e in ev] == [("stored", "http"), ("delivered", "http"), ("acked", "http")]
    assert ev[2]["group"] == "billing"

    # never acked: delivered twice (max_delivery_attempts = 2), then the broker dead-letters it
    # (a group of its own, which starts at the first message: only this one counts)
    mid2 = h1.post("/v1/topics/orders/messages", content=b"o-2").json()["message_id"]
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while len(seen) < 2:
        assert time.monotonic() < deadline, f"deliveries so far: {seen}"
        seen += [m["delivery_attempt"] for m in h1.post(
            "/v1/topics/orders/groups/shipping/pop", params={"max": 2, "invisible_s": 0.3, "wait_s": 1})
            .json()["messages"] if m["message_id"] == mid2]
    assert seen == [1, 2]
    ev = events_of(h0, mid2, "dead_lettered")
    assert [(e["event"], e["door"]) for e in ev] == [
        ("stored", "http"), ("delivered", "http"), ("retried", "broker"), ("delivered", "http"),
        ("dead_lettered", "broker")]
    assert ev[2]["attempt"] == 1 and ev[4]["dlq"] == "%DLQ%shipping" and ev[4]["attempts"] == 2
    assert ev[4]["broker"] == "broker-a"
    h0.close()
    h1.close()
