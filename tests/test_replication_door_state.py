"""The doors' durable state survives a failover, seen by real clients (issue 16).

Before: a topic created over HTTP, an AMQP durable queue declared and filled with confirmed
messages (pika), an MQTT 5 persistent session subscribed (paho). Then the group's master AND the
gateway are SIGKILLed (a gateway keeps sessions in memory: a new one must find them in the
brokers), and a fresh gateway is started. After: the topic is there, the queue is there with its
messages, and the MQTT session is resumed (session present) and still subscribed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

from tests.test_replication import Group, group, http  # noqa: F401 - the fixture
from unimq.local_cluster import start_proc


def _gateway(g: Group) -> None:
    g.gateway = start_proc("gateway", ["gateway", "--namesrv", g.namesrv, "--rpc-port", "0", "--http-port", "0",
                                       "--mqtt-port", "0", "--amqp-port", "0", "--grpc-port", "0",
                                       "--mqtt-ws-port", "-1"])
    g.http = f"http://127.0.0.1:{g.gateway.ports['http']}"


def _mqtt(port: int, client_id: str, clean: bool) -> tuple[mqtt.Client, dict]:
    seen: dict = {"present": None, "msgs": [], "connected": threading.Event()}
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)

    def on_connect(client, userdata, flags, rc, props):  # type: ignore[no-untyped-def]
        seen["present"] = flags.session_present
        seen["connected"].set()

    c.on_connect = on_connect
    c.on_message = lambda client, userdata, msg: seen["msgs"].append(msg.payload)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect("127.0.0.1", port, clean_start=clean, properties=props)
    c.loop_start()
    assert seen["connected"].wait(20)
    return c, seen


@pytest.mark.timeout(240)
def test_topic_amqp_queue_and_mqtt_session_survive_a_failover(group: Group) -> None:
    g = group
    status, _ = http("POST", f"{g.http}/v1/topics", json.dumps({"name": "orders", "queues": 4}).encode(),
                     {"content-type": "application/json"})
    assert status in (200, 201)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", g.gateway.ports["amqp"]))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("invoices", durable=True)
    for i in range(5):
        ch.basic_publish("", "invoices", f"invoice {i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    c, seen = _mqtt(g.gateway.ports["mqtt"], "sensor-7", clean=True)
    c.subscribe("a/#", qos=1)
    time.sleep(0.5)
    c.disconnect()
    c.loop_stop()

    st = asyncio.run(g.state())
    g.brokers[st.master_id].kill9()  # type: ignore[index]
    g.gateway.kill9()
    asyncio.run(g.wait_state(lambda s: s.master_id not in (None, st.master_id), "a new master", 30))
    _gateway(g)

    deadline = time.monotonic() + 30
    while http("GET", f"{g.http}/v1/topics/orders")[0] != 200:
        assert time.monotonic() < deadline, "topic orders gone after the failover"
        time.sleep(0.3)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", g.gateway.ports["amqp"]))
    ch = conn.channel()
    q = ch.queue_declare("invoices", durable=True, passive=True)
    assert q.method.message_count == 5
    got = []
    for _ in range(5):
        _, _, body = ch.basic_get("invoices", auto_ack=True)
        got.append(body)
    assert sorted(got) == [f"invoice {i}".encode() for i in range(5)]
    conn.close()
    c, seen = _mqtt(g.gateway.ports["mqtt"], "sensor-7", clean=False)
    assert seen["present"] is True, "the persistent session did not survive the failover"
    pub, _ = _mqtt(g.gateway.ports["mqtt"], "pub-1", clean=True)
    pub.publish("a/b", b"after failover", qos=1).wait_for_publish(20)
    deadline = time.monotonic() + 20
    while b"after failover" not in seen["msgs"]:
        assert time.monotonic() < deadline, "the resumed session is no longer subscribed to a/#"
        time.sleep(0.1)
    for cl in (c, pub):
        cl.disconnect()
        cl.loop_stop()
