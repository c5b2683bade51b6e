"""MessagingProcessor: FIFO topics -- messages of one message group are delivered to a
group strictly in order, the next one only after the previous one was acked or
dead-lettered; different message groups proceed in parallel.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from core_broker.model import MessageType

from processor_fixtures import (  # noqa: F401  (processor, processor_options are fixtures)
    CTX,
    bodies,
    msg,
    pop_nothing,
    pop_until,
    processor,
    processor_options,
    wait_for_topic,
)


async def fifo_topic(processor, name: str = "f", queues: int = 4) -> None:
    await processor.create_topic(CTX, name, queues=queues, message_type=MessageType.FIFO)


async def send_groups(processor, topic: str, groups: dict[str, int]) -> None:
    """Interleave the groups: a0 b0 c0 a1 b1 c1 ... (bodies are '<group>-<seq>')."""
    batch = []
    for i in range(max(groups.values())):
        for g, n in groups.items():
            if i < n:
                batch.append(msg(topic, f"{g}-{i}", message_group=g))
    for k in range(0, len(batch), 100):
        await processor.send(CTX, batch[k : k + 100])


def by_body(popped, body: str):
    return next(p for p in popped if p.message.body == body.encode())


async def test_same_group_is_strictly_ordered_and_waits_for_the_ack(processor):
    await fifo_topic(processor)
    await send_groups(processor, "f", {"A": 3, "B": 2})
    first = await pop_until(processor, "g", "f", 2)
    assert sorted(bodies(first)) == [b"A-0", b"B-0"]
    # A-1 and B-1 wait behind their unacked predecessors
    await pop_nothing(processor, "g", "f", wait_ms=200)
    await processor.ack(CTX, "g", "f", by_body(first, "A-0").receipt_handle)
    [a1] = await pop_until(processor, "g", "f", 1)
    assert a1.message.body == b"A-1" and a1.delivery_attempt == 1
    await pop_nothing(processor, "g", "f", wait_ms=200)
    await processor.ack(CTX, "g", "f", by_body(first, "B-0").receipt_handle)
    await processor.ack(CTX, "g", "f", a1.receipt_handle)
    rest = await pop_until(processor, "g", "f", 2)
    assert sorted(bodies(rest)) == [b"A-2", b"B-1"]


async def test_a_message_group_never_shows_two_messages_at_once(processor):
    await fifo_topic(processor, queues=1)
    await send_groups(processor, "f", {"A": 5})
    got = await processor.pop(CTX, "g", "f", 32, 30_000)
    assert bodies(got) == [b"A-0"]


async def test_unacked_message_is_redelivered_in_place_before_its_successor(processor):
    await fifo_topic(processor)
    await send_groups(processor, "f", {"A": 3})
    [p] = await pop_until(processor, "g", "f", 1, invisible_ms=150)
    assert p.message.body == b"A-0"
    [again] = await pop_until(processor, "g", "f", 1, invisible_ms=30_000)
    assert again.message.body == b"A-0" and again.delivery_attempt == 2
    assert again.message.message_id == p.message.message_id
    await pop_nothing(processor, "g", "f", wait_ms=200)
    await processor.ack(CTX, "g", "f", again.receipt_handle)
    [nxt] = await pop_until(processor, "g", "f", 1)
    assert nxt.message.body == b"A-1"


async def test_change_invisible_to_zero_redelivers_the_same_message(processor):
    await fifo_topic(processor)
    await send_groups(processor, "f", {"A": 2})
    [p] = await pop_until(processor, "g", "f", 1)
    await processor.change_invisible(CTX, "g", "f", p.receipt_handle, 0)
    [again] = await pop_until(processor, "g", "f", 1)
    assert again.message.body == b"A-0" and again.delivery_attempt == 2


async def test_other_groups_proceed_while_one_is_stuck(processor):
    await fifo_topic(processor, queues=1)  # one queue: the groups share it
    await send_groups(processor, "f", {"A": 3, "B": 3, "C": 3})
    first = await pop_until(processor, "g", "f", 3)
    assert sorted(bodies(first)) == [b"A-0", b"B-0", b"C-0"]
    # A-0 stays in flight; B and C go on, one at a time each
    b, c = by_body(first, "B-0"), by_body(first, "C-0")
    for i in (1, 2):
        await processor.ack(CTX, "g", "f", b.receipt_handle)
        await processor.ack(CTX, "g", "f", c.receipt_handle)
        nxt = await pop_until(processor, "g", "f", 2)
        assert sorted(bodies(nxt)) == [f"B-{i}".encode(), f"C-{i}".encode()]
        b, c = by_body(nxt, f"B-{i}"), by_body(nxt, f"C-{i}")
    await pop_nothing(processor, "g", "f", wait_ms=200)  # A-1 still waits for A-0
    await processor.ack(CTX, "g", "f", by_body(first, "A-0").receipt_handle)
    [a1] = await pop_until(processor, "g", "f", 1)
    assert a1.message.body == b"A-1"


@pytest.mark.parametrize("processor_options", [{"broker": {"max_delivery_attempts": 3}}], ids=["max3"])
async def test_dead_lettering_unblocks_the_group(processor):
    await fifo_topic(processor)
    await send_groups(processor, "f", {"A": 2})
    attempts = []
    while len(attempts) < 3:
        [p] = await pop_until(processor, "g", "f", 1, invisible_ms=100)
        assert p.message.body == b"A-0"
        attempts.append(p.delivery_attempt)
    assert attempts == [1, 2, 3]
    [nxt] = await pop_until(processor, "g", "f", 1)
    assert nxt.message.body == b"A-1"
    await wait_for_topic(processor, "%DLQ%g")
    [d] = await pop_until(processor, "dlq", "%DLQ%g", 1)
    assert d.message.body == b"A-0"


async def test_forward_to_dlq_unblocks_the_group_at_once(processor):
    await fifo_topic(processor)
    await send_groups(processor, "f", {"A": 2})
    [p] = await pop_until(processor, "g", "f", 1)
    await processor.forward_to_dlq(CTX, "g", "f", p.receipt_handle)
    [nxt] = await pop_until(processor, "g", "f", 1)
    assert nxt.message.body == b"A-1"
    [d] = await pop_until(processor, "dlq", "%DLQ%g", 1)
    assert d.message.body == b"A-0"


async def test_each_consumer_group_gets_its_own_order(processor):
    await fifo_topic(processor)
    await send_groups(processor, "f", {"A": 4, "B": 4})
    [g1_first] = [p for p in await pop_until(processor, "g1", "f", 2) if p.message.body == b"A-0"]
    # g1 holding A-0 does not hold anything back for g2
    seen = await pop_until(processor, "g2", "f", 8, ack=True)
    order = [b for b in bodies(seen) if b.startswith(b"A")]
    assert order == [b"A-0", b"A-1", b"A-2", b"A-3"]
    await processor.ack(CTX, "g1", "f", g1_first.receipt_handle)


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_fifo_state_survives_a_restart(processor, hard):
    await fifo_topic(processor, queues=2)
    await send_groups(processor, "f", {"A": 3, "B": 3})
    first = await pop_until(processor, "g", "f", 2, invisible_ms=1000)
    await processor.ack(CTX, "g", "f", by_body(first, "B-0").receipt_handle)
    await processor.restart(hard=hard)
    # B-1 goes on; A-1 must not overtake A-0, which comes back first after its invisible time
    got = await pop_until(processor, "g", "f", 2, invisible_ms=30_000, timeout=15)
    assert sorted(bodies(got)) == [b"A-0", b"B-1"]
    assert by_body(got, "A-0").delivery_attempt == 2
    await processor.ack(CTX, "g", "f", by_body(got, "A-0").receipt_handle)
    [a1] = await pop_until(processor, "g", "f", 1)
    assert a1.message.body == b"A-1"


async def test_concurrent_consumers_keep_every_group_in_order(processor):
    await fifo_topic(processor, queues=4)
    groups = {f"grp{i}": 25 for i in range(20)}
    await send_groups(processor, "f", groups)
    total = sum(groups.values())
    delivered: dict[str, list[int]] = {g: [] for g in groups}
    in_flight: set[str] = set()
    count = 0
    done = asyncio.Event()
    rng = random.Random(7)

    async def consumer() -> None:
        nonlocal count
        while not done.is_set():
            batch = await processor.pop(CTX, "g", "f", 8, 30_000, wait_ms=200)
            for p in batch:
                g, seq = p.message.body.decode().split("-")
                assert g not in in_flight, f"two messages of {g} in flight at once"
                in_flight.add(g)
                delivered[g].append(int(seq))
            for p in batch:
                await asyncio.sleep(rng.random() / 1000)
                g = p.message.body.decode().split("-")[0]
                in_flight.discard(g)
                await processor.ack(CTX, "g", "f", p.receipt_handle)
                count += 1
            if count >= total:
                done.set()

    await asyncio.wait_for(asyncio.gather(*(consumer() for _ in range(4))), 60)
    assert all(seqs == list(range(25)) for seqs in delivered.values()), delivered
