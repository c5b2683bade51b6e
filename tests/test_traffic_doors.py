"""Issue 19, traffic control at the gateway, door by door with real clients.

Limits are set at run time through the admin API (``/v1/admin/quotas``) or
``unimq quota``, on one `unimq up` whose ``quota_refuse_after_s`` is 3 s. What
is asserted are outcomes, never durations:

- a publisher over its messages/s rate is slowed, not dropped: every message it
  got an acknowledgement for is stored (the topic's offsets count them), and the
  door counted a hold (``unimq_quota_throttled_total``);
- a persistent violator gets its protocol's quota error (MQTT 5 PUBACK 0x97 /
  DISCONNECT 0x97, AMQP basic.nack, HTTP 429 with Retry-After, RocketMQ
  TOO_MANY_REQUESTS) and only what was acknowledged is stored;
- a connection limit refuses the N+1th connection (MQTT CONNACK 0x97 / 3, AMQP
  530 NOT_ALLOWED in RabbitMQ's words), a subscription limit the N+1th
  subscription (SUBACK 0x97, AMQP 406);
- a limit changed on an open connection reaches it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import paho.mqtt.client as paho
import pika
import pika.exceptions
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
from rocketmq.v5.util import Signature

from grpc_helpers import client_config, endpoints_of, message, producer, raw_message, shared_server, started
from mqtt_fixtures import Paho, RawClient, wait_for

from adapters.mqtt import packets as C

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parent.parent
ROOT = ("root", "root-pw")
QoS1_OK = (0, 0x10)  # success, or "no matching subscribers"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with shared_server(tmp_path_factory, "--set", "quota_refuse_after_s=3") as s:
        r = httpx.post(s.url(path="/v1/admin/users"), json={"name": ROOT[0], "password": ROOT[1], "admin": True})
        assert r.status_code == 201
        s.admin = httpx.Client(base_url=s.url(), auth=ROOT, timeout=30)
        yield s
        s.admin.close()


def _user(srv, name: str, topic: str, **limits: float) -> None:
    """A user with publish/subscribe on ``topic/#`` (and its unified topic), a vhost permission, and ``limits``."""
    a = srv.admin
    assert a.post("/v1/admin/users", json={"name": name, "password": name + "-pw"}).status_code == 201
    for pattern in (f"{topic}/#", topic):
        r = a.post("/v1/admin/acl", json={"subject": name, "resource": "topic", "pattern": pattern,
                                          "actions": ["publish", "subscribe", "create"]})
        assert r.status_code == 201
    r = a.post("/v1/admin/acl", json={"subject": name, "resource": "vhost", "pattern": "/",
                                      "configure": ".*", "write": ".*", "read": ".*"})
    assert r.status_code == 201
    if limits:
        r = a.put(f"/v1/admin/quotas/user/{name}", json=limits)
        assert r.status_code == 200, r.text
        assert r.json() == {"kind": "user", "name": name, **limits, "open_connections": 0}


def _stored(srv, topic: str) -> int:
    r = srv.admin.get(f"/v1/topics/{topic}")
    if r.status_code == 404:
        return 0
    assert r.status_code == 200, r.text
    return sum(q["max_offset"] - q["min_offset"] for q in r.json()["queues"])


def _metric(srv, name: str, protocol: str) -> int:
    text = httpx.get(srv.url(path="/metrics")).text
    for line in text.splitlines():
        if line.startswith(f'unimq_{name}_total{{protocol="{protocol}"}} '):
            return int(float(line.split()[-1]))
    return 0


class Publisher:
    """A paho MQTT 5 client that publishes without waiting and records every PUBACK's reason code."""

    def __init__(self, port: int, user: str, client_id: str) -> None:
        self.codes: dict[int, int] = {}
        self.done = threading.Event()
        self.expect = 0
        self.connack: list[int] = []
        self.disconnect_rc: list[int] = []
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        self.c.username_pw_set(user, user + "-pw")
        self.c.on_connect = lambda c, u, f, rc, p: self.connack.append(rc.value)
        self.c.on_publish = self._on_publish
        self.c.on_disconnect = lambda c, u, f, rc, p: self.disconnect_rc.append(rc.value)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        wait_for(lambda: self.connack, what="CONNACK")

    def _on_publish(self, c, u, mid, rc, props) -> None:
        self.codes[mid] = rc.value
        if len(self.codes) >= self.expect:
            self.done.set()

    def publish_many(self, topic: str, n: int, qos: int = 1, timeout: float = 60) -> list[int]:
        self.expect = n
        for i in range(n):
            self.c.publish(topic, f"m{i}".encode(), qos)
        assert self.done.wait(timeout), f"{len(self.codes)} of {n} acknowledged"
        return list(self.codes.values())

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


# ------------------------------------------------------------------ MQTT


def test_mqtt_publisher_over_its_rate_is_slowed_not_dropped(srv) -> None:
    _user(srv, "mq-slow", "mslow", publish_msgs_per_s=50)
    before = _metric(srv, "quota_throttled", "mqtt")
    p = Publisher(srv.ports["mqtt"], "mq-slow", "mq-slow-1")
    codes = p.publish_many("mslow/a", 120)  # 70 over the burst: about 1.4 s over a rate of 50/s
    p.stop()
    assert [c for c in codes if c not in QoS1_OK] == []
    assert _stored(srv, "mslow") == 120
    assert _metric(srv, "quota_throttled", "mqtt") > before


def test_mqtt_persistent_violator_gets_quota_exceeded_and_nothing_acknowledged_is_lost(srv) -> None:
    _user(srv, "mq-hog", "mhog", publish_msgs_per_s=10)
    p = Publisher(srv.ports["mqtt"], "mq-hog", "mq-hog-1")
    codes = p.publish_many("mhog/a", 100)  # 10 s worth at 10/s: over for longer than quota_refuse_after_s
    p.stop()
    ok = sum(1 for c in codes if c in QoS1_OK)
    assert codes.count(C.RC_QUOTA_EXCEEDED) > 0
    assert ok + codes.count(C.RC_QUOTA_EXCEEDED) == 100
    assert _stored(srv, "mhog") == ok
    assert _metric(srv, "quota_exceeded", "mqtt") > 0


def test_mqtt_qos0_flood_is_disconnected_with_0x97(srv) -> None:
    _user(srv, "mq-flood", "mflood", publish_msgs_per_s=5)
    c = RawClient(srv.ports["mqtt"], C.MQTT_5)
    assert c.connect("mq-flood-1", username="mq-flood", password=b"mq-flood-pw").reason_code == 0
    for i in range(200):
        c.send(C.Publish("mflood/a", b"x" * 10, 0))
    got = c.closed_by_server(timeout=30)
    c.close()
    assert any(isinstance(pk, C.Disconnect) and pk.reason_code == C.RC_QUOTA_EXCEEDED for pk in got), got
    assert _stored(srv, "mflood") < 200


def test_mqtt_connection_and_subscription_limits(srv) -> None:
    _user(srv, "mq-conn", "mconn", connections=2, subscriptions=2)
    port = srv.ports["mqtt"]
    a = Paho(port, "mq-conn-a", v5=True, username="mq-conn", password="mq-conn-pw")
    b = Paho(port, "mq-conn-b", v5=False, username="mq-conn", password="mq-conn-pw")
    assert srv.admin.get("/v1/admin/quotas/user/mq-conn").json()["open_connections"] == 2
    # the third: CONNACK 0x97 (v5), 3 "server unavailable" (3.1.1)
    raw5 = RawClient(port, C.MQTT_5)
    assert raw5.connect("mq-conn-c", username="mq-conn", password=b"mq-conn-pw").reason_code == C.RC_QUOTA_EXCEEDED
    raw5.close()
    raw3 = RawClient(port, C.MQTT_311)
    assert raw3.connect("mq-conn-d", username="mq-conn", password=b"mq-conn-pw").reason_code == 3
    raw3.close()
    # a takeover of an open client id is not a new connection
    a2 = Paho(port, "mq-conn-a", v5=True, username="mq-conn", password="mq-conn-pw")
    # subscriptions: two per connection
    assert [rc.value for rc in a2.subscribe("mconn/1", qos=1)] == [1]
    assert [rc.value for rc in a2.subscribe("mconn/2", qos=1)] == [1]
    assert [rc.value for rc in a2.subscribe("mconn/3", qos=1)] == [C.RC_QUOTA_EXCEEDED]
    assert [rc.value for rc in a2.subscribe("mconn/1", qos=0)] == [0]  # a change of one it has is no new one
    b.disconnect()
    # a slot is free again once a connection ended
    wait_for(lambda: srv.admin.get("/v1/admin/quotas/user/mq-conn").json()["open_connections"] == 1)
    c = Paho(port, "mq-conn-e", v5=True, username="mq-conn", password="mq-conn-pw")
    c.disconnect()
    a2.disconnect()
    a.c.loop_stop()


def test_mqtt_a_limit_set_on_an_open_connection_takes_effect(srv) -> None:
    _user(srv, "mq-live", "mlive")
    c = RawClient(srv.ports["mqtt"], C.MQTT_5)
    assert c.connect("mq-live-1", username="mq-live", password=b"mq-live-pw").reason_code == 0
    c.send(C.Publish("mlive/a", b"x", 1, packet_id=1))
    assert c.recv_type(C.PubAck).reason_code in QoS1_OK
    r = srv.admin.put("/v1/admin/quotas/user/mq-live", json={"publish_msgs_per_s": 0})
    assert r.status_code == 200
    deadline = time.monotonic() + 15
    pid = 2
    while True:
        c.send(C.Publish("mlive/a", b"x", 1, packet_id=pid))
        if c.recv_type(C.PubAck).reason_code == C.RC_QUOTA_EXCEEDED:
            break
        assert time.monotonic() < deadline, "the new limit never reached the open connection"
        pid += 1
        time.sleep(0.05)
    # and lifted again
    assert srv.admin.delete("/v1/admin/quotas/user/mq-live").status_code == 204
    while True:
        pid += 1
        c.send(C.Publish("mlive/a", b"x", 1, packet_id=pid))
        if c.recv_type(C.PubAck).reason_code in QoS1_OK:
            break
        assert time.monotonic() < deadline + 15
        time.sleep(0.05)
    c.close()


# ------------------------------------------------------------------ AMQP


def _amqp(srv, user: str, name: str = "") -> pika.BlockingConnection:
    props = {"connection_name": name} if name else None
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", srv.ports["amqp"], "/", pika.PlainCredentials(user, user + "-pw"), connection_attempts=1,
        socket_timeout=10, blocked_connection_timeout=60, client_properties=props))


def test_amqp_connection_limit_refuses_in_rabbitmqs_words(srv) -> None:
    _user(srv, "amq-conn", "aconn", connections=1)
    first = _amqp(srv, "amq-conn")
    # pika reports a close during connection.open as a probable access denial, with the broker's close
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        _amqp(srv, "amq-conn")
    assert '(530) "NOT_ALLOWED - Connection refused for user \'amq-conn\': user connection limit (1) is reached"' \
        in str(e.value)
    first.close()
    wait_for(lambda: srv.admin.get("/v1/admin/quotas/user/amq-conn").json()["open_connections"] == 0)
    _amqp(srv, "amq-conn").close()
    # a client id's limit (AMQP: the connection_name property)
    assert srv.admin.put("/v1/admin/quotas/client/amq-app", json={"connections": 1}).status_code == 200
    _user(srv, "amq-conn2", "aconn2")
    one = _amqp(srv, "amq-conn2", "amq-app")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        _amqp(srv, "amq-conn2", "amq-app")
    assert '(530) "NOT_ALLOWED - Connection refused for client \'amq-app\': client connection limit (1) is reached"' \
        in str(e.value)
    one.close()
    assert srv.admin.delete("/v1/admin/quotas/client/amq-app").status_code == 204


def test_amqp_publisher_over_its_rate_is_blocked_and_slowed_not_dropped(srv) -> None:
    _user(srv, "amq-slow", "aslow", publish_msgs_per_s=40)
    conn = _amqp(srv, "amq-slow")
    blocked: list[str] = []
    conn.add_on_connection_blocked_callback(lambda c, m: blocked.append("blocked"))
    conn.add_on_connection_unblocked_callback(lambda c, m: blocked.append("unblocked"))
    ch = conn.channel()
    ch.queue_declare("aslow-q", durable=True)
    ch.confirm_delivery()
    for i in range(80):  # every one confirmed (basic_publish raises on a nack)
        ch.basic_publish("", "aslow-q", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    n = ch.queue_declare("aslow-q", passive=True).method.message_count
    conn.process_data_events(0)  # a BlockingConnection runs its callbacks here
    conn.close()
    assert n == 80
    assert "blocked" in blocked  # connection.blocked: pika advertises the capability
    assert _metric(srv, "quota_throttled", "amqp") > 0


def test_amqp_persistent_violator_is_nacked_and_only_confirmed_messages_are_stored(srv) -> None:
    _user(srv, "amq-hog", "ahog", publish_msgs_per_s=5)
    conn = _amqp(srv, "amq-hog")
    ch = conn.channel()
    ch.queue_declare("ahog-q", durable=True)
    ch.confirm_delivery()
    acked = nacked = 0
    for i in range(60):
        try:
            ch.basic_publish("", "ahog-q", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
            acked += 1
        except pika.exceptions.NackError:
            nacked += 1
    n = ch.queue_declare("ahog-q", passive=True).method.message_count
    conn.close()
    assert nacked > 0
    assert n == acked


def test_amqp_consumer_limit(srv) -> None:
    _user(srv, "amq-subs", "asubs", subscriptions=1)
    conn = _amqp(srv, "amq-subs")
    ch = conn.channel()
    ch.queue_declare("asubs-q")
    ch.basic_consume("asubs-q", lambda *a: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_consume("asubs-q", lambda *a: None)
    assert e.value.reply_code == 406
    conn.close()


# ------------------------------------------------------------------ HTTP


def test_http_over_its_rate_is_slowed_then_429_with_retry_after(srv) -> None:
    _user(srv, "web", "hweb", publish_msgs_per_s=5)
    ok = 0
    refused = None
    with httpx.Client(base_url=srv.url(), auth=("web", "web-pw"), timeout=30) as c:
        for i in range(200):
            r = c.post("/v1/topics/hweb/messages", content=f"m{i}".encode())
            if r.status_code == 200:
                ok += 1
                continue
            refused = r
            break
    assert refused is not None, "never refused"
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    body = refused.json()
    assert body["error"] == "TOO_MANY_REQUESTS" and body["retry_after_s"] > 0
    assert ok > 5  # held back first, not refused at once
    assert _stored(srv, "hweb") == ok
    assert _metric(srv, "quota_throttled", "http") > 0
    assert _metric(srv, "quota_exceeded", "http") > 0


# ------------------------------------------------------------------ gRPC (RocketMQ 5)


def test_grpc_over_its_rate_is_slowed_then_too_many_requests(srv) -> None:
    _user(srv, "rmq", "rtopic", publish_msgs_per_s=20)
    r = srv.admin.post("/v1/admin/users/rmq/access-keys")
    assert r.status_code == 201
    ak, sk = r.json()["access_key"], r.json()["secret_key"]
    port = srv.ports["grpc"]
    # the official producer, a little over its rate: every send answered, every one stored
    with started(producer(port, ("rtopic",), ak=ak, sk=sk)) as p:
        ids = [p.send(message("rtopic", f"m{i}".encode())).message_id for i in range(40)]
    assert len(set(ids)) == 40 and _stored(srv, "rtopic") == 40
    assert _metric(srv, "quota_throttled", "grpc") > 0
    # a violator sending batches far over its rate: the v2 status TOO_MANY_REQUESTS, nothing of it stored
    md = Signature.metadata(client_config(port, ak, sk), "rmq-flood")

    async def flood() -> list[int]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            codes = []
            for _ in range(3):
                req = spb.SendMessageRequest(messages=[raw_message("rtopic", b"x") for _ in range(200)])
                codes.append((await stub.SendMessage(req, metadata=md, timeout=30)).status.code)
            return codes

    codes = asyncio.run(flood())
    assert pb.Code.TOO_MANY_REQUESTS in codes
    assert _stored(srv, "rtopic") == 40 + 200 * codes.count(pb.Code.OK)


# ------------------------------------------------------------------ the CLI


def test_quota_cli(srv) -> None:
    _user(srv, "cli-q", "cliq")
    env = {"UNIMQ_ENDPOINT": srv.url().rstrip("/"), "UNIMQ_USER": ROOT[0], "UNIMQ_PASSWORD": ROOT[1],
           "PATH": "/usr/bin:/bin"}

    def unimq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "unimq", "quota", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)

    assert unimq("set", "user", "cli-q", "--msgs-per-s", "100", "--connections", "3").returncode == 0
    assert unimq("set", "user", "cli-q", "--bytes-per-s", "1000").returncode == 0  # merged
    got = srv.admin.get("/v1/admin/quotas/user/cli-q").json()
    assert got == {"kind": "user", "name": "cli-q", "connections": 3, "publish_msgs_per_s": 100,
                   "publish_bytes_per_s": 1000, "open_connections": 0}
    assert unimq("set", "user", "cli-q", "--connections", "0", "--none").returncode == 0
    assert "connections" not in srv.admin.get("/v1/admin/quotas/user/cli-q").json()
    out = unimq("list")
    assert out.returncode == 0 and "user\tcli-q\tpublish_msgs_per_s=100 publish_bytes_per_s=1000" in out.stdout
    assert unimq("set", "user", "cli-q").returncode == 2
    assert unimq("delete", "user", "cli-q").returncode == 0
    assert unimq("delete", "user", "cli-q").returncode == 4
    assert unimq("set", "group", "x", "--connections", "1").returncode == 2
    bad = srv.admin.put("/v1/admin/quotas/user/cli-q", json={"connections": -1})
    assert bad.status_code == 400
    # not an admin: 403
    assert httpx.get(srv.url(path="/v1/admin/quotas"), auth=("cli-q", "cli-q-pw")).status_code == 403
