"""The MQTT door's deliveries in ``/metrics`` (issue: "/metrics counts only HTTP pop and pull as messages out").

A real `unimq up`, paho subscribers at QoS 1 and QoS 0, a retained message for a
late subscriber, and the HTTP door's ``/metrics`` read with httpx as a user would.
Deliveries from memory are counted by the door (per batch), read-backs from the
store by the processor's pull; together they are every PUBLISH sent.
"""

from __future__ import annotations

import re

import httpx
import paho.mqtt.client as paho
import pytest

from mqtt_fixtures import Paho, config_file, start_unimq, wait_for

pytestmark = pytest.mark.timeout(120)


def mqtt_out(http_port: int) -> dict[str, int]:
    text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10).text
    out = {}
    for m in re.finditer(r'^unimq_messages_out_total\{protocol="mqtt",topic="([^"]*)"\} (\S+)$', text, re.M):
        out[m[1]] = int(float(m[2]))
    return out


def test_mqtt_deliveries_are_counted_as_messages_out(tmp_path_factory) -> None:
    srv = start_unimq(tmp_path_factory, "--config", config_file(tmp_path_factory.mktemp("cfg")))
    try:
        port, http = srv.ports["mqtt"], srv.ports["http"]
        assert mqtt_out(http) == {}
        q1 = Paho(port, v5=True)
        q1.subscribe("met/#", options=paho.SubscribeOptions(qos=1))
        q0 = Paho(port)
        q0.subscribe("met/#", 0)
        pub = Paho(port)
        for i in range(5):
            pub.publish("met/a", b"%d" % i, qos=1)
        pub.publish("met/r", b"kept", qos=1, retain=True)
        assert len(q1.get_n(6)) == 6 and len(q0.get_n(6)) == 6
        late = Paho(port)
        late.subscribe("met/r", 1)
        assert late.get().payload == b"kept"
        # 12 live deliveries and one retained one, every one a PUBLISH sent by the door
        wait_for(lambda: sum(mqtt_out(http).values()) >= 13, what="13 MQTT deliveries in /metrics")
        assert sum(mqtt_out(http).values()) == 13, mqtt_out(http)
        assert mqtt_out(http).get("met") == 13  # all from memory here: counted under the unified topic
        for c in (q1, q0, pub, late):
            c.disconnect()
    finally:
        srv.stop()
