"""Issue 19, traffic control: connection rates, and connection and subscription limits on HTTP and gRPC.

Real clients against one `unimq up`; limits set at run time through the admin
API or ``unimq quota``. A connection rate is set so low (0.001/s) that one
connection is all a subject gets for the length of the test: the second is
refused whatever the machine's speed (no timing is asserted):

- MQTT: CONNACK 0x9F *Connection rate exceeded* (v5), 3 (3.1.1);
- AMQP: 530 NOT_ALLOWED in RabbitMQ's words for a refused connection;
- HTTP: 429 with Retry-After (and the connection closed);
- an address limit (``address 127.0.0.2``) counts a client's IP address, whatever its user;
- HTTP connections (keep-alive) and push subscriptions count against a user's
  connection and subscription limits; a gRPC client's Telemetry stream is its
  connection (TOO_MANY_REQUESTS, then RESOURCE_EXHAUSTED), its subscription
  settings hold its subscriptions.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import paho.mqtt.client as paho
import pika
import pika.exceptions
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
from rocketmq.v5.util import Signature

from grpc_helpers import client_config, shared_server
from mqtt_fixtures import RawClient, wait_for

from adapters.mqtt import packets as C

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parent.parent
ROOT = ("root", "root-pw")
RARE = 0.001  # connections/s: one in the bucket, the next one in 1000 s


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with shared_server(tmp_path_factory) as s:
        r = httpx.post(s.url(path="/v1/admin/users"), json={"name": ROOT[0], "password": ROOT[1], "admin": True})
        assert r.status_code == 201
        s.admin = httpx.Client(base_url=s.url(), auth=ROOT, timeout=30)
        yield s
        s.admin.close()


def _user(srv, name: str, topic: str, kind: str = "user", subject: str = "", **limits: float) -> None:
    a = srv.admin
    assert a.post("/v1/admin/users", json={"name": name, "password": name + "-pw"}).status_code == 201
    for resource, pattern in (("topic", f"{topic}/#"), ("topic", topic), ("group", "*")):
        r = a.post("/v1/admin/acl", json={"subject": name, "resource": resource, "pattern": pattern,
                                          "actions": ["publish", "subscribe", "create"] if resource == "topic"
                                          else ["subscribe"]})
        assert r.status_code == 201, r.text
    r = a.post("/v1/admin/acl", json={"subject": name, "resource": "vhost", "pattern": "/",
                                      "configure": ".*", "write": ".*", "read": ".*"})
    assert r.status_code == 201
    if limits:
        r = a.put(f"/v1/admin/quotas/{kind}/{subject or name}", json=limits)
        assert r.status_code == 200, r.text


def _open(srv, kind: str, name: str) -> int:
    return srv.admin.get(f"/v1/admin/quotas/{kind}/{name}").json()["open_connections"]


# ------------------------------------------------------------------ MQTT


def _mqtt_connack(port: int, user: str, client_id: str, v5: bool, bind: str = "") -> int:
    """CONNECT with paho and the CONNACK's reason code (v5) or return code (3.1.1)."""
    got: list[int] = []
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id,
                    protocol=paho.MQTTv5 if v5 else paho.MQTTv311)
    c.username_pw_set(user, user + "-pw")
    c.on_connect = lambda c, u, f, rc, p: got.append(rc.value)
    c.connect("127.0.0.1", port, bind_address=bind)
    c.loop_start()
    try:
        wait_for(lambda: got, what="CONNACK")
    finally:
        if got and got[0] == 0:
            c.disconnect()
        c.loop_stop()
    return got[0]


def test_mqtt_connection_rate_is_refused_with_0x9f_and_3(srv) -> None:
    _user(srv, "mq-rate", "mrate", connections_per_s=RARE)
    port = srv.ports["mqtt"]
    assert _mqtt_connack(port, "mq-rate", "mq-rate-1", v5=True) == 0
    assert _mqtt_connack(port, "mq-rate", "mq-rate-2", v5=True) == 0x9F  # Connection rate exceeded
    # 3.1.1: return code 3, which paho reports as v5's 0x88 "Server unavailable"; the raw byte too
    assert _mqtt_connack(port, "mq-rate", "mq-rate-3", v5=False) == 0x88
    raw = RawClient(port, C.MQTT_311)
    assert raw.connect("mq-rate-5", username="mq-rate", password=b"mq-rate-pw").reason_code == 3
    raw.close()
    assert srv.admin.delete("/v1/admin/quotas/user/mq-rate").status_code == 204
    assert _mqtt_connack(port, "mq-rate", "mq-rate-4", v5=True) == 0


def test_an_address_rate_counts_every_user_of_that_address(srv) -> None:
    _user(srv, "mq-addr", "maddr")
    _user(srv, "mq-addr2", "maddr2")
    r = srv.admin.put("/v1/admin/quotas/address/127.0.0.2", json={"connections_per_s": RARE})
    assert r.status_code == 200 and r.json()["kind"] == "address"
    # an address limit is about connections only
    assert srv.admin.put("/v1/admin/quotas/address/127.0.0.2", json={"publish_msgs_per_s": 1}).status_code == 400
    assert srv.admin.put("/v1/admin/quotas/address/not-an-ip", json={"connections": 1}).status_code == 400
    port = srv.ports["mqtt"]
    assert _mqtt_connack(port, "mq-addr", "mq-addr-1", v5=True, bind="127.0.0.2") == 0
    assert _mqtt_connack(port, "mq-addr2", "mq-addr-2", v5=True, bind="127.0.0.2") == 0x9F
    assert _mqtt_connack(port, "mq-addr2", "mq-addr-3", v5=True) == 0  # from 127.0.0.1
    # HTTP from that address too
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), base_url=srv.url(),
                      auth=("mq-addr", "mq-addr-pw"), timeout=30) as c:
        r = c.get("/healthz")
    assert r.status_code == 429 and r.json()["error"] == "TOO_MANY_REQUESTS" and int(r.headers["retry-after"]) >= 1
    assert srv.admin.delete("/v1/admin/quotas/address/127.0.0.2").status_code == 204


# ------------------------------------------------------------------ AMQP


def _amqp(srv, user: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", srv.ports["amqp"], "/", pika.PlainCredentials(user, user + "-pw"), connection_attempts=1,
        socket_timeout=10))


def test_amqp_connection_rate_refuses_in_rabbitmqs_words(srv) -> None:
    _user(srv, "amq-rate", "arate", connections_per_s=RARE)
    _amqp(srv, "amq-rate").close()
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        _amqp(srv, "amq-rate")
    assert '(530) "NOT_ALLOWED - Connection refused for user \'amq-rate\': user connection rate limit (0.001/s) ' \
           'is reached"' in str(e.value)


# ------------------------------------------------------------------ HTTP


def test_http_keep_alive_connections_count_and_the_connection_rate(srv) -> None:
    _user(srv, "web-conn", "hconn", connections=1)
    auth = ("web-conn", "web-conn-pw")
    with httpx.Client(base_url=srv.url(), auth=auth, timeout=30) as first:
        assert first.post("/v1/topics/hconn/messages", content=b"1").status_code == 200
        assert first.post("/v1/topics/hconn/messages", content=b"2").status_code == 200  # the same connection
        assert _open(srv, "user", "web-conn") == 1
        with httpx.Client(base_url=srv.url(), auth=auth, timeout=30) as second:
            r = second.post("/v1/topics/hconn/messages", content=b"3")
            assert r.status_code == 429, r.text
            assert r.json()["error"] == "TOO_MANY_REQUESTS" and "connection limit (1)" in r.json()["message"]
            assert int(r.headers["retry-after"]) >= 1 and r.headers["connection"] == "close"
    wait_for(lambda: _open(srv, "user", "web-conn") == 0, what="the connection's slot released")
    with httpx.Client(base_url=srv.url(), auth=auth, timeout=30) as third:
        assert third.post("/v1/topics/hconn/messages", content=b"4").status_code == 200
    # the rate
    _user(srv, "web-rate", "hrate", connections_per_s=RARE)
    with httpx.Client(base_url=srv.url(), auth=("web-rate", "web-rate-pw"), timeout=30) as c:
        assert c.get("/healthz").status_code == 200
    with httpx.Client(base_url=srv.url(), auth=("web-rate", "web-rate-pw"), timeout=30) as c:
        r = c.get("/healthz")
        assert r.status_code == 429 and "connection rate (0.001/s)" in r.json()["message"]


def test_http_push_subscriptions_count_as_subscriptions(srv) -> None:
    _user(srv, "web-push", "hpush", subscriptions=1)
    with httpx.Client(base_url=srv.url(), auth=("web-push", "web-push-pw"), timeout=30) as c:
        spec = {"topic": "hpush", "sink": "http://127.0.0.1:9/hook"}
        r = c.post("/v1/subscriptions", json={**spec, "group": "hpush-1"})
        assert r.status_code == 201, r.text
        first = r.json()
        assert first["owner"] == "web-push"
        r = c.post("/v1/subscriptions", json={**spec, "group": "hpush-2"})
        assert r.status_code == 429 and r.json()["error"] == "TOO_MANY_REQUESTS"
        assert "subscription limit (1)" in r.json()["message"]
        # another user's are not counted against this one
        r = srv.admin.post("/v1/subscriptions", json={**spec, "group": "hpush-root"})
        assert r.status_code == 201
        assert c.delete(f"/v1/subscriptions/{first['id']}").status_code == 204
        r = c.post("/v1/subscriptions", json={**spec, "group": "hpush-3"})
        assert r.status_code == 201
        c.delete(f"/v1/subscriptions/{r.json()['id']}")
    srv.admin.delete(f"/v1/subscriptions/{srv.admin.get('/v1/subscriptions').json()[0]['id']}")


# ------------------------------------------------------------------ gRPC


def _access_key(srv, user: str) -> tuple[str, str]:
    r = srv.admin.post(f"/v1/admin/users/{user}/access-keys")
    assert r.status_code == 201
    return r.json()["access_key"], r.json()["secret_key"]


def _subscription(group: str, *topics: str) -> pb.Settings:
    return pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name=group),
        subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=t),
                                            expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"))
                       for t in topics]))


def test_grpc_telemetry_stream_is_a_connection_and_its_subscriptions_are_limited(srv) -> None:
    _user(srv, "rmq-conn", "rconn", connections=1, subscriptions=1)
    ak, sk = _access_key(srv, "rmq-conn")
    port = srv.ports["grpc"]

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            first = stub.Telemetry(metadata=Signature.metadata(client_config(port, ak, sk), "rmq-conn-1"))
            # two subscriptions, one allowed: the settings are refused; one: taken
            await first.write(spb.TelemetryCommand(settings=_subscription("rconn-g", "rconn", "rconn/x")))
            assert (await first.read()).status.code == pb.Code.TOO_MANY_REQUESTS
            await first.write(spb.TelemetryCommand(settings=_subscription("rconn-g", "rconn")))
            assert (await first.read()).status.code == pb.Code.OK
            assert _open(srv, "user", "rmq-conn") == 1
            # a second client of the same user: its stream is refused
            second = stub.Telemetry(metadata=Signature.metadata(client_config(port, ak, sk), "rmq-conn-2"))
            got = await second.read()
            assert got.status.code == pb.Code.TOO_MANY_REQUESTS and "connection limit (1)" in got.status.message
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await second.read()
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await first.done_writing()
            first.cancel()
        wait_for(lambda: _open(srv, "user", "rmq-conn") == 0, what="the stream's slot released")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            third = stub.Telemetry(metadata=Signature.metadata(client_config(port, ak, sk), "rmq-conn-3"))
            await third.write(spb.TelemetryCommand(settings=_subscription("rconn-g", "rconn")))
            assert (await third.read()).status.code == pb.Code.OK
            third.cancel()

    asyncio.run(scenario())


# ------------------------------------------------------------------ the CLI


def test_quota_cli_connection_rate_and_address(srv) -> None:
    env = {"UNIMQ_ENDPOINT": srv.url().rstrip("/"), "UNIMQ_USER": ROOT[0], "UNIMQ_PASSWORD": ROOT[1],
           "PATH": "/usr/bin:/bin"}

    def unimq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "unimq", "quota", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)

    assert unimq("set", "address", "127.0.0.9", "--connections-per-s", "5", "--connections", "20").returncode == 0
    got = srv.admin.get("/v1/admin/quotas/address/127.0.0.9").json()
    assert got == {"kind": "address", "name": "127.0.0.9", "connections": 20, "connections_per_s": 5,
                   "open_connections": 0}
    bad = unimq("set", "address", "127.0.0.9", "--msgs-per-s", "5")
    assert bad.returncode == 1 and "an address limit has only" in bad.stderr
    out = unimq("list")
    assert "address\t127.0.0.9\tconnections=20 connections_per_s=5" in out.stdout
    assert unimq("delete", "address", "127.0.0.9").returncode == 0
