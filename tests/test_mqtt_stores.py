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
