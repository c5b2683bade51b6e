"""One model across doors: MQTT a/b/c and AMQP amq.topic a.b.c are the same stream, live."""

from __future__ import annotations

import time
import uuid

import paho.mqtt.client as mqtt
import pika
import pytest

pytestmark = pytest.mark.timeout(120)


def _wait(pred, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _mqtt_client(port: int, on_message=None) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"x-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv311)
    if on_message is not None:
        c.on_message = on_message
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def test_mqtt_publish_reaches_an_amqp_queue_bound_to_amq_topic(unimq_server):
    srv = unimq_server()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "sensors.*.temp")
    pub = _mqtt_client(srv.ports["mqtt"])
    info = pub.publish("sensors/room1/temp", b"21.5", qos=1)
    info.wait_for_publish(10)
    pub.publish("sensors/room1/humidity", b"40", qos=1).wait_for_publish(10)
    got = []
    assert _wait(lambda: (got.append(ch.basic_get(q, auto_ack=True)) or got[-1][0] is not None))
    method, props, body = got[-1]
    assert body == b"21.5"
    assert method.routing_key == "sensors.room1.temp"
    time.sleep(0.3)
    assert ch.basic_get(q, auto_ack=True)[0] is None  # humidity does not match the binding
    pub.loop_stop()
    pub.disconnect()
    conn.close()


def test_amqp_publish_on_amq_topic_reaches_an_mqtt_subscriber(unimq_server):
    srv = unimq_server()
    received: list[tuple[str, bytes]] = []
    sub = _mqtt_client(srv.ports["mqtt"], lambda c, u, m: received.append((m.topic, m.payload)))
    sub.subscribe("plant/+/status", qos=1)
    time.sleep(0.5)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    ch.basic_publish("amq.topic", "plant.line7.status", b"running")
    assert _wait(lambda: received), "the MQTT subscriber got nothing"
    assert received[0] == ("plant/line7/status", b"running")
    sub.loop_stop()
    sub.disconnect()
    conn.close()


def test_amq_topic_routes_of_mqtt_publishes_follow_binds_unbinds_and_queue_deletes(unimq_server):
    """The AMQP door caches amq.topic routes per MQTT topic: every topology change must show."""
    srv = unimq_server()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    ch.queue_declare("xq", durable=False)
    pub = _mqtt_client(srv.ports["mqtt"])

    def publish(body: bytes) -> None:
        pub.publish("cache/a/b", body, qos=1).wait_for_publish(10)

    def get() -> bytes | None:
        got: list = []
        if _wait(lambda: (got.append(ch.basic_get("xq", auto_ack=True)) or got[-1][0] is not None), 5.0):
            return got[-1][2]
        return None

    publish(b"unbound")  # nothing bound on amq.topic yet: routed nowhere (and remembered so)
    ch.queue_bind("xq", "amq.topic", "cache.#")
    publish(b"bound")
    assert get() == b"bound"
    ch.queue_unbind("xq", "amq.topic", "cache.#")
    ch.queue_bind("xq", "amq.topic", "other.#")  # amq.topic not empty, but no match for cache/a/b
    publish(b"unbound-again")
    ch.queue_bind("xq", "amq.topic", "cache.*.b")
    publish(b"rebound")
    assert get() == b"rebound"
    ch.queue_delete("xq")
    ch.queue_declare("xq", durable=False)  # a new queue under the same name: not bound
    publish(b"to-the-old-queue")
    ch.queue_bind("xq", "amq.topic", "cache.a.b")
    publish(b"to-the-new-queue")
    assert get() == b"to-the-new-queue"
    time.sleep(0.3)
    assert ch.basic_get("xq", auto_ack=True)[0] is None
    pub.loop_stop()
    pub.disconnect()
    conn.close()
