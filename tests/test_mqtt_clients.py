"""The MQTT door against other real peers: the amqtt client, Mosquitto's command-line
clients, and paho over WebSocket.

Why these: a broker devices "cannot tell from Mosquitto" must serve the
clients people actually run. mosquitto_pub/mosquitto_sub come from Debian's
``mosquitto-clients`` (installed by ``make test`` through APT_PACKAGES); amqtt
is an independent asyncio implementation; the WebSocket test uses paho's own
WebSocket transport with the ``mqtt`` subprotocol, as browser dashboards do.
One `unimq up` serves the module.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from adapters.mqtt import codec as C
from mqtt_fixtures import config_file, Paho, RawClient, start_unimq, wait_for

pytestmark = pytest.mark.timeout(120)

MOSQ = shutil.which("mosquitto_pub") and shutil.which("mosquitto_sub")
need_mosquitto = pytest.mark.skipif(not MOSQ, reason="mosquitto-clients is not installed (make test installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_unimq(tmp_path_factory, "--config", config_file(tmp_path_factory.mktemp("cfg")))
    yield srv
    srv.stop()


@pytest.fixture
def port(server) -> int:
    return server.ports["mqtt"]


async def test_amqtt_client_pub_sub_all_qos(port: int) -> None:
    from amqtt.client import MQTTClient
    from amqtt.mqtt.constants import QOS_0, QOS_1, QOS_2

    sub = MQTTClient(client_id="amqtt-sub")
    await sub.connect(f"mqtt://127.0.0.1:{port}/")
    granted = await sub.subscribe([("am/#", QOS_2), ("am2/+", QOS_1)])
    assert granted == [QOS_2, QOS_1]
    pub = MQTTClient(client_id="amqtt-pub")
    await pub.connect(f"mqtt://127.0.0.1:{port}/")
    for q in (QOS_0, QOS_1, QOS_2):
        await pub.publish("am/x", f"q{q}".encode(), qos=q)
    await pub.publish("am2/y", b"second", qos=QOS_2)
    got = []
    for _ in range(4):
        m = await sub.deliver_message(timeout_duration=10)
        assert m is not None
        got.append((m.topic, bytes(m.data), m.qos))
    assert sorted(got) == [("am/x", b"q0", 0), ("am/x", b"q1", 1), ("am/x", b"q2", 2), ("am2/y", b"second", 1)]
    await pub.publish("am/r", b"retained", qos=QOS_1, retain=True)
    await sub.deliver_message(timeout_duration=10)
    late = MQTTClient(client_id="amqtt-late")
    await late.connect(f"mqtt://127.0.0.1:{port}/")
    await late.subscribe([("am/r", QOS_1)])
    m = await late.deliver_message(timeout_duration=10)
    assert m is not None and bytes(m.data) == b"retained" and m.retain
    await pub.publish("am/r", b"", qos=QOS_1, retain=True)
    for c in (sub, pub, late):
        await c.disconnect()


async def test_amqtt_persistent_session(port: int) -> None:
    from amqtt.client import MQTTClient
    from amqtt.mqtt.constants import QOS_1

    dev = MQTTClient(client_id="amqtt-dev", config={"cleansession": False})
    await dev.connect(f"mqtt://127.0.0.1:{port}/", cleansession=False)
    await dev.subscribe([("amp/#", QOS_1)])
    await dev.disconnect()
    pub = MQTTClient(client_id="amqtt-pub2")
    await pub.connect(f"mqtt://127.0.0.1:{port}/")
    for i in range(5):
        await pub.publish("amp/x", str(i).encode(), qos=QOS_1)
    await pub.disconnect()
    dev = MQTTClient(client_id="amqtt-dev", config={"cleansession": False})
    await dev.connect(f"mqtt://127.0.0.1:{port}/", cleansession=False)
    got = []
    for _ in range(5):
        m = await dev.deliver_message(timeout_duration=10)
        assert m is not None
        got.append(bytes(m.data))
    assert got == [str(i).encode() for i in range(5)]
    await dev.disconnect()


def _mosquitto_sub(port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _mosquitto_pub(port: int, *args: str) -> None:
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), *args], check=True, timeout=30,
                   capture_output=True)


def _first_line(proc: subprocess.Popen[bytes]) -> str:
    """mosquitto_sub prints (and flushes) one line per message: block until the first."""
    assert proc.stdout is not None
    return proc.stdout.readline().decode().rstrip("\n")


@need_mosquitto
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_pub_sub(port: int, version: str) -> None:
    base = f"mq/{version}"
    watcher = Paho(port)
    watcher.subscribe(f"{base}/#", qos=1)
    # a retained message tells us when mosquitto_sub's subscription is in place
    _mosquitto_pub(port, "-V", version, "-t", f"{base}/ready", "-m", "r", "-r", "-q", "1")
    sub = _mosquitto_sub(port, "-V", version, "-t", f"{base}/#", "-q", "2", "-C", "4", "-v", "-W", "30",
                         "-i", f"msub-{version}")
    try:
        assert _first_line(sub) == f"{base}/ready r"
        _mosquitto_pub(port, "-V", version, "-t", f"{base}/a", "-m", "zero", "-q", "0")
        _mosquitto_pub(port, "-V", version, "-t", f"{base}/b/c", "-m", "one", "-q", "1")
        _mosquitto_pub(port, "-V", version, "-t", f"{base}/d", "-m", "two", "-q", "2")
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    assert out.decode().splitlines() == [f"{base}/a zero", f"{base}/b/c one", f"{base}/d two"]
    got = {(m.topic, m.payload) for m in watcher.get_n(4)}
    assert got == {(f"{base}/ready", b"r"), (f"{base}/a", b"zero"), (f"{base}/b/c", b"one"), (f"{base}/d", b"two")}
    _mosquitto_pub(port, "-V", version, "-t", f"{base}/ready", "-n", "-r", "-q", "1")
    watcher.disconnect()


@need_mosquitto
def test_mosquitto_retained_and_will(port: int) -> None:
    _mosquitto_pub(port, "-t", "mqr/state", "-m", "on", "-r", "-q", "1")
    out = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", "mqr/#", "-C", "1", "-v",
                          "-W", "20"], capture_output=True, timeout=30)
    assert out.returncode == 0 and out.stdout.decode().strip() == "mqr/state on"
    # a mosquitto_sub killed hard leaves its will behind
    watcher = Paho(port)
    watcher.subscribe("mqw/#", qos=1)
    sub = _mosquitto_sub(port, "-t", "mqr/state", "-v", "--will-topic", "mqw/gone", "--will-payload", "bye",
                         "--will-qos", "1", "-i", "mq-will")
    try:
        assert _first_line(sub) == "mqr/state on"  # connected and subscribed
        sub.kill()
        sub.wait()
        m = watcher.get()
        assert (m.topic, m.payload) == ("mqw/gone", b"bye")
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    _mosquitto_pub(port, "-t", "mqr/state", "-n", "-r", "-q", "1")
    watcher.disconnect()


def test_websocket_transport_with_paho(server) -> None:
    ws_port = server.ports["mqttws"]
    tcp_port = server.ports["mqtt"]
    ws = Paho(ws_port, transport="websockets", v5=True)
    ws.subscribe("ws/#", qos=1)
    tcp = Paho(tcp_port)
    tcp.publish("ws/from-tcp", b"hello browser", qos=1)
    m = ws.get()
    assert (m.topic, m.payload) == ("ws/from-tcp", b"hello browser")
    tcp.subscribe("ws2/#", qos=1)
    ws.publish("ws2/from-ws", b"hello device", qos=2)
    assert tcp.get().payload == b"hello device"
    ws.disconnect()
    tcp.disconnect()
    ws311 = Paho(ws_port, transport="websockets", ws_path="/")
    ws311.subscribe("ws3", qos=0)
    ws311.publish("ws3", b"x", qos=0)
    assert ws311.get().payload == b"x"
    ws311.disconnect()


async def test_websocket_requires_mqtt_subprotocol(server) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    ws_port = server.ports["mqttws"]
    try:
        async with connect(f"ws://127.0.0.1:{ws_port}/mqtt") as ws:
            closed = await asyncio.wait_for(ws.wait_closed(), 10)
            assert closed is None
    except (InvalidHandshake, InvalidStatus):
        pass
    async with connect(f"ws://127.0.0.1:{ws_port}/mqtt", subprotocols=["mqtt"]) as ws:
        await ws.send(C.encode(C.Connect("ws-raw")))
        ack = C.Decoder(server_side=False, version=C.MQTT_311).feed(await asyncio.wait_for(ws.recv(), 10))
        assert isinstance(ack[0], C.Connack) and ack[0].reason_code == 0


def test_raw_client_smoke(port: int) -> None:
    raw = RawClient(port)
    assert raw.connect("smoke").reason_code == 0
    raw.close()


def test_amqp_amq_topic_and_mqtt_are_one_stream(server) -> None:
    """RabbitMQ's MQTT-plugin convention: amq.topic routing key a.b.c <-> MQTT topic a/b/c, both ways."""
    pika = pytest.importorskip("pika")
    if "amqp" not in server.ports:
        pytest.skip("no AMQP door in this build")
    mq = Paho(server.ports["mqtt"], "interop", v5=True)
    mq.subscribe("fleet/+/pos", qos=1)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
    try:
        ch = conn.channel()
        ch.basic_publish("amq.topic", "fleet.k2.pos", b"from-amqp", pika.BasicProperties(delivery_mode=2))
        m = mq.get()
        assert (m.topic, m.payload, m.qos) == ("fleet/k2/pos", b"from-amqp", 1)
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "fleet.#")
        mq.publish("fleet/k3/pos", b"from-mqtt", qos=1)
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            method, _, body = ch.basic_get(q, auto_ack=True)
            if method is not None:
                got = (method.routing_key, body)
            else:
                time.sleep(0.05)
        assert got == ("fleet.k3.pos", b"from-mqtt")
    finally:
        conn.close()
        mq.disconnect()
