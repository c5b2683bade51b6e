"""MessagingProcessor under concurrency: 8 pop consumers (asyncio tasks) of one group
over 10,000 messages receive each message exactly once when all ack; with two
groups, each group receives all 10,000.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from processor_fixtures import (  # noqa: F401  (processor, processor_options are fixtures)
    CTX,
    pop_nothing,
    processor,
    processor_options,
    send_bodies,
)

N = 10_000
CONSUMERS = 8


async def consume_all(processor, group: str, topic: str, total: int, consumers: int) -> list[list[bytes]]:
    """Run ``consumers`` tasks popping and acking until ``total`` messages came in.

    Invisible time is far longer than the test, so a message could only be seen
    twice if the broker handed it out twice -- never through a redelivery. Each
    consumer yields between messages (its "processing"), so pops and acks of all
    consumers interleave even when the broker answers without suspending.
    """
    received: list[list[bytes]] = [[] for _ in range(consumers)]
    count = 0
    done = asyncio.Event()

    async def consumer(i: int) -> None:
        nonlocal count
        while not done.is_set():
            batch = await processor.pop(CTX, group, topic, 32, 300_000, wait_ms=200)
            for p in batch:
                assert p.delivery_attempt == 1
                received[i].append(p.message.body)
                await asyncio.sleep(0)  # "process" it: let the other consumers run
                await processor.ack(CTX, group, topic, p.receipt_handle)
            count += len(batch)
            if count >= total:
                done.set()

    await asyncio.wait_for(asyncio.gather(*(consumer(i) for i in range(consumers))), 60)
    return received


async def test_eight_consumers_of_one_group_receive_each_message_exactly_once(processor):
    await processor.create_topic(CTX, "load", queues=8)
    sent = await send_bodies(processor, "load", (f"m{i}" for i in range(N)), batch=500)
    assert len(sent) == N
    received = await consume_all(processor, "g", "load", N, CONSUMERS)
    everything = [b for r in received for b in r]
    dupes = [b for b, n in Counter(everything).items() if n > 1]
    assert not dupes, f"{len(dupes)} messages delivered twice, e.g. {dupes[:5]}"
    assert len(everything) == N
    assert set(everything) == {f"m{i}".encode() for i in range(N)}
    assert sum(1 for r in received if r) == CONSUMERS  # the work was actually shared
    await pop_nothing(processor, "g", "load", wait_ms=200)


async def test_two_groups_each_receive_every_message(processor):
    await processor.create_topic(CTX, "load", queues=8)
    await send_bodies(processor, "load", (f"m{i}" for i in range(N)), batch=500)
    r1, r2 = await asyncio.gather(
        consume_all(processor, "g1", "load", N, CONSUMERS),
        consume_all(processor, "g2", "load", N, CONSUMERS),
    )
    expected = {f"m{i}".encode() for i in range(N)}
    for received in (r1, r2):
        everything = [b for r in received for b in r]
        assert len(everything) == N and set(everything) == expected
    for g in ("g1", "g2"):
        await pop_nothing(processor, g, "load", wait_ms=100)


async def test_consumers_racing_with_producers(processor):
    """Producers and consumers at once: nothing lost, nothing doubled."""
    await processor.create_topic(CTX, "race", queues=4)
    total = 4000

    async def produce(k: int) -> None:
        for j in range(0, total // 4, 50):
            await send_bodies(processor, "race", (f"p{k}-{i}" for i in range(j, j + 50)), batch=50)
            await asyncio.sleep(0)

    producers = asyncio.gather(*(produce(k) for k in range(4)))
    received = await consume_all(processor, "g", "race", total, CONSUMERS)
    await producers
    everything = [b for r in received for b in r]
    assert len(everything) == total
    assert set(everything) == {f"p{k}-{i}".encode() for k in range(4) for i in range(total // 4)}
