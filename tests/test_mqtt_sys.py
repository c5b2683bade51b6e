"""$SYS/broker/... statistics, read the way Mosquitto users read them.

Why: dashboards and scripts written for Mosquitto subscribe to ``$SYS/#``; the
door publishes the same names (kept in memory, QoS 0, retained for new
subscribers). A ``#`` subscriber must not see them (MQTT 4.7.2), and they are
never stored in the commitlog. Real clients: mosquitto_sub and paho.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mqtt_fixtures import Paho, config_file, start_unimq, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg = config_file(tmp_path_factory.mktemp("cfg"), "mqtt_sys_interval_s = 0.5\n")
    srv = start_unimq(tmp_path_factory, "--config", cfg)
    yield srv
    srv.stop()


@pytest.mark.skipif(not shutil.which("mosquitto_sub"), reason="mosquitto-clients is not installed")
def test_mosquitto_sub_reads_sys_values(server) -> None:
    port = server.ports["mqtt"]
    out = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", "$SYS/broker/version",
                          "-t", "$SYS/broker/uptime", "-C", "2", "-v", "-W", "20"],
                         capture_output=True, timeout=30, text=True)
    assert out.returncode == 0, out.stderr
    got = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert got["$SYS/broker/version"].startswith("unimq ")
    assert got["$SYS/broker/uptime"].endswith(" seconds")


def test_counters_follow_traffic_and_hash_does_not_see_sys(server) -> None:
    port = server.ports["mqtt"]
    everything = Paho(port)
    everything.subscribe("#", qos=0)
    sys = Paho(port)
    sys.subscribe("$SYS/broker/#", qos=0)
    # the retained values arrive at once, flagged retained
    first = {m.topic: m for m in sys.get_n(5)}
    assert all(m.retain for m in first.values())

    def latest(name: str) -> int:
        vals = [m.payload for m in sys.received if m.topic == "$SYS/broker/" + name]
        return int(vals[-1]) if vals else -1

    wait_for(lambda: latest("clients/connected") >= 2, what="clients/connected >= 2")
    base = max(latest("publish/messages/received"), 0)
    pub = Paho(port)
    for i in range(5):
        pub.publish("plain/topic", f"m{i}".encode(), qos=1)
    wait_for(lambda: latest("publish/messages/received") >= base + 5, what="publish/messages/received to grow")
    wait_for(lambda: latest("subscriptions/count") >= 2, what="subscriptions/count")
    wait_for(lambda: latest("bytes/received") > 0 and latest("bytes/sent") > 0, what="byte counters")
    pub.disconnect()
    assert [m.topic for m in everything.get_n(5)] == ["plain/topic"] * 5
    assert not any(t.startswith("$SYS") for t in everything.topics())  # '#' never matches $SYS
    # live updates after the retained ones are not flagged retained
    assert any(not m.retain for m in sys.received)
    everything.disconnect()
    sys.disconnect()
