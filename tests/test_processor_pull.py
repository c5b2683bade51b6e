"""MessagingProcessor: pull consumption by queue offset with committed offsets per
group and queue (queue-level load balancing: what Spark and ordered consumers use),
and the offset queries (begin / end / timestamp).
"""

from __future__ import annotations

import asyncio

import pytest

from core_broker.errors import BadRequestError, TopicNotFoundError
from core_broker.model import GetStatus

from processor_fixtures import (  # noqa: F401  (processor, processor_options are fixtures)
    CTX,
    eventually,
    msg,
    now_ms,
    pop_until,
    processor,
    processor_options,
    send_bodies,
)


async def one_queue_topic(processor, topic: str, n: int) -> list:
    await processor.create_topic(CTX, topic, queues=1)
    return await send_bodies(processor, topic, [f"m{i}" for i in range(n)])


async def test_pull_reads_a_queue_by_offset(processor):
    sent = await one_queue_topic(processor, "t", 10)
    r = await processor.pull(CTX, "t", 0, 0, 4)
    assert r.status == GetStatus.FOUND
    assert [m.body for m in r.messages] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.queue_offset for m in r.messages] == [0, 1, 2, 3]
    assert [m.message_id for m in r.messages] == [s.message_id for s in sent[:4]]
    assert (r.next_offset, r.min_offset, r.max_offset) == (4, 0, 10)
    r = await processor.pull(CTX, "t", 0, r.next_offset, 100)
    assert [m.body for m in r.messages] == [f"m{i}".encode() for i in range(4, 10)]
    assert r.next_offset == 10
    r = await processor.pull(CTX, "t", 0, 10, 100)
    assert r.status == GetStatus.OFFSET_OVERFLOW_ONE and r.messages == [] and r.next_offset == 10
    r = await processor.pull(CTX, "t", 0, 15, 100)
    assert r.status == GetStatus.OFFSET_OVERFLOW_BADLY and r.messages == [] and r.next_offset == 10
    # pulling is reading: the same range again gives the same messages
    again = await processor.pull(CTX, "t", 0, 2, 3)
    assert [m.body for m in again.messages] == [b"m2", b"m3", b"m4"]


async def test_pull_each_queue_of_a_topic(processor):
    await processor.create_topic(CTX, "t", queues=4)
    sent = await send_bodies(processor, "t", [f"m{i}" for i in range(40)])
    seen = {}
    for q in range(4):
        r = await processor.pull(CTX, "t", q, 0, 100)
        assert all(m.queue_id == q and m.topic == "t" for m in r.messages)
        seen.update({m.message_id: m.body for m in r.messages})
    assert seen == {s.message_id: f"m{i}".encode() for i, s in enumerate(sent)}


async def test_pull_argument_errors(processor):
    await one_queue_topic(processor, "t", 1)
    with pytest.raises(BadRequestError):
        await processor.pull(CTX, "t", 1, 0, 10)
    with pytest.raises(BadRequestError):
        await processor.pull(CTX, "t", -1, 0, 10)
    with pytest.raises(BadRequestError):
        await processor.pull(CTX, "t", 0, 0, 0)
    with pytest.raises(TopicNotFoundError):
        await processor.pull(CTX, "missing", 0, 0, 10)


async def test_pull_long_polls_for_the_next_message(processor):
    await one_queue_topic(processor, "t", 2)
    waiting = asyncio.create_task(processor.pull(CTX, "t", 0, 2, 10, wait_ms=5000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await processor.send(CTX, [msg("t", "wake")])
    r = await asyncio.wait_for(waiting, 10)
    assert [m.body for m in r.messages] == [b"wake"] and r.next_offset == 3


async def test_committed_offsets_are_per_group_and_queue(processor):
    await processor.create_topic(CTX, "t", queues=2)
    await send_bodies(processor, "t", [f"m{i}" for i in range(10)])
    assert await processor.get_offset(CTX, "g1", "t", 0) is None
    await processor.commit_offset(CTX, "g1", "t", 0, 3)
    await processor.commit_offset(CTX, "g1", "t", 1, 5)
    await processor.commit_offset(CTX, "g2", "t", 0, 1)
    assert await processor.get_offset(CTX, "g1", "t", 0) == 3
    assert await processor.get_offset(CTX, "g1", "t", 1) == 5
    assert await processor.get_offset(CTX, "g2", "t", 0) == 1
    assert await processor.get_offset(CTX, "g2", "t", 1) is None
    await processor.commit_offset(CTX, "g1", "t", 0, 4)  # moves forward
    await processor.commit_offset(CTX, "g2", "t", 0, 0)  # and back (a reset)
    assert await processor.get_offset(CTX, "g1", "t", 0) == 4
    assert await processor.get_offset(CTX, "g2", "t", 0) == 0
    with pytest.raises(BadRequestError):
        await processor.commit_offset(CTX, "g1", "t", 0, -1)
    with pytest.raises(BadRequestError):
        await processor.commit_offset(CTX, "g1", "t", 7, 1)
    with pytest.raises(TopicNotFoundError):
        await processor.commit_offset(CTX, "g1", "missing", 0, 1)


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_committed_offsets_survive_a_restart(processor, hard):
    await processor.create_topic(CTX, "t", queues=2)
    await processor.commit_offset(CTX, "g", "t", 0, 7)
    await processor.commit_offset(CTX, "g", "t", 1, 2)
    await processor.restart(hard=hard)
    assert await processor.get_offset(CTX, "g", "t", 0) == 7
    assert await processor.get_offset(CTX, "g", "t", 1) == 2


async def test_pull_consumer_resumes_from_its_committed_offset_after_a_restart(processor):
    await processor.create_topic(CTX, "t", queues=3)
    await send_bodies(processor, "t", [f"m{i}" for i in range(60)])

    async def consume(limit_per_queue: int) -> list[bytes]:
        out = []
        for q in range(3):
            start = await processor.get_offset(CTX, "spark", "t", q)
            if start is None:
                start = await processor.query_offset(CTX, "t", q, "begin")
            r = await processor.pull(CTX, "t", q, start, limit_per_queue)
            out += [m.body for m in r.messages]
            await processor.commit_offset(CTX, "spark", "t", q, r.next_offset)
        return out

    first = await consume(7)
    await processor.restart()
    rest = []
    while True:
        got = await consume(100)
        if not got:
            break
        rest += got
    assert len(first) == 21
    assert sorted(first + rest) == sorted(f"m{i}".encode() for i in range(60))


async def test_query_offset_begin_end_and_timestamp(processor):
    await processor.create_topic(CTX, "t", queues=1)
    assert await processor.query_offset(CTX, "t", 0, "begin") == 0
    assert await processor.query_offset(CTX, "t", 0, "end") == 0
    await send_bodies(processor, "t", [f"a{i}" for i in range(5)])
    await asyncio.sleep(0.05)
    boundary = now_ms()
    await asyncio.sleep(0.05)
    await send_bodies(processor, "t", [f"b{i}" for i in range(5)])
    assert await processor.query_offset(CTX, "t", 0, "begin") == 0
    assert await processor.query_offset(CTX, "t", 0, "end") == 10
    assert await processor.query_offset(CTX, "t", 0, "timestamp", boundary) == 5
    assert await processor.query_offset(CTX, "t", 0, "timestamp", 0) == 0
    assert await processor.query_offset(CTX, "t", 0, "timestamp", now_ms() + 60_000) == 10
    r = await processor.pull(CTX, "t", 0, await processor.query_offset(CTX, "t", 0, "timestamp", boundary), 1)
    assert r.messages[0].body == b"b0"
    with pytest.raises(BadRequestError):
        await processor.query_offset(CTX, "t", 0, "sideways")
    with pytest.raises(BadRequestError):
        await processor.query_offset(CTX, "t", 3, "end")
    assert await processor.query_offset(CTX, "t", 0, "end") == (await processor.describe_topic(CTX, "t")).queues[0].max_offset


async def test_pull_and_pop_do_not_disturb_each_other(processor):
    await one_queue_topic(processor, "t", 5)
    popped = await pop_until(processor, "g", "t", 5)  # in flight, not acked
    r = await processor.pull(CTX, "t", 0, 0, 10)
    assert [m.body for m in r.messages] == [f"m{i}".encode() for i in range(5)]
    assert sorted(p.message.body for p in popped) == [m.body for m in r.messages]


async def test_a_pop_groups_progress_shows_as_its_committed_offset(processor):
    await one_queue_topic(processor, "t", 10)
    await pop_until(processor, "g", "t", 10, ack=True)

    async def committed() -> bool:
        return await processor.get_offset(CTX, "g", "t", 0) == 10

    await eventually(committed, what="pop group's offset reaches 10")
