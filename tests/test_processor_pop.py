"""MessagingProcessor: pop consumption -- invisible time, ack, change invisible time,
redelivery through the retry topic, dead letters, receipt handles, durability
across restarts, long polling and independent consumer groups.
"""

from __future__ import annotations

import asyncio
import pytest

from core_broker.errors import BadRequestError, TopicNotFoundError
from core_broker.receipt import InvalidReceiptHandleError

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
    send_bodies,
    wait_for_topic,
)


async def topic_with(processor, topic: str, n: int, queues: int = 4) -> list:
    await processor.create_topic(CTX, topic, queues=queues)
    return await send_bodies(processor, topic, [f"m{i}" for i in range(n)])


# ----------------------------------------------------------------------------- pop and ack


async def test_popped_messages_are_hidden_and_acked_ones_never_return(processor):
    await topic_with(processor, "t", 20)
    # 5 s: collecting and acking 20 must finish within the invisible time even on a
    # heavily loaded machine (at 1 s it did not always, at load 20)
    got = await pop_until(processor, "g", "t", 20, invisible_ms=5000)
    for p in got:  # at once: well within the invisible time
        await processor.ack(CTX, "g", "t", p.receipt_handle)
    assert sorted(bodies(got)) == sorted(f"m{i}".encode() for i in range(20))
    assert all(p.delivery_attempt == 1 for p in got)
    assert len({p.receipt_handle for p in got}) == 20
    await asyncio.sleep(5.3)  # past the invisible time
    await pop_nothing(processor, "g", "t", wait_ms=200)


async def test_popped_messages_are_hidden_for_their_invisible_time(processor):
    await topic_with(processor, "t", 5)
    got = await pop_until(processor, "g", "t", 5, invisible_ms=60_000)
    await pop_nothing(processor, "g", "t", wait_ms=200)
    assert all(p.invisible_until_ms >= got[0].message.store_timestamp_ms + 60_000 for p in got)


async def test_pop_returns_at_most_max_count(processor):
    await topic_with(processor, "t", 50)
    first = await processor.pop(CTX, "g", "t", 7, 30_000)
    assert 1 <= len(first) <= 7
    rest = await pop_until(processor, "g", "t", 50 - len(first))
    assert len({p.message.message_id for p in first + rest}) == 50


async def test_unacked_message_comes_back_with_its_delivery_attempt_counted(processor):
    await topic_with(processor, "t", 4, queues=1)
    first = await pop_until(processor, "g", "t", 4, invisible_ms=500)
    acked, kept = first[:2], first[2:]
    for p in acked:
        await processor.ack(CTX, "g", "t", p.receipt_handle)
    again = await pop_until(processor, "g", "t", 2, invisible_ms=200)
    assert sorted(bodies(again)) == sorted(bodies(kept))
    assert [p.delivery_attempt for p in again] == [2, 2]
    assert {p.message.message_id for p in again} == {p.message.message_id for p in kept}
    third = await pop_until(processor, "g", "t", 2, invisible_ms=30_000)
    assert [p.delivery_attempt for p in third] == [3, 3]
    assert all(p.message.reconsume_times == p.delivery_attempt - 1 for p in third)
    for p in third:
        await processor.ack(CTX, "g", "t", p.receipt_handle)
    await pop_nothing(processor, "g", "t", wait_ms=200)


async def test_retry_goes_through_the_groups_retry_topic_and_keeps_the_message(processor):
    await processor.create_topic(CTX, "orders", queues=2)
    [r] = await processor.send(
        CTX, [msg("orders", b"payload", tag="TagA", keys=["k1"], properties={"region": "eu"})]
    )
    [p1] = await pop_until(processor, "g", "orders", 1, invisible_ms=100)
    [p2] = await pop_until(processor, "g", "orders", 1)
    # the redelivery came from the per-(group, topic) retry topic ...
    system = {t.name for t in await processor.list_topics(CTX, include_system=True)}
    assert "%RETRY%g+orders" in system
    assert "%RETRY%g+orders" not in {t.name for t in await processor.list_topics(CTX)}
    # ... but is the same message of the same topic to the consumer
    m = p2.message
    assert (m.topic, m.body, m.tag, m.keys, m.properties) == ("orders", b"payload", "TagA", ("k1",), {"region": "eu"})
    assert m.message_id == r.message_id == p1.message.message_id
    assert p2.delivery_attempt == 2 and m.reconsume_times == 1
    assert p2.receipt_handle != p1.receipt_handle
    await processor.ack(CTX, "g", "orders", p2.receipt_handle)
    await pop_nothing(processor, "g", "orders", wait_ms=200)
    # the retry topic is the group's own: another group sees the message once, as new
    [other] = await pop_until(processor, "other", "orders", 1)
    assert other.delivery_attempt == 1
    await processor.ack(CTX, "other", "orders", other.receipt_handle)
    await pop_nothing(processor, "other", "orders", wait_ms=200)


async def test_retries_of_one_topic_never_reach_a_pop_of_another(processor):
    await topic_with(processor, "a", 1, queues=1)
    await processor.create_topic(CTX, "b", queues=1)
    await processor.send(CTX, [msg("b", "b0")])
    [pa] = await pop_until(processor, "g", "a", 1, invisible_ms=100)
    [pb] = await pop_until(processor, "g", "b", 1)
    await processor.ack(CTX, "g", "b", pb.receipt_handle)
    await asyncio.sleep(0.4)
    await pop_nothing(processor, "g", "b", wait_ms=200)
    [again] = await pop_until(processor, "g", "a", 1)
    assert again.message.body == b"m0" and again.message.topic == "a" and again.delivery_attempt == 2


@pytest.mark.parametrize("processor_options", [{"broker": {"retry_backoff_ms": (2000,)}}], ids=["backoff-2s"])
async def test_retry_waits_for_its_backoff(processor):
    await topic_with(processor, "t", 1, queues=1)
    [p] = await pop_until(processor, "g", "t", 1, invisible_ms=100)
    # long-poll from now on: the retry may not show before invisible time + back-off
    [again] = await pop_until(processor, "g", "t", 1, timeout=15)
    assert now_ms() >= p.invisible_until_ms + 2000 - EARLY_SLACK_MS
    assert again.message.body == b"m0" and again.delivery_attempt == 2


# ----------------------------------------------------------------------------- change invisible time


async def test_change_invisible_extends(processor):
    await topic_with(processor, "t", 1, queues=1)
    [p] = await pop_until(processor, "g", "t", 1, invisible_ms=500)
    handle, visible_at = await processor.change_invisible(CTX, "g", "t", p.receipt_handle, 30_000)
    assert handle != p.receipt_handle and visible_at > p.invisible_until_ms
    await asyncio.sleep(0.7)  # past the first invisible time
    await pop_nothing(processor, "g", "t", wait_ms=200)
    with pytest.raises(InvalidReceiptHandleError):  # the old handle is void
        await processor.ack(CTX, "g", "t", p.receipt_handle)
    await processor.ack(CTX, "g", "t", handle)
    await pop_nothing(processor, "g", "t", wait_ms=100)


async def test_change_invisible_shortens(processor):
    await topic_with(processor, "t", 2, queues=1)
    ps = await pop_until(processor, "g", "t", 2, invisible_ms=60_000)
    target = next(p for p in ps if p.message.body == b"m1")
    await processor.change_invisible(CTX, "g", "t", target.receipt_handle, 0)
    [again] = await pop_until(processor, "g", "t", 1)
    assert again.message.body == b"m1" and again.delivery_attempt == 2


async def test_change_invisible_can_be_repeated_and_chains_handles(processor):
    await topic_with(processor, "t", 1, queues=1)
    [p] = await pop_until(processor, "g", "t", 1, invisible_ms=30_000)
    handle = p.receipt_handle
    for _ in range(5):
        new, _ = await processor.change_invisible(CTX, "g", "t", handle, 30_000)
        with pytest.raises(InvalidReceiptHandleError):
            await processor.change_invisible(CTX, "g", "t", handle, 30_000)
        handle = new
    with pytest.raises(BadRequestError):
        await processor.change_invisible(CTX, "g", "t", handle, -1)
    await processor.ack(CTX, "g", "t", handle)


# ----------------------------------------------------------------------------- dead letters


@pytest.mark.parametrize("processor_options", [{"broker": {"max_delivery_attempts": 3}}], ids=["max3"])
async def test_after_max_attempts_the_message_is_dead_lettered_and_the_dlq_is_consumable(processor):
    [r] = await topic_with(processor, "t", 1, queues=1)
    await processor.send(CTX, [msg("t", "good")])
    seen = []
    while len(seen) < 3:
        for p in await pop_until(processor, "g", "t", 1, invisible_ms=100):
            if p.message.body == b"good":
                await processor.ack(CTX, "g", "t", p.receipt_handle)
            else:
                seen.append(p.delivery_attempt)
    assert seen == [1, 2, 3]
    # the group's dead-letter topic holds it ...
    await wait_for_topic(processor, "%DLQ%g")
    [d] = await pop_until(processor, "dlq-reader", "%DLQ%g", 1)
    assert d.message.body == b"m0" and d.message.message_id == r.message_id
    assert d.message.topic == "%DLQ%g"
    await processor.ack(CTX, "dlq-reader", "%DLQ%g", d.receipt_handle)
    # ... and the original group never sees it again
    await asyncio.sleep(0.3)
    await pop_nothing(processor, "g", "t", wait_ms=200)
    # the DLQ is a queue like any other: pull reads it too
    r2 = await processor.pull(CTX, "%DLQ%g", 0, 0, 10)
    assert [m.body for m in r2.messages] == [b"m0"]


@pytest.mark.parametrize("processor_options", [{"broker": {"max_delivery_attempts": 1}}], ids=["max1"])
async def test_max_attempts_of_one_means_no_retry(processor):
    await topic_with(processor, "t", 1, queues=1)
    await pop_until(processor, "g", "t", 1, invisible_ms=100)
    await wait_for_topic(processor, "%DLQ%g")
    [d] = await pop_until(processor, "dlq", "%DLQ%g", 1)
    assert d.message.body == b"m0"
    await pop_nothing(processor, "g", "t", wait_ms=200)


async def test_forward_to_dlq(processor):
    await topic_with(processor, "t", 3, queues=1)
    ps = await pop_until(processor, "g", "t", 3, invisible_ms=500)
    poison = next(p for p in ps if p.message.body == b"m1")
    await processor.forward_to_dlq(CTX, "g", "t", poison.receipt_handle)
    with pytest.raises(InvalidReceiptHandleError):
        await processor.ack(CTX, "g", "t", poison.receipt_handle)
    with pytest.raises(InvalidReceiptHandleError):
        await processor.forward_to_dlq(CTX, "g", "t", poison.receipt_handle)
    [d] = await pop_until(processor, "g", "%DLQ%g", 1)
    assert d.message.body == b"m1"
    # the other two were not acked: they come back, the dead-lettered one does not
    back = await pop_until(processor, "g", "t", 2)
    assert sorted(bodies(back)) == [b"m0", b"m2"]
    await pop_nothing(processor, "g", "t", wait_ms=200)


async def test_forward_to_dlq_of_a_retried_message(processor):
    await topic_with(processor, "t", 1, queues=1)
    await pop_until(processor, "g", "t", 1, invisible_ms=100)
    [p] = await pop_until(processor, "g", "t", 1)
    assert p.delivery_attempt == 2
    await processor.forward_to_dlq(CTX, "g", "t", p.receipt_handle)
    [d] = await pop_until(processor, "g", "%DLQ%g", 1)
    assert d.message.body == b"m0"
    await pop_nothing(processor, "g", "t", wait_ms=200)


# ----------------------------------------------------------------------------- receipt handles


async def test_invalid_and_stale_receipt_handles_are_refused(processor):
    await topic_with(processor, "t", 1, queues=1)
    for bad in ("", "garbage", "1.x.y.z", "2.YQ.dA.0.0.1.1", "1.YnJva2VyLWE.dA.0.0.x.1"):
        with pytest.raises(InvalidReceiptHandleError):
            await processor.ack(CTX, "g", "t", bad)
        with pytest.raises(InvalidReceiptHandleError):
            await processor.change_invisible(CTX, "g", "t", bad, 1000)
    [p1] = await pop_until(processor, "g", "t", 1, invisible_ms=100)
    [p2] = await pop_until(processor, "g", "t", 1, invisible_ms=30_000)  # redelivered
    # the handle of the first delivery cannot ack (or re-hide) the second one
    with pytest.raises(InvalidReceiptHandleError):
        await processor.ack(CTX, "g", "t", p1.receipt_handle)
    with pytest.raises(InvalidReceiptHandleError):
        await processor.change_invisible(CTX, "g", "t", p1.receipt_handle, 0)
    # a handle belongs to its group
    with pytest.raises(InvalidReceiptHandleError):
        await processor.ack(CTX, "other", "t", p2.receipt_handle)
    await processor.ack(CTX, "g", "t", p2.receipt_handle)
    with pytest.raises(InvalidReceiptHandleError):  # used up
        await processor.ack(CTX, "g", "t", p2.receipt_handle)
    assert InvalidReceiptHandleError.code == "INVALID_RECEIPT_HANDLE"


async def test_pop_argument_errors(processor):
    await topic_with(processor, "t", 1)
    with pytest.raises(BadRequestError):
        await processor.pop(CTX, "", "t", 1, 1000)
    with pytest.raises(BadRequestError):
        await processor.pop(CTX, "g", "t", 0, 1000)
    with pytest.raises(BadRequestError):
        await processor.pop(CTX, "g", "t", 1, -5)
    with pytest.raises(TopicNotFoundError):
        await processor.pop(CTX, "g", "missing", 1, 1000)


# ----------------------------------------------------------------------------- durability


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_pop_and_ack_state_survives_a_restart(processor, hard):
    await topic_with(processor, "t", 30, queues=2)
    popped = await pop_until(processor, "g", "t", 12, max_count=12, invisible_ms=1000)
    acked, unacked = popped[::2], popped[1::2]
    for p in acked:
        await processor.ack(CTX, "g", "t", p.receipt_handle)
    await processor.restart(hard=hard)
    # every message except the acked ones comes (back), exactly once
    after = await pop_until(processor, "g", "t", 30 - len(acked), ack=True, timeout=15)
    assert sorted(bodies(after)) == sorted(set(f"m{i}".encode() for i in range(30)) - set(bodies(acked)))
    attempts = {p.message.body: p.delivery_attempt for p in after}
    assert all(attempts[b] == 2 for b in bodies(unacked))
    assert sum(1 for a in attempts.values() if a == 1) == 30 - len(popped)
    await pop_nothing(processor, "g", "t", wait_ms=200)
    await processor.restart(hard=hard)
    await pop_nothing(processor, "g", "t", wait_ms=200)


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_receipt_handles_stay_valid_across_a_restart(processor, hard):
    await topic_with(processor, "t", 2, queues=1)
    ps = await pop_until(processor, "g", "t", 2, invisible_ms=60_000)
    keep, release = ps
    await processor.restart(hard=hard)
    await processor.ack(CTX, "g", "t", keep.receipt_handle)
    await processor.change_invisible(CTX, "g", "t", release.receipt_handle, 0)
    [again] = await pop_until(processor, "g", "t", 1)
    assert again.message.body == release.message.body and again.delivery_attempt == 2
    await processor.ack(CTX, "g", "t", again.receipt_handle)
    await pop_nothing(processor, "g", "t", wait_ms=200)


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_retries_and_dead_letters_survive_a_restart(processor, hard):
    await processor.restart(broker={"max_delivery_attempts": 2})
    await topic_with(processor, "t", 2, queues=1)
    await pop_until(processor, "g", "t", 2, invisible_ms=100)
    [p, q] = await pop_until(processor, "g", "t", 2, invisible_ms=60_000)  # from the retry topic
    await processor.ack(CTX, "g", "t", p.receipt_handle)
    await processor.forward_to_dlq(CTX, "g", "t", q.receipt_handle)
    await processor.restart(hard=hard)
    await pop_nothing(processor, "g", "t", wait_ms=200)
    [d] = await pop_until(processor, "g", "%DLQ%g", 1)
    assert d.message.body == q.message.body
    await processor.ack(CTX, "g", "%DLQ%g", d.receipt_handle)
    await processor.restart(hard=hard)
    await pop_nothing(processor, "g", "%DLQ%g", wait_ms=200)
    await pop_nothing(processor, "g", "t", wait_ms=200)


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_repeated_restarts_deliver_each_message_once_per_group(processor, hard):
    await processor.create_topic(CTX, "t", queues=3)
    seen: list[bytes] = []
    for rnd in range(4):
        await send_bodies(processor, "t", [f"r{rnd}-{i}" for i in range(25)])
        seen += bodies(await pop_until(processor, "g", "t", 25, ack=True))
        await processor.restart(hard=hard)
    await pop_nothing(processor, "g", "t", wait_ms=200)
    assert sorted(seen) == sorted(f"r{r}-{i}".encode() for r in range(4) for i in range(25))


# ----------------------------------------------------------------------------- long polling


async def test_long_polling_pop_returns_as_soon_as_a_message_arrives(processor):
    await processor.create_topic(CTX, "lp", queues=4)
    waiting = asyncio.create_task(processor.pop(CTX, "g", "lp", 8, 30_000, wait_ms=5000))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # it is waiting, not returning empty
    await processor.send(CTX, [msg("lp", "wake")])
    got = await asyncio.wait_for(waiting, 10)
    assert bodies(got) == [b"wake"]


async def test_long_polling_pop_wakes_for_a_retry(processor):
    await topic_with(processor, "lp", 1, queues=1)
    await pop_until(processor, "g", "lp", 1, invisible_ms=300)
    got = await asyncio.wait_for(processor.pop(CTX, "g", "lp", 8, 30_000, wait_ms=5000), 10)
    assert bodies(got) == [b"m0"] and got[0].delivery_attempt == 2


async def test_long_polling_pop_returns_empty_at_its_deadline(processor):
    await processor.create_topic(CTX, "lp")
    got = await asyncio.wait_for(processor.pop(CTX, "g", "lp", 8, 30_000, wait_ms=300), 10)
    assert got == []


async def test_many_long_polls_share_arrivals_without_duplicates(processor):
    await processor.create_topic(CTX, "lp", queues=4)
    polls = [asyncio.create_task(processor.pop(CTX, "g", "lp", 4, 30_000, wait_ms=1000)) for _ in range(6)]
    await asyncio.sleep(0.2)
    await send_bodies(processor, "lp", [f"x{i}" for i in range(6)], batch=1)
    got = [m for batch in await asyncio.wait_for(asyncio.gather(*polls), 10) for m in batch]
    rest = await pop_until(processor, "g", "lp", 6 - len(got)) if len(got) < 6 else []
    assert sorted(bodies(got + rest)) == sorted(f"x{i}".encode() for i in range(6))


# ----------------------------------------------------------------------------- groups


async def test_consumer_groups_are_independent(processor):
    await topic_with(processor, "t", 40)
    results = {}
    for g in ("g1", "g2", "g3"):
        results[g] = await pop_until(processor, g, "t", 40, ack=(g != "g3"))
    for g, got in results.items():
        assert sorted(bodies(got)) == sorted(f"m{i}".encode() for i in range(40)), g
        assert all(p.delivery_attempt == 1 for p in got)
    # g3 acked nothing; that changes nothing for the others
    for g in ("g1", "g2"):
        await pop_nothing(processor, g, "t", wait_ms=100)


async def test_a_new_group_starts_at_the_earliest_message(processor):
    await topic_with(processor, "t", 10)
    await pop_until(processor, "early", "t", 10, ack=True)
    await send_bodies(processor, "t", ["late-1", "late-2"])
    got = await pop_until(processor, "newcomer", "t", 12)
    assert len({p.message.message_id for p in got}) == 12


async def test_a_new_group_may_start_from_the_latest(processor):
    await topic_with(processor, "t", 10)
    got = await processor.pop(CTX, "latest", "t", 32, 30_000, from_latest=True)
    assert got == []
    await send_bodies(processor, "t", [f"new-{i}" for i in range(6)])
    got = await pop_until(processor, "latest", "t", 6, from_latest=True)
    assert sorted(bodies(got)) == sorted(f"new-{i}".encode() for i in range(6))
    await pop_nothing(processor, "latest", "t", wait_ms=100)
    # from_latest only matters for a group's first pop: after a restart it resumes where it was
    await processor.restart()
    await send_bodies(processor, "t", ["after-restart"])
    got = await pop_until(processor, "latest", "t", 1, from_latest=True)
    assert bodies(got) == [b"after-restart"]


def test_default_retry_policy_is_rocketmqs():
    """16 deliveries, then the DLQ; back-off levels 1s 5s 10s 30s 1m 2m ... (the last repeats)."""
    from core_broker.config import BrokerConfig

    c = BrokerConfig()
    assert c.max_delivery_attempts == 16
    assert c.retry_backoff_ms[:6] == (1_000, 5_000, 10_000, 30_000, 60_000, 120_000)
    assert len(c.retry_backoff_ms) >= c.max_delivery_attempts - 1
