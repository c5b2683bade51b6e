"""The brokers' door-state feed (core_broker/door_feed.py) on a real broker's door state.

A gateway long-polls the feed for what other gateways wrote; what it wrote itself (batched
session records say who wrote them) is not sent back to it, and does not end its long poll,
but a later write of the same key by another gateway is sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.context import RequestContext
from mqtt_fixtures import processor  # noqa: F401 - the fixture

NS = "mqtt.sessions"
CTX = RequestContext(protocol="test", client_id="feed", trusted=True)


async def _watch(processor: Any, gateway: str, inc: str, seq: int, timeout_s: float) -> dict[str, Any]:  # noqa: F811
    feed = processor.door_feed()
    (broker,) = await feed.door_brokers()
    return await feed.door_watch(broker, gateway, [NS], inc, seq, timeout_s)


async def test_a_gateway_is_not_sent_its_own_writes_but_others_are(processor: Any) -> None:  # noqa: F811
    first = await _watch(processor, "gw-a", "", 0, 0.0)  # a full read: the cursor
    inc, seq = first["inc"], first["seq"]
    await processor.kv_put_many(CTX, NS, {"mine-1": b"1", "mine-2": b"2"}, "gw-a")
    # only its own writes happened: the long poll runs to its end and brings nothing
    r = await _watch(processor, "gw-a", inc, seq, 0.3)
    assert r["kv"] == {} and r["seq"] > seq
    # another gateway sees them
    r_b = await _watch(processor, "gw-b", inc, seq, 0.0)
    assert set(r_b["kv"][NS]) == {"mine-1", "mine-2"}
    # a write by another gateway ends gw-a's long poll at once and is sent, own ones are not
    seq = r["seq"]
    poll = asyncio.ensure_future(_watch(processor, "gw-a", inc, seq, 20.0))
    await asyncio.sleep(0.1)
    await processor.kv_put_many(CTX, NS, {"mine-3": b"3"}, "gw-a")
    await asyncio.sleep(0.1)
    assert not poll.done()
    await processor.kv_put_many(CTX, NS, {"mine-1": b"taken"}, "gw-b")
    r = await asyncio.wait_for(poll, 5)
    assert {k: v[1] for k, v in r["kv"][NS].items()} == {"mine-1": b"taken"}
    # a write without a writer (a single kv_put) goes to everyone, the gateway that wrote it too
    await processor.kv_put(CTX, NS, "mine-2", b"plain")
    r = await _watch(processor, "gw-a", inc, r["seq"], 1.0)
    assert set(r["kv"][NS]) == {"mine-2"}
    # a full read (another incarnation) brings everything, own writes included
    r = await _watch(processor, "gw-a", "another", 0, 0.0)
    assert r["full"] and {"mine-1", "mine-2", "mine-3"} <= set(r["kv"][NS])
