"""adapters.mqtt.retained and adapters.mqtt.session_store: the door's durable state, through a real processor.

Each store writes through the processor's key-value store over a real store in a
temp dir; a second store object over the same processor stands for the door
after a restart.
"""

from __future__ import annotations

import asyncio

import pytest

from adapters.mqtt import codec as C
from adapters.mqtt.retained import RetainedStore
from adapters.mqtt.session import SESSION_NEVER_EXPIRES, Session, Subscription
from adapters.mqtt.session_store import SessionStore
from gateway.context import RequestContext
from mqtt_fixtures import processor  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)
CTX = RequestContext(protocol="mqtt", client_id="mqtt-door")


async def test_retained_messages_survive_and_an_empty_one_clears(processor) -> None:
    r = RetainedStore(processor, CTX)
    await r.retain(C.Publish("home/t", b"21", 1, True, properties={"content_type": "text/plain"}))
    await r.retain(C.Publish("home/h", b"40", 0, True))
    await r.retain(C.Publish("office/t", b"19", 1, True))
    await r.retain(C.Publish("home/h", b"", 0, True))  # cleared
    back = RetainedStore(processor, CTX)
    await back.load()
    assert len(back) == 2
    got = dict(back.matching("home/#"))
    assert list(got) == ["home/t"] and got["home/t"].payload == b"21" and got["home/t"].qos == 1
    assert got["home/t"].v5props() == {"content_type": "text/plain"}


async def test_expired_retained_message_is_not_given(processor) -> None:
    r = RetainedStore(processor, CTX)
    await r.retain(C.Publish("x/y", b"soon gone", 1, True, properties={"message_expiry_interval": 0}))
    await asyncio.sleep(0.01)
    assert list(r.matching("x/#")) == [] and len(r) == 0


async def test_persistent_session_round_trip(processor) -> None:
    store = SessionStore(processor, CTX)
    s = Session("dev-1", C.MQTT_5, 3600)
    s.qos2_in = {3, 9}
    s.pubrel = {5}
    s.username = "alice"
    sub = Subscription("cmd/dev-1/#", 1, s, sub_id=4, lmq="%LMQ%mqtt/dev-1/1")
    s.subs[sub.key()] = sub
    shared = Subscription("jobs/#", 1, s, group="workers")
    s.subs[shared.key()] = shared
    s.lmq_seq = 1
    store.sessions[s.client_id] = s
    await store.save(s)
    back = SessionStore(processor, CTX)
    [(t, lanes)] = await back.load()
    assert back.sessions == {"dev-1": t}
    assert (t.version, t.expiry, t.lmq_seq, t.username) == (C.MQTT_5, 3600, 1, "alice")
    assert t.qos2_in == {3, 9} and t.pubrel == {5} and t.ctx.client_id == "dev-1"
    assert t.ctx.principal == "alice"  # its topic rights while away are its user's
    assert set(t.subs) == {"cmd/dev-1/#", "$share/workers/jobs/#"}
    assert t.subs["cmd/dev-1/#"].lmq == "%LMQ%mqtt/dev-1/1" and t.subs["cmd/dev-1/#"].sub_id == 4
    assert t.subs["$share/workers/jobs/#"].group == "workers" and lanes == {}
    await back.delete("dev-1")
    assert await SessionStore(processor, CTX).load() == []


def test_a_session_record_is_what_json_dumps_gives() -> None:
    """Session.to_json writes its record by hand: byte for byte json.dumps' output, for a bare
    session (the CONNECT storm's) and one with every field set (non-ASCII and quotes included)."""
    import json

    from gateway.lmq_reader import WindowedLane

    def dumps(s: Session) -> bytes:
        return json.dumps({"v": s.version, "e": s.expiry, "n": s.lmq_seq, "d": s.disconnected_at,
                           "s": [x.to_json() for x in s.subs.values()], "q": sorted(s.qos2_in),
                           "r": sorted(s.pubrel), "l": s.lanes(), "u": s.username, "o": s.owner, "g": s.epoch,
                           "h": s.handed}, separators=(",", ":")).encode()

    bare = Session("storm-1", C.MQTT_311, SESSION_NEVER_EXPIRES)
    bare.disconnected_at = 1_795_000_000_000
    full = Session('dév "1"', C.MQTT_5, 3600)
    full.disconnected_at, full.lmq_seq, full.epoch, full.handed = 1_795_000_000_001, 7, 3, 2
    full.username, full.owner = "zoë\\x", "gw-\u2603"
    full.qos2_in, full.pubrel = {9, 3}, {5}
    sub = Subscription("cmd/+/#", 1, full, sub_id=4, lmq="%LMQ%mqtt/x/1", no_local=True)
    full.subs[sub.key()] = sub
    shared = Subscription("jobs/#", 2, full, group="w")
    full.subs[shared.key()] = shared
    full.new_cursor(("%LMQ%mqtt/x/1", "broker-a"), WindowedLane("broker-a"))  # type: ignore[arg-type]
    for s in (bare, full):
        assert s.to_json() == dumps(s)
        assert Session.from_json(s.client_id, s.to_json())[0].epoch == s.epoch


async def test_a_clean_session_is_never_written_and_a_bad_record_is_skipped(processor) -> None:
    store = SessionStore(processor, CTX)
    s = Session("clean", C.MQTT_311, 0)
    store.sessions["clean"] = s
    await store.save(s)
    await processor.kv_put(CTX, "mqtt.sessions", "broken", b"{not json")
    assert await SessionStore(processor, CTX).load() == []


async def test_expiry_fires_after_the_interval_offline() -> None:
    s = Session("gone", C.MQTT_5, 0)
    s.expiry = 1
    s.disconnected_at = 1  # long ago: due at once
    fired = asyncio.Event()
    SessionStore.arm_expiry(s, lambda x: fired.set())
    await asyncio.wait_for(fired.wait(), 5)
    never = Session("kept", C.MQTT_311, SESSION_NEVER_EXPIRES)
    SessionStore.arm_expiry(never, lambda x: None)
    assert never.expiry_handle is None
