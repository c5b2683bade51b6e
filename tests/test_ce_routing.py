"""CloudEvents reach MQTT devices and AMQP apps, and MQTT messages read as CloudEvents name their
client (issue 14: every door reaches every door). Real clients against a real `unimq up`: curl-like
HTTP posts (httpx), paho-mqtt and pika."""

from __future__ import annotations

import json
import threading
import time

import httpx
import paho.mqtt.client as mqtt
import pika
import pytest

CE_JSON = "application/cloudevents+json"


def _subscriber(port: int, topic: str) -> tuple[mqtt.Client, list[bytes]]:
    got: list[bytes] = []
    ready = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="device-d1", protocol=mqtt.MQTTv5)
    c.on_message = lambda client, userdata, msg: got.append(msg.payload)
    c.on_subscribe = lambda *a: ready.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.subscribe(topic, qos=1)
    assert ready.wait(20)
    return c, got


def _wait_for(items: list[bytes], want: bytes, what: str) -> None:
    deadline = time.monotonic() + 20
    while want not in items:
        assert time.monotonic() < deadline, f"{what} never got {want!r} (got {items})"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_cloudevents_to_mqtt_and_amqp_and_mqtt_source(unimq_server) -> None:  # type: ignore[no-untyped-def]
    srv = unimq_server()
    sub, got = _subscriber(srv.ports["mqtt"], "devices/d1/cmd")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    ch.queue_declare("cmds")
    ch.queue_bind("cmds", "amq.topic", routing_key="devices.d1.cmd")
    with httpx.Client(base_url=srv.url("http"), timeout=20) as http:
        # binary mode: the extension as a ce- header
        r = http.post("/v1/topics/commands/events", content=b'{"do": "reboot"}', headers={
            "ce-specversion": "1.0", "ce-id": "c1", "ce-source": "/cloud/fleet", "ce-type": "com.example.cmd",
            "ce-mqtttopic": "devices/d1/cmd", "content-type": "application/json"})
        assert r.status_code == 200, r.text
        _wait_for(got, b'{"do": "reboot"}', "the MQTT device (binary mode)")
        # structured mode: the extension as an attribute
        ev = {"specversion": "1.0", "id": "c2", "source": "/cloud/fleet", "type": "com.example.cmd",
              "mqtttopic": "devices/d1/cmd", "datacontenttype": "application/json", "data": {"do": "update"}}
        r = http.post("/v1/topics/commands/events", content=json.dumps(ev), headers={"content-type": CE_JSON})
        assert r.status_code == 200, r.text
        _wait_for(got, b'{"do":"update"}', "the MQTT device (structured mode)")
        bodies = []
        deadline = time.monotonic() + 20
        while len(bodies) < 2:
            _, _, body = ch.basic_get("cmds", auto_ack=True)
            if body is None:
                assert time.monotonic() < deadline, f"AMQP queue bound to amq.topic got {bodies}"
                time.sleep(0.1)
                continue
            bodies.append(body)
        assert bodies == [b'{"do": "reboot"}', b'{"do":"update"}']
        # a wildcard is no topic name: refused with a clear 400
        r = http.post("/v1/topics/commands/events", content=b"x", headers={
            "ce-specversion": "1.0", "ce-id": "c3", "ce-source": "/s", "ce-type": "t", "ce-mqtttopic": "devices/+/cmd"})
        assert r.status_code == 400 and "mqtttopic" in r.json()["message"]
        # an MQTT publish read back as a CloudEvent: its source is the publishing client's id
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="dev-42", protocol=mqtt.MQTTv311)
        pub.connect("127.0.0.1", srv.ports["mqtt"])
        pub.loop_start()
        pub.publish("telemetry/room1", b'{"temp": 21.5}', qos=1).wait_for_publish(20)
        pub.disconnect()
        pub.loop_stop()
        r = http.get("/v1/topics/telemetry")
        events = []
        for q in r.json()["queues"]:
            if q["max_offset"] > 0:
                events += http.get(f"/v1/topics/telemetry/queues/{q['queue_id']}/messages?offset=0",
                                   headers={"accept": "application/cloudevents-batch+json"}).json()
        assert [e["source"] for e in events] == ["/mqtt/dev-42"], events
        assert events[0]["subject"] == "telemetry/room1"
    conn.close()
    sub.disconnect()
    sub.loop_stop()
