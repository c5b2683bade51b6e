"""Small parts of the MQTT door, imported directly: mapping, access control, credentials, wills."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import pytest

from adapters.mqtt import codec as C
from adapters.mqtt.acl import AccessControl
from adapters.mqtt.mapping import message_properties, now_ms, outgoing_from_stored, v5_props_of
from adapters.mqtt.passwords import Credentials
from adapters.mqtt.session import SESSION_NEVER_EXPIRES, Session
from adapters.mqtt.wills import Wills
from gateway.context import RequestContext
from gateway.topic_acl import READ, WRITE, AclRules, TopicAclAuthorizer
from mqtt_fixtures import in_process_processor

pytestmark = pytest.mark.timeout(30)


def test_publish_properties_round_trip():
    v5 = {"user_property": [("a", "1")], "content_type": "application/json", "response_topic": "r/t",
          "correlation_data": b"\x00c", "payload_format_indicator": 1, "message_expiry_interval": 60}
    props = message_properties("a/b", 2, True, v5)
    assert props["mqtt_topic"] == "a/b" and props["mqtt_qos"] == "2" and props["mqtt_retain"] == "1"
    assert props["a"] == "1" and int(props["mqtt_expiry_at"]) > now_ms()
    back = v5_props_of(props)
    assert back == {"user_property": [("a", "1")], "content_type": "application/json", "response_topic": "r/t",
                    "correlation_data": b"\x00c", "payload_format_indicator": 1}
    out = outgoing_from_stored(props, b"x", "fallback")
    assert (out.topic, out.qos, out.retain, out.tb) == ("a/b", 2, True, b"a/b") and out.expiry_at
    assert outgoing_from_stored({}, b"x", "fallback").qos == 1  # another door's message: QoS 1


def test_access_control_not_enforced_allows_everything_and_asks_nothing():
    ac = AccessControl(None, enforced=False)  # type: ignore[arg-type] - never asked
    s = Session("c")
    assert ac.can_read(s, "x") and ac.can_write(s, "x") and ac.can_subscribe(s, "#") and not s.acl_write


async def test_access_control_asks_the_processor_as_the_login(tmp_path):
    acl = AclRules()
    acl.users["alice"] = [(READ | WRITE, "alice/#"), (READ, "news/#")]
    acl.patterns.append((READ, "dev/%c/#"))
    p = await in_process_processor(tmp_path)
    p.set_authorizer(TopicAclAuthorizer(acl))
    try:
        ac = AccessControl(p, enforced=True)
        s = Session("c1")
        s.ctx = RequestContext(protocol="mqtt", client_id="c1")
        assert not ac.can_write(s, "alice/x")  # anonymous: no rule
        assert ac.login(s, "alice") and not ac.login(s, "alice") and s.acl_write == {}
        s.ctx = RequestContext(protocol="mqtt", client_id="c1", principal="alice")
        assert ac.can_write(s, "alice/x") and s.acl_write == {"alice/x": True}
        assert not ac.can_write(s, "news/x") and ac.can_read(s, "news/x") and ac.can_read(s, "dev/c1/y")
        assert ac.can_subscribe(s, "news/+") and not ac.can_subscribe(s, "#")
    finally:
        await p.stop()


def test_credentials_plain_and_mosquitto_hashes():
    salt = b"0123456789abcdef"
    digest = hashlib.pbkdf2_hmac("sha512", b"s3cret", salt, 101, dklen=64)
    entry = f"$7$101${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    creds = Credentials({"bob": "pw"})
    creds.hashed["carol"] = entry
    assert creds.configured
    assert creds.check("bob", b"pw") and not creds.check("bob", b"no") and not creds.check("bob", None)
    assert creds.check("carol", b"s3cret") and not creds.check("carol", b"pw") and not creds.check("dave", b"pw")
    assert not Credentials({}).configured


async def test_wills_at_once_after_a_delay_and_cancelled():
    published: list[tuple[str, str, bytes]] = []
    done = asyncio.Event()

    async def publish(ctx, cid, items):
        published.extend((cid, it.topic, it.payload) for it in items)
        done.set()

    wills = Wills(lambda coro: asyncio.get_running_loop().create_task(coro), publish)
    s = Session("w1", C.MQTT_5, SESSION_NEVER_EXPIRES)
    wills.gone(s, C.Will("w/now", b"bye", 1, False), True)
    await asyncio.wait_for(done.wait(), 5)
    assert published == [("w1", "w/now", b"bye")]
    done.clear()
    wills.gone(s, C.Will("w/later", b"late", 1, False, {"will_delay_interval": 1}), True)
    assert s.will_handle is not None and published == [("w1", "w/now", b"bye")]
    await asyncio.wait_for(done.wait(), 5)
    assert published[-1] == ("w1", "w/later", b"late") and s.will_handle is None
    wills.gone(s, C.Will("w/never", b"x", 1, False, {"will_delay_interval": 1}), True)
    Wills.cancel(s)  # the client came back within the delay
    await asyncio.sleep(1.5)
    assert [p[1] for p in published] == ["w/now", "w/later"]
