"""Issue 19: the MQTT and AMQP doors log in against the same identity store as HTTP.

MQTT (raw codec client and paho): CONNACK 0x86 (v5) / 4 (3.1.1) for a wrong
password, 0x87 / 5 for an anonymous client once users exist; PUBLISH and
SUBSCRIBE beyond the user's topic permissions refused with 0x87; a revoked
permission stops an open connection's next PUBLISH; deliveries follow read
rights. AMQP (pika): PLAIN login against the store, ACCESS_REFUSED with
RabbitMQ's wording for a wrong password and for a vhost without permission.
"""

from __future__ import annotations

import time

import httpx
import pika
import pika.exceptions
import pytest
from mqtt_fixtures import Paho, RawClient

from adapters.mqtt import packets as C

ROOT = ("root", "root-pw")


@pytest.fixture
def server(unimq_server):
    s = unimq_server()
    url = s.url(path="/v1/admin/users")
    assert httpx.post(url, json={"name": ROOT[0], "password": ROOT[1], "admin": True}).status_code == 201
    admin = httpx.Client(base_url=s.url(), auth=ROOT, timeout=10)
    assert admin.post("/v1/admin/users", json={"name": "dev", "password": "dev-pw"}).status_code == 201
    for pattern, actions in (("dev/#", ["publish", "subscribe"]), ("feed/+", ["subscribe"])):
        r = admin.post("/v1/admin/acl", json={"subject": "dev", "resource": "topic", "pattern": pattern,
                                              "actions": actions})
        assert r.status_code == 201
    s.admin = admin
    return s


def _raw(port: int, cid: str, user: str | None, password: str | None, v5: bool = True) -> tuple[RawClient, int]:
    c = RawClient(port, C.MQTT_5 if v5 else C.MQTT_311)
    ack = c.connect(cid, username=user, password=password.encode() if password is not None else None)
    return c, ack.reason_code


def _publish(c: RawClient, topic: str, pid: int) -> int:
    c.send(C.Publish(topic, b"x", 1, packet_id=pid))
    ack = c.recv_type(C.PubAck)
    return 0 if ack.reason_code == C.RC_NO_MATCHING_SUBSCRIBERS else ack.reason_code


def test_mqtt_logins(server) -> None:
    port = server.ports["mqtt"]
    for v5, bad_pw, anon in ((True, 0x86, 0x87), (False, 4, 5)):
        c, rc = _raw(port, "ok", "dev", "dev-pw", v5)
        assert rc == 0
        c.close()
        for user, password, want in (("dev", "nope", bad_pw), ("ghost", "dev-pw", bad_pw), ("dev", "", bad_pw),
                                     (None, None, anon)):
            c, rc = _raw(port, "x", user, password, v5)
            assert rc == want, (v5, user, password, rc)
            c.close()
    metrics = httpx.get(server.url(path="/metrics")).text
    assert 'unimq_auth_failed_total{protocol="mqtt"}' in metrics


def test_mqtt_topic_rights_and_a_revocation_on_an_open_connection(server) -> None:
    port = server.ports["mqtt"]
    dev, rc = _raw(port, "dev-1", "dev", "dev-pw")
    assert rc == 0
    assert _publish(dev, "dev/a", 1) == 0
    assert _publish(dev, "prod/a", 2) == C.RC_NOT_AUTHORIZED
    dev.send(C.Subscribe(3, [("feed/x", C.SubOptions(qos=1)), ("feed/#", C.SubOptions(qos=1)),
                             ("dev/inbox", C.SubOptions(qos=1))]))
    assert dev.recv_type(C.Suback).reason_codes == [1, C.RC_NOT_AUTHORIZED, 1]
    # a paho subscriber of dev/# sees what dev publishes
    watcher = Paho(port, "dev-watch", v5=True, username="dev", password="dev-pw")
    watcher.subscribe("dev/#", qos=1)
    root = Paho(port, "root-pub", v5=True, username=ROOT[0], password=ROOT[1])
    root.publish("dev/news", b"hello", qos=1)
    assert watcher.get().payload == b"hello"
    # revoke: the open connection's next publish is refused
    r = server.admin.post("/v1/admin/acl/revoke", json={"subject": "dev", "resource": "topic", "pattern": "dev/#",
                                                        "actions": ["publish"]})
    assert r.status_code == 204
    deadline = time.monotonic() + 15
    pid = 10
    while _publish(dev, "dev/a", pid) != C.RC_NOT_AUTHORIZED:
        assert time.monotonic() < deadline, "the revocation never reached the open connection"
        pid += 1
        time.sleep(0.05)
    # reading is still granted
    root.publish("dev/more", b"again", qos=1)
    assert watcher.get().payload == b"again"
    # deleting the user ends its open connections (v5: DISCONNECT 0x87)
    assert server.admin.delete("/v1/admin/users/dev").status_code == 204
    got = dev.closed_by_server(timeout=15)
    assert any(isinstance(p, C.Disconnect) and p.reason_code == C.RC_NOT_AUTHORIZED for p in got), got
    dev.close()
    watcher.c.loop_stop()
    root.disconnect()


def _amqp(server, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", server.ports["amqp"], vhost, pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=10, blocked_connection_timeout=10))


def test_amqp_logins_and_vhost_access(server) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
        _amqp(server, "dev", "wrong")
    assert "ACCESS_REFUSED" in str(e.value)
    # dev has topic permissions but none on a vhost: RabbitMQ refuses connection.open
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        _amqp(server, "dev", "dev-pw")
    assert "access to vhost '/' refused for user 'dev'" in str(e.value)
    r = server.admin.post("/v1/admin/acl", json={"subject": "dev", "resource": "vhost", "pattern": "/",
                                                 "configure": ".*", "write": ".*", "read": ".*"})
    assert r.status_code == 201
    deadline = time.monotonic() + 15
    while True:
        try:
            conn = _amqp(server, "dev", "dev-pw")
            break
        except pika.exceptions.ProbableAccessDeniedError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    conn.close()
    # the superuser may do everything over AMQP too
    conn = _amqp(server, *ROOT)
    ch = conn.channel()
    ch.queue_declare("root-q")
    ch.basic_publish("", "root-q", b"hi")
    deadline = time.monotonic() + 15
    while (got := ch.basic_get("root-q", auto_ack=True))[0] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert got[2] == b"hi"
    conn.close()


def test_amqp_vhost_regexes_are_rabbitmqs(server) -> None:
    """configure / write / read regular expressions on queues and exchanges, as RabbitMQ checks them."""
    assert server.admin.post("/v1/admin/users", json={"name": "shop", "password": "shop-pw"}).status_code == 201
    r = server.admin.post("/v1/admin/acl", json={"subject": "shop", "resource": "vhost", "pattern": "/",
                                                 "configure": "^shop\\.", "write": "^(amq\\.default|shop\\..*)$",
                                                 "read": "^shop\\.(orders|public)$"})
    assert r.status_code == 201
    conn = _amqp(server, "shop", "shop-pw")
    ch = conn.channel()
    ch.queue_declare("shop.orders")
    ch.queue_declare("shop.private")
    ch.basic_publish("", "shop.orders", b"order-1")  # write on amq.default
    deadline = time.monotonic() + 15
    while (got := ch.basic_get("shop.orders", auto_ack=True))[0] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert got[2] == b"order-1"
    refusals = [
        (lambda c: c.queue_declare("billing"), "access to queue 'billing' in vhost '/' refused for user 'shop'"),
        (lambda c: c.basic_get("shop.private"), "access to queue 'shop.private' in vhost '/' refused for user 'shop'"),
        (lambda c: c.exchange_declare("audit", "fanout"), "access to exchange 'audit' in vhost '/' refused"),
        (lambda c: c.queue_bind("shop.orders", "amq.topic", "x.y"),
         "access to exchange 'amq.topic' in vhost '/' refused for user 'shop'"),
    ]
    for op, words in refusals:
        c = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            op(c)
        assert e.value.reply_code == 403 and words in e.value.reply_text, e.value.reply_text
    # publishing to an exchange without write: the channel is closed with 403
    c = conn.channel()
    c.basic_publish("amq.topic", "a.b", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        c.queue_declare("shop.orders", passive=True)
    assert e.value.reply_code == 403 and "access to exchange 'amq.topic'" in e.value.reply_text
    conn.close()
    metrics = httpx.get(server.url(path="/metrics")).text
    assert 'unimq_auth_denied_total{protocol="amqp"}' in metrics


def test_grpc_access_keys_of_the_store(server) -> None:
    """The official RocketMQ client signs with an access key pair of a store user; the user's
    permissions decide (the signature proves who it is)."""
    import asyncio

    from grpc_helpers import client_config, message, producer, started
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.v5.util import Signature
    from test_grpc_security import _unauthorized_status

    r = server.admin.post("/v1/admin/users/dev/access-keys")
    assert r.status_code == 201
    ak, sk = r.json()["access_key"], r.json()["secret_key"]
    assert ak not in str(server.admin.get("/v1/admin/users/dev").json().get("secret", ""))
    port = server.ports["grpc"]
    for t in ("dev", "prod"):  # dev may publish to topic dev (as dev/#'s carrier), not create it
        assert server.admin.post("/v1/topics", json={"name": t}).status_code == 201
    with started(producer(port, ("dev",), ak=ak, sk=sk)) as p:
        assert p.send(message("dev", b"signed by dev")).message_id
    wrong = Signature.metadata(client_config(port, ak, "not-the-secret"), "test-client")
    assert asyncio.run(_unauthorized_status(port, wrong)) == pb.Code.UNAUTHORIZED
    assert asyncio.run(_unauthorized_status(port, None)) == pb.Code.UNAUTHORIZED  # users exist: sign
    # dev may not publish to another topic: the processor's authorizer refuses it
    with started(producer(port, ("prod",), ak=ak, sk=sk)) as p:
        with pytest.raises(Exception):
            p.send(message("prod", b"refused"))
    assert "denied: user=dev protocol=grpc" in server.stderr()
    assert server.admin.delete(f"/v1/admin/users/dev/access-keys/{ak}").status_code == 204
    right = Signature.metadata(client_config(port, ak, sk), "test-client")
    deadline = time.monotonic() + 15
    while asyncio.run(_unauthorized_status(port, right)) != pb.Code.UNAUTHORIZED:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_fuzzed_mqtt_and_amqp_logins_never_get_in(server) -> None:
    """hypothesis: random user names and passwords (and near misses) never log in; the server keeps serving."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    names = st.one_of(st.just("dev"), st.just("root"), st.text(max_size=40).filter(lambda t: "\x00" not in t))
    passwords = st.one_of(st.binary(max_size=64), st.sampled_from([b"dev-pw ", b"Dev-pw", b"dev-p", b"root-pw\x00"]))
    port = server.ports["mqtt"]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(names, passwords, st.booleans())
    def mqtt(name: str, password: bytes, v5: bool) -> None:
        if (name, password) in (("dev", b"dev-pw"), ("root", b"root-pw")):
            return
        c = RawClient(port, C.MQTT_5 if v5 else C.MQTT_311)
        try:
            ack = c.connect("fuzz", username=name, password=password)
            assert ack.reason_code in ((0x86,) if v5 else (4,)), (name, password, ack.reason_code)
        finally:
            c.close()

    mqtt()

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.text(min_size=1, max_size=30).filter(lambda t: "\x00" not in t),
           st.text(max_size=30).filter(lambda t: "\x00" not in t))
    def amqp(name: str, password: str) -> None:
        if (name, password) in (("dev", "dev-pw"), ("root", "root-pw"), ("guest", "guest")):
            return
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            _amqp(server, name, password).close()

    amqp()
    c, rc = _raw(port, "still-there", "dev", "dev-pw")
    assert rc == 0
    c.close()
