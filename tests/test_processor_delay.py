"""MessagingProcessor: delay / timer messages -- visible at their delivery time (within
about a second), not before; kept across a restart before their time; stored once.

Timing: a consumer long-polls from right after the send, and the test asserts
that whenever the message arrived it was not before its time (less
EARLY_SLACK_MS); the wait for it is many seconds long, and no test asserts how
quickly anything happened.
"""

from __future__ import annotations

import asyncio

import pytest

from core_broker.model import MessageType

from processor_fixtures import (  # noqa: F401  (processor, processor_options are fixtures)
    CTX,
    EARLY_SLACK_MS,
    bodies,
    msg,
    now_ms,
    pop_nothing,
    pop_until,
    processor,
    processor_options,
)

DELAY_MS = 1500


async def delay_topic(processor, name: str = "d", queues: int = 2) -> None:
    await processor.create_topic(CTX, name, queues=queues, message_type=MessageType.DELAY)


async def test_delay_message_becomes_visible_at_its_time_and_not_before(processor):
    await delay_topic(processor)
    at = now_ms() + DELAY_MS
    [r] = await processor.send(CTX, [msg("d", "later", tag="T", keys=["k-late"], delivery_time_ms=at)])
    assert r.topic == "d" and r.message_id
    # long-poll from right after the send: whenever it shows up, it is not before its time
    [p] = await pop_until(processor, "g", "d", 1, timeout=15)
    assert now_ms() >= at - EARLY_SLACK_MS
    m = p.message
    assert (m.topic, m.body, m.tag, m.message_id) == ("d", b"later", "T", r.message_id)
    assert m.properties == {}  # the broker's timer bookkeeping is not shown
    assert p.delivery_attempt == 1
    await processor.ack(CTX, "g", "d", p.receipt_handle)
    await pop_nothing(processor, "g", "d", wait_ms=200)


async def test_delay_messages_fire_in_time_order_each_not_before_its_time(processor):
    await delay_topic(processor, queues=1)
    base = now_ms()
    times = {"third": base + 1500, "first": base + 500, "second": base + 1000}
    for body, at in times.items():
        await processor.send(CTX, [msg("d", body, delivery_time_ms=at)])
    got = []
    while len(got) < 3:
        for p in await pop_until(processor, "g", "d", 1, timeout=15):
            assert now_ms() >= times[p.message.body.decode()] - EARLY_SLACK_MS
            got.append(p.message.body)
    assert got == [b"first", b"second", b"third"]


async def test_a_normal_topic_takes_delay_messages(processor):
    await processor.send(CTX, [msg("plain", "now"), msg("plain", "soon", delivery_time_ms=now_ms() + 800)])
    [p] = await pop_until(processor, "g", "plain", 1)
    assert p.message.body == b"now"
    [p] = await pop_until(processor, "g", "plain", 1, timeout=15)
    assert p.message.body == b"soon"


async def test_delivery_time_in_the_past_is_delivered_at_once(processor):
    await delay_topic(processor)
    await processor.send(CTX, [msg("d", "past", delivery_time_ms=now_ms() - 60_000)])
    [p] = await pop_until(processor, "g", "d", 1)
    assert p.message.body == b"past"


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_delay_message_survives_a_restart_before_its_time(processor, hard):
    await delay_topic(processor)
    at = now_ms() + DELAY_MS
    [r] = await processor.send(CTX, [msg("d", "survivor", delivery_time_ms=at)])
    await processor.restart(hard=hard)
    [p] = await pop_until(processor, "g", "d", 1, timeout=15)
    assert now_ms() >= at - EARLY_SLACK_MS
    assert p.message.body == b"survivor" and p.message.message_id == r.message_id


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_delay_message_is_stored_once_and_fires_once(processor, hard):
    await delay_topic(processor, queues=1)
    at = now_ms() + 800
    [r] = await processor.send(CTX, [msg("d", "once", keys=["k-once"], delivery_time_ms=at)])
    # before its time: known to queries under its own topic, in no queue yet
    m = await processor.query_message_by_id(CTX, r.message_id)
    assert m is not None and m.topic == "d" and m.body == b"once"
    queued = (await processor.describe_topic(CTX, "d")).queues[0].max_offset
    assert queued == 0 or now_ms() >= at - EARLY_SLACK_MS
    [p] = await pop_until(processor, "g", "d", 1, timeout=15)
    await processor.ack(CTX, "g", "d", p.receipt_handle)
    # fired: one entry in the topic's queue, still the one stored message
    assert (await processor.describe_topic(CTX, "d")).queues[0].max_offset == 1
    m = await processor.query_message_by_id(CTX, r.message_id)
    assert m is not None and m.body == b"once"
    found = await processor.query_messages_by_key(CTX, "d", "k-once")
    assert [x.message_id for x in found] == [r.message_id]
    # a restart does not fire it again
    await processor.restart(hard=hard)
    await asyncio.sleep(0.3)
    assert (await processor.describe_topic(CTX, "d")).queues[0].max_offset == 1
    await pop_nothing(processor, "g", "d", wait_ms=200)
    assert bodies(await pop_until(processor, "other", "d", 1)) == [b"once"]


async def test_many_delay_messages_all_arrive_once(processor):
    await delay_topic(processor, queues=4)
    base = now_ms()
    await processor.send(
        CTX, [msg("d", f"m{i}", delivery_time_ms=base + 300 + (i % 10) * 50) for i in range(200)]
    )
    got = await pop_until(processor, "g", "d", 200, ack=True, timeout=20)
    assert sorted(bodies(got)) == sorted(f"m{i}".encode() for i in range(200))
    await pop_nothing(processor, "g", "d", wait_ms=200)


async def test_delay_message_of_a_deleted_topic_is_not_delivered_to_its_successor(processor):
    await delay_topic(processor, queues=1)
    at = now_ms() + 600
    await processor.send(CTX, [msg("d", "orphan", delivery_time_ms=at)])
    await processor.delete_topic(CTX, "d")
    while now_ms() < at + 500:  # its time passes while the topic is gone
        await asyncio.sleep(0.1)
    await delay_topic(processor, queues=1)
    await pop_nothing(processor, "g", "d", wait_ms=200)
    await processor.send(CTX, [msg("d", "fresh")])
    assert bodies(await pop_until(processor, "g", "d", 1)) == [b"fresh"]
