"""A Mosquitto ACL file works unchanged (``mqtt_acl_file``).

Why: a fleet moved from Mosquitto brings its ``acl_file``; devices must get the
same rights: what they may publish, subscribe to and receive. The file below
uses every form Mosquitto documents (anonymous lines first, ``user`` sections,
``deny``, ``pattern`` with ``%c`` and ``%u``). paho clients for what devices
see; the door's raw client where the exact reason code matters.
"""

from __future__ import annotations

import pytest

from adapters.mqtt import codec as C
from mqtt_fixtures import Paho, RawClient, config_file

pytestmark = pytest.mark.timeout(120)

ACL = """\
# anonymous clients
topic read public/#

user alice
topic readwrite sensors/#
topic deny sensors/secret

user bob
topic read sensors/+/temp
topic write cmd/#

user carol
topic write sensors/#
topic write public/#

# every client
pattern readwrite devices/%c/#
pattern read inbox/%u
"""


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    from mqtt_fixtures import start_unimq

    d = tmp_path_factory.mktemp("acl")
    (d / "acl").write_text(ACL)
    cfg = config_file(d, f'mqtt_acl_file = "{d / "acl"}"\n'
                         '[mqtt_users]\nalice = "a"\nbob = "b"\ncarol = "c"\n')
    srv = start_unimq(tmp_path_factory, "--config", cfg)
    yield srv.ports["mqtt"]
    srv.stop()


def _raw(port: int, cid: str, user: str | None = None, v5: bool = True) -> RawClient:
    c = RawClient(port, C.MQTT_5 if v5 else C.MQTT_311)
    ack = c.connect(cid, username=user, password=user[0].encode() if user else None)
    assert ack.reason_code == 0
    return c


def _publish(c: RawClient, topic: str, pid: int) -> int:
    c.send(C.Publish(topic, b"x", 1, packet_id=pid))
    ack = c.recv_type(C.PubAck)
    assert ack.packet_id == pid
    # 0x10 (no matching subscribers) is a success too: the message was stored
    return 0 if ack.reason_code == C.RC_NO_MATCHING_SUBSCRIBERS else ack.reason_code


def _subscribe(c: RawClient, flt: str, pid: int) -> int:
    c.send(C.Subscribe(pid, [(flt, C.SubOptions(qos=1))]))
    return c.recv_type(C.Suback).reason_codes[0]


def test_publish_rights(port: int) -> None:
    alice = _raw(port, "alice-pub", "alice")
    assert _publish(alice, "sensors/k1/temp", 1) == 0
    assert _publish(alice, "sensors/secret", 2) == C.RC_NOT_AUTHORIZED  # deny wins over sensors/#
    assert _publish(alice, "cmd/reboot", 3) == C.RC_NOT_AUTHORIZED  # not granted at all
    assert _publish(alice, "devices/alice-pub/state", 4) == 0  # pattern %c
    assert _publish(alice, "devices/someone-else/state", 5) == C.RC_NOT_AUTHORIZED
    bob = _raw(port, "bob-pub", "bob")
    assert _publish(bob, "cmd/reboot", 1) == 0
    assert _publish(bob, "sensors/k1/temp", 2) == C.RC_NOT_AUTHORIZED  # read only
    watcher = Paho(port, "anon-watch")  # anonymous clients may read public/#
    watcher.subscribe("public/#", qos=1)
    anon = _raw(port, "anon-pub", v5=False)
    assert _publish(anon, "public/news", 1) == 0  # 3.1.1: acknowledged as Mosquitto does ...
    watcher.nothing(0.5)  # ... and dropped
    for c in (alice, bob, anon):
        c.close()
    watcher.disconnect()


def test_subscribe_rights(port: int) -> None:
    bob = _raw(port, "bob-sub", "bob")
    assert _subscribe(bob, "sensors/+/temp", 1) == 1
    assert _subscribe(bob, "sensors/k1/temp", 2) == 1  # covered by the + rule
    assert _subscribe(bob, "sensors/#", 3) == C.RC_NOT_AUTHORIZED  # reaches beyond sensors/+/temp
    assert _subscribe(bob, "#", 4) == C.RC_NOT_AUTHORIZED
    assert _subscribe(bob, "inbox/bob", 5) == 1  # pattern %u
    assert _subscribe(bob, "inbox/alice", 6) == C.RC_NOT_AUTHORIZED
    alice = _raw(port, "alice-sub", "alice", v5=False)
    assert _subscribe(alice, "sensors/secret", 1) == 0x80  # denied: 3.1.1 failure code
    assert _subscribe(alice, "sensors/#", 2) == 1
    bob.close()
    alice.close()


def test_deliveries_follow_read_rights(port: int) -> None:
    alice = Paho(port, "alice-recv", username="alice", password="a")
    alice.subscribe("sensors/#", qos=1)
    bob = Paho(port, "bob-recv", username="bob", password="b")
    bob.subscribe("sensors/+/temp", qos=1)
    anon = Paho(port, "anon-recv")
    anon.subscribe("public/#", qos=1)
    carol = Paho(port, "carol-pub", username="carol", password="c")
    for topic in ("sensors/secret", "sensors/k1/temp", "sensors/k1/humidity", "public/news"):
        carol.publish(topic, topic.encode(), qos=1)
    assert sorted(m.topic for m in alice.get_n(2)) == ["sensors/k1/humidity", "sensors/k1/temp"]
    alice.nothing(0.5)  # never sensors/secret
    assert [m.topic for m in bob.get_n(1)] == ["sensors/k1/temp"]
    bob.nothing(0.3)
    assert [m.topic for m in anon.get_n(1)] == ["public/news"]  # carol may write it; anonymous may read it
    anon.nothing(0.3)
    for c in (alice, bob, anon, carol):
        c.disconnect()
