"""MessagingProcessor: sending, topic types, producer load balancing, topic admin, queries.

Everything goes through the processor API (see processor_fixtures.py); the
same tests run against every deployment shape.
"""

from __future__ import annotations

from collections import Counter

import pytest

from core_broker.errors import BadRequestError, MessageTooLargeError, TopicExistsError, TopicNotFoundError
from core_broker.model import MessageType
from core_broker.topic_config import PERM_READ, PERM_RW
from gateway.processor import MessageTypeMismatchError, NoWritableQueueError

from processor_fixtures import (  # noqa: F401  (processor, processor_options are fixtures)
    CTX,
    bodies,
    msg,
    now_ms,
    pop_nothing,
    pop_until,
    processor,
    processor_options,
)

# ----------------------------------------------------------------------------- send


async def test_send_one_and_receive_it_with_everything_it_carried(processor):
    [r] = await processor.send(
        CTX,
        [msg("orders", b"hello", tag="TagA", keys=["order-1", "cust-7"], properties={"region": "eu", "n": "1"})],
    )
    assert r.message_id and r.topic == "orders" and r.transaction_id is None
    assert 0 <= r.queue_id < 4 and r.queue_offset == 0
    route = await processor.query_route(CTX, "orders")
    assert r.broker in route.brokers

    [p] = await pop_until(processor, "g", "orders", 1)
    m = p.message
    assert (m.topic, m.body, m.tag, set(m.keys)) == ("orders", b"hello", "TagA", {"order-1", "cust-7"})
    assert m.properties == {"region": "eu", "n": "1"}
    assert m.message_id == r.message_id
    assert (m.queue_id, m.queue_offset) == (r.queue_id, r.queue_offset)
    assert m.protocol == "test"  # stamped with the door it came in by
    assert m.born_host == CTX.remote_address
    assert m.born_timestamp_ms > 0 and m.store_timestamp_ms >= m.born_timestamp_ms - 1000
    assert p.delivery_attempt == 1 and p.receipt_handle


async def test_send_batch_returns_results_in_order_with_unique_ids(processor):
    results = await processor.send(CTX, [msg("batch", f"m{i}") for i in range(100)])
    assert len(results) == 100
    assert len({r.message_id for r in results}) == 100
    got = await pop_until(processor, "g", "batch", 100, ack=True)
    by_id = {p.message.message_id: p.message.body for p in got}
    assert by_id == {r.message_id: f"m{i}".encode() for i, r in enumerate(results)}
    await pop_nothing(processor, "g", "batch", wait_ms=100)


async def test_batch_may_span_topics(processor):
    results = await processor.send(CTX, [msg("span-a", "a1"), msg("span-b", "b1"), msg("span-a", "a2")])
    assert [r.topic for r in results] == ["span-a", "span-b", "span-a"]
    assert sorted(bodies(await pop_until(processor, "g", "span-a", 2))) == [b"a1", b"a2"]
    assert bodies(await pop_until(processor, "g", "span-b", 1)) == [b"b1"]


async def test_empty_and_oversized_sends_are_refused(processor):
    with pytest.raises(BadRequestError):
        await processor.send(CTX, [])
    with pytest.raises(BadRequestError):
        await processor.send(CTX, [msg("big", "x")] * (processor.config.max_batch + 1))
    with pytest.raises(MessageTooLargeError):
        await processor.send(CTX, [msg("big", b"x" * (processor.config.max_message_size + 1))])


async def test_send_to_a_system_topic_is_refused(processor):
    for topic in ("%DLQ%g", "%RETRY%g+t", "%SYS_TIMER%"):
        with pytest.raises(BadRequestError):
            await processor.send(CTX, [msg(topic, "x")])


async def test_reserved_properties_are_stripped_from_client_messages(processor):
    await processor.send(CTX, [msg("props", "x", properties={"__rt": "elsewhere", "__dt": "1", "ok": "1"})])
    [p] = await pop_until(processor, "g", "props", 1)
    assert p.message.topic == "props" and p.message.properties == {"ok": "1"}


async def test_message_ids_stay_unique_across_a_restart(processor):
    before = {r.message_id for r in await processor.send(CTX, [msg("ids", f"{i}") for i in range(50)])}
    await processor.restart()
    after = {r.message_id for r in await processor.send(CTX, [msg("ids", f"{i}") for i in range(50)])}
    assert len(before) == len(after) == 50 and not before & after


async def test_repeated_single_sends_keep_every_check_and_stamp(processor):
    """From the second single send to a topic on, the merged deployment takes the short path
    (gateway/send_now.py): the same refusals, stamps and results as the first send."""
    await processor.create_topic(CTX, "one-txn", message_type=MessageType.TRANSACTION)
    await processor.create_topic(CTX, "one", queues=2)
    limit = processor.config.max_message_size
    for _ in range(3):  # the first round plans the topics, the others find the plans
        with pytest.raises(MessageTypeMismatchError):
            await processor.send(CTX, [msg("one-txn", "x")])
        with pytest.raises(MessageTooLargeError):
            await processor.send(CTX, [msg("one", b"x" * (limit + 1))])
    results = [(await processor.send(CTX, [msg("one", f"{i}", properties={"__rt": "x", "k": "v"})]))[0]
               for i in range(4)]
    assert [r.queue_id for r in results] in ([0, 1, 0, 1], [1, 0, 1, 0])
    assert [r.queue_offset for r in results] == [0, 0, 1, 1]
    got = await pop_until(processor, "g", "one", 4)
    assert sorted(bodies(got)) == [b"0", b"1", b"2", b"3"]
    by_id = {r.message_id: r for r in results}
    for p in got:
        m = p.message
        assert m.properties == {"k": "v"} and m.protocol == "test" and m.born_host == CTX.remote_address
        assert (m.queue_id, m.queue_offset) == (by_id[m.message_id].queue_id, by_id[m.message_id].queue_offset)



async def test_repeated_batch_sends_keep_every_check_and_stamp(processor):
    """From the second call to a topic on, a merged call of plain messages to one topic takes the
    short run path (gateway/send_now.py `_send_run`): the same refusals, stamps and results, and
    a call it cannot take (a reserved property, an oversized message) is the general path's."""
    await processor.create_topic(CTX, "run", queues=2)
    limit = processor.config.max_message_size
    for _ in range(3):  # the first round plans the topic, the others find the plan
        with pytest.raises(MessageTooLargeError):
            await processor.send(CTX, [msg("run", "a"), msg("run", b"x" * (limit + 1))])
    stats = await processor.describe_topic(CTX, "run")
    assert [q.max_offset for q in stats.queues] == [0, 0]  # the refused calls stored nothing
    results = []
    for k in range(3):
        props = [{"k": "v"} if i or k else {"__rt": "x", "k": "v"} for i in range(4)]  # call 0: general path
        results += await processor.send(CTX, [msg("run", f"{k}-{i}", properties=props[i]) for i in range(4)])
    # each call spread evenly over both queues, in runs (send_plan.RUN_MIN)
    assert all(sorted(r.queue_id for r in results[i:i + 4]) == [0, 0, 1, 1] for i in range(0, 12, 4))
    assert all(results[i].queue_id == results[i + 1].queue_id for i in range(0, 12, 2))
    got = await pop_until(processor, "g", "run", 12)
    assert len(got) == 12 and len({r.message_id for r in results}) == 12
    by_id = {r.message_id: r for r in results}
    for p in got:
        m = p.message
        assert m.properties == {"k": "v"} and m.protocol == "test" and m.born_host == CTX.remote_address
        assert m.born_timestamp_ms > 0
        assert (m.queue_id, m.queue_offset) == (by_id[m.message_id].queue_id, by_id[m.message_id].queue_offset)


# ----------------------------------------------------------------------------- topics and types


async def test_first_send_auto_creates_a_normal_topic_with_the_default_queue_count(processor):
    assert "fresh" not in [t.name for t in await processor.list_topics(CTX)]
    await processor.send(CTX, [msg("fresh", "x")])
    [tc] = [t for t in await processor.list_topics(CTX) if t.name == "fresh"]
    assert tc.queues == processor.config.default_queue_count == 4
    assert tc.message_type == MessageType.NORMAL


@pytest.mark.parametrize("processor_options", [{"processor": {"auto_create_topics": False}}], ids=["no-autocreate"])
async def test_without_auto_create_an_unknown_topic_is_an_error(processor):
    with pytest.raises(TopicNotFoundError):
        await processor.send(CTX, [msg("nope", "x")])
    with pytest.raises(TopicNotFoundError):
        await processor.pop(CTX, "g", "nope", 1, 1000)
    with pytest.raises(TopicNotFoundError):
        await processor.query_route(CTX, "nope")
    assert "nope" not in [t.name for t in await processor.list_topics(CTX)]
    await processor.create_topic(CTX, "nope", queues=2)
    [r] = await processor.send(CTX, [msg("nope", "x")])
    assert r.queue_id in (0, 1)


async def test_pop_and_route_do_not_auto_create(processor):
    with pytest.raises(TopicNotFoundError):
        await processor.pop(CTX, "g", "never-sent", 1, 1000)
    with pytest.raises(TopicNotFoundError):
        await processor.query_route(CTX, "never-sent")
    with pytest.raises(TopicNotFoundError):
        await processor.pull(CTX, "never-sent", 0, 0)


async def test_typed_topics_are_created_through_admin_and_survive_a_restart(processor):
    for name, mtype in [("t-fifo", MessageType.FIFO), ("t-delay", "DELAY"), ("t-txn", MessageType.TRANSACTION)]:
        tc = await processor.create_topic(CTX, name, queues=3, message_type=mtype)
        assert tc.message_type == MessageType(mtype) and tc.queues == 3
    await processor.restart()
    types = {t.name: t.message_type for t in await processor.list_topics(CTX)}
    assert types == {"t-fifo": MessageType.FIFO, "t-delay": MessageType.DELAY, "t-txn": MessageType.TRANSACTION}
    stats = await processor.describe_topic(CTX, "t-fifo")
    assert stats.config.message_type == MessageType.FIFO and len(stats.queues) == 3


async def test_create_existing_topic(processor):
    await processor.create_topic(CTX, "dup", message_type=MessageType.FIFO)
    with pytest.raises(TopicExistsError):
        await processor.create_topic(CTX, "dup", message_type=MessageType.FIFO)
    tc = await processor.create_topic(CTX, "dup", message_type=MessageType.FIFO, exist_ok=True)
    assert tc.message_type == MessageType.FIFO
    with pytest.raises(TopicExistsError):  # exist_ok never silently changes the type
        await processor.create_topic(CTX, "dup", message_type=MessageType.NORMAL, exist_ok=True)


async def test_create_topic_validates_its_arguments(processor):
    with pytest.raises(BadRequestError):
        await processor.create_topic(CTX, "%mine")
    with pytest.raises(BadRequestError):
        await processor.create_topic(CTX, "")
    for bad in (0, -1, 1025):
        with pytest.raises(BadRequestError):
            await processor.create_topic(CTX, f"q{bad}", queues=bad)
    with pytest.raises(ValueError):
        await processor.create_topic(CTX, "weird", message_type="BOGUS")


async def test_message_type_must_fit_the_topic_type(processor):
    await processor.create_topic(CTX, "fifo", message_type=MessageType.FIFO)
    await processor.create_topic(CTX, "delay", message_type=MessageType.DELAY)
    await processor.create_topic(CTX, "txn", message_type=MessageType.TRANSACTION)
    await processor.create_topic(CTX, "normal")
    later = now_ms() + 60_000

    # transactional messages need a TRANSACTION topic, and a TRANSACTION topic takes nothing else
    for topic in ("normal", "fifo", "delay", "auto-created"):
        with pytest.raises(MessageTypeMismatchError):
            await processor.send(CTX, [msg(topic, "x")], transactional=True)
    with pytest.raises(MessageTypeMismatchError):
        await processor.send(CTX, [msg("txn", "x")])
    with pytest.raises(MessageTypeMismatchError):
        await processor.send(CTX, [msg("txn", "x", message_group="g1")])
    # a FIFO topic takes no delay message, a DELAY topic no FIFO message
    with pytest.raises(MessageTypeMismatchError):
        await processor.send(CTX, [msg("fifo", "x", delivery_time_ms=later)])
    with pytest.raises(MessageTypeMismatchError):
        await processor.send(CTX, [msg("delay", "x", message_group="g1")])
    # nothing of a refused batch is stored
    with pytest.raises(MessageTypeMismatchError):
        await processor.send(CTX, [msg("normal", "ok"), msg("fifo", "bad", delivery_time_ms=later)])
    await pop_nothing(processor, "g", "normal", wait_ms=100)
    # doors without topic types send NORMAL messages, which every non-transaction topic takes
    for topic in ("normal", "fifo", "delay"):
        await processor.send(CTX, [msg(topic, "plain")])
        assert bodies(await pop_until(processor, "g", topic, 1)) == [b"plain"]
    # and the normal topic takes FIFO and delay messages too
    await processor.send(CTX, [msg("normal", "grouped", message_group="g1")])
    assert bodies(await pop_until(processor, "g", "normal", 1)) == [b"grouped"]
    assert MessageTypeMismatchError.code == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


# ----------------------------------------------------------------------------- load balancing


async def test_round_robin_over_the_writable_queues(processor):
    await processor.create_topic(CTX, "rr", queues=4)
    single = [(await processor.send(CTX, [msg("rr", f"{i}")]))[0].queue_id for i in range(8)]
    assert sorted(single) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(single[i] != single[i + 1] for i in range(7))  # consecutive sends move on
    batch = [r.queue_id for r in await processor.send(CTX, [msg("rr", f"b{i}") for i in range(40)])]
    assert Counter(batch) == {0: 10, 1: 10, 2: 10, 3: 10}
    stats = await processor.describe_topic(CTX, "rr")
    assert [q.max_offset for q in stats.queues] == [12, 12, 12, 12]


async def test_fifo_message_group_stays_in_one_queue(processor):
    await processor.create_topic(CTX, "fifo-lb", queues=8, message_type=MessageType.FIFO)
    queues_of: dict[str, set[int]] = {}
    for rnd in range(5):
        results = await processor.send(
            CTX, [msg("fifo-lb", f"{g}-{rnd}", message_group=f"group-{g}") for g in range(32)]
        )
        for g, r in enumerate(results):
            queues_of.setdefault(f"group-{g}", set()).add(r.queue_id)
    assert all(len(qs) == 1 for qs in queues_of.values()), queues_of
    used = {next(iter(qs)) for qs in queues_of.values()}
    assert len(used) >= 4  # 32 groups are spread over the queues, not piled on one


async def test_read_only_topic_refuses_sends_but_stays_readable(processor):
    await processor.create_topic(CTX, "ro", queues=2)
    await processor.send(CTX, [msg("ro", "before")])
    await processor.update_topic(CTX, "ro", perm=PERM_READ)
    with pytest.raises(NoWritableQueueError):
        await processor.send(CTX, [msg("ro", "after")])
    assert bodies(await pop_until(processor, "g", "ro", 1)) == [b"before"]
    await processor.update_topic(CTX, "ro", perm=PERM_RW)
    await processor.send(CTX, [msg("ro", "again")])
    assert bodies(await pop_until(processor, "g", "ro", 1)) == [b"again"]


# ----------------------------------------------------------------------------- admin


async def test_update_topic_adds_queues_and_never_removes_them(processor):
    await processor.create_topic(CTX, "grow", queues=2)
    tc = await processor.update_topic(CTX, "grow", queues=6)
    assert tc.queues == 6
    route = await processor.query_route(CTX, "grow")
    assert sorted(q.queue_id for q in route.queues) == list(range(6))
    results = await processor.send(CTX, [msg("grow", f"{i}") for i in range(12)])
    assert {r.queue_id for r in results} == set(range(6))
    with pytest.raises(BadRequestError):
        await processor.update_topic(CTX, "grow", queues=3)
    with pytest.raises(TopicNotFoundError):
        await processor.update_topic(CTX, "missing", queues=3)
    await processor.restart()
    assert len((await processor.describe_topic(CTX, "grow")).queues) == 6


async def test_describe_topic_reports_min_and_max_offset_per_queue(processor):
    await processor.create_topic(CTX, "desc", queues=3)
    stats = await processor.describe_topic(CTX, "desc")
    assert [(q.queue_id, q.min_offset, q.max_offset) for q in stats.queues] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    results = await processor.send(CTX, [msg("desc", f"{i}") for i in range(10)])
    per_queue = Counter(r.queue_id for r in results)
    stats = await processor.describe_topic(CTX, "desc")
    assert stats.config.name == "desc" and stats.config.queues == 3
    assert {q.queue_id: (q.min_offset, q.max_offset) for q in stats.queues} == {
        q: (0, per_queue[q]) for q in range(3)
    }
    with pytest.raises(TopicNotFoundError):
        await processor.describe_topic(CTX, "missing")


async def test_list_topics_hides_system_topics_unless_asked(processor):
    await processor.create_topic(CTX, "listed")
    await processor.send(CTX, [msg("listed", "x")])
    [p] = await pop_until(processor, "g", "listed", 1)
    await processor.forward_to_dlq(CTX, "g", "listed", p.receipt_handle)
    user = {t.name for t in await processor.list_topics(CTX)}
    everything = {t.name for t in await processor.list_topics(CTX, include_system=True)}
    assert user == {"listed"}
    assert "%DLQ%g" in everything and not any(n.startswith("%") for n in user)


@pytest.mark.parametrize("processor_options", [{"processor": {"auto_create_topics": False}}], ids=["no-autocreate"])
async def test_delete_topic(processor):
    await processor.create_topic(CTX, "doomed", queues=2)
    await processor.send(CTX, [msg("doomed", f"{i}") for i in range(4)])
    await pop_until(processor, "g", "doomed", 2, max_count=2)
    await processor.commit_offset(CTX, "puller", "doomed", 0, 2)
    await processor.delete_topic(CTX, "doomed")
    assert "doomed" not in [t.name for t in await processor.list_topics(CTX)]
    with pytest.raises(TopicNotFoundError):
        await processor.describe_topic(CTX, "doomed")
    with pytest.raises(TopicNotFoundError):
        await processor.send(CTX, [msg("doomed", "x")])
    with pytest.raises(TopicNotFoundError):
        await processor.pop(CTX, "g", "doomed", 1, 1000)
    with pytest.raises(TopicNotFoundError):
        await processor.delete_topic(CTX, "doomed")
    with pytest.raises(BadRequestError):
        await processor.delete_topic(CTX, "%SYS_TIMER%")

    # a topic created again under the same name starts empty, for every group
    await processor.create_topic(CTX, "doomed", queues=2)
    stats = await processor.describe_topic(CTX, "doomed")
    assert [q.max_offset for q in stats.queues] == [0, 0]
    assert await processor.get_offset(CTX, "puller", "doomed", 0) is None
    await pop_nothing(processor, "g", "doomed", wait_ms=100)
    await processor.send(CTX, [msg("doomed", "new")])
    assert bodies(await pop_until(processor, "g", "doomed", 1)) == [b"new"]
    await processor.restart()
    assert [t.name for t in await processor.list_topics(CTX)] == ["doomed"]


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "no-snapshot"])
async def test_a_deleted_topic_leaves_nothing_behind_for_its_successor(processor, hard):
    """Retries pending for a deleted topic and pop progress in it must not reach a new
    topic of the same name -- not even after a restart that replays the broker journal."""
    await processor.create_topic(CTX, "reborn", queues=1)
    await processor.send(CTX, [msg("reborn", f"old-{i}") for i in range(5)])
    await pop_until(processor, "g", "reborn", 5, invisible_ms=100)  # expire: into the retry topic
    await pop_until(processor, "g", "reborn", 5, ack=True)  # from the retry topic, acked
    await pop_until(processor, "g", "reborn", 0)
    [again] = [p for p in await pop_until(processor, "g2", "reborn", 5) if p.message.body == b"old-0"]
    await processor.change_invisible(CTX, "g2", "reborn", again.receipt_handle, 0)  # g2 retries old-0
    await processor.delete_topic(CTX, "reborn")
    await processor.create_topic(CTX, "reborn", queues=1)
    await processor.restart(hard=hard)
    await processor.send(CTX, [msg("reborn", f"new-{i}") for i in range(3)])
    for g in ("g", "g2", "g3"):
        got = await pop_until(processor, g, "reborn", 3, ack=True)
        assert sorted(bodies(got)) == [b"new-0", b"new-1", b"new-2"], g
        await pop_nothing(processor, g, "reborn", wait_ms=200)


async def test_query_route_names_every_queue_and_its_broker(processor):
    await processor.create_topic(CTX, "routed", queues=5)
    route = await processor.query_route(CTX, "routed")
    assert route.config.name == "routed" and route.config.queues == 5
    assert sorted(q.queue_id for q in route.queues) == list(range(5))
    assert route.brokers and all(q.broker in route.brokers for q in route.queues)
    assert all(q.perm == PERM_RW for q in route.queues)


# ----------------------------------------------------------------------------- queries


async def test_query_message_by_id(processor):
    results = await processor.send(CTX, [msg("byid", f"body-{i}", tag="T", keys=[f"k{i}"]) for i in range(20)])
    for i, r in enumerate(results):
        m = await processor.query_message_by_id(CTX, r.message_id)
        assert m is not None, r
        assert (m.message_id, m.topic, m.body, m.tag) == (r.message_id, "byid", f"body-{i}".encode(), "T")
    assert await processor.query_message_by_id(CTX, "0" * 34) is None
    assert await processor.query_message_by_id(CTX, "no-such-id") is None
    await processor.restart()
    m = await processor.query_message_by_id(CTX, results[7].message_id)
    assert m is not None and m.body == b"body-7"


async def test_client_chosen_message_ids_are_queryable(processor):
    [r] = await processor.send(CTX, [msg("cid", "mine", message_id="client-id-0001")])
    assert r.message_id == "client-id-0001"
    m = await processor.query_message_by_id(CTX, "client-id-0001")
    assert m is not None and m.body == b"mine"


async def test_query_messages_by_key(processor):
    await processor.send(
        CTX,
        [msg("bykey", f"o{i}", keys=[f"order-{i % 3}"]) for i in range(9)]
        + [msg("other", "elsewhere", keys=["order-0"])],
    )
    found = await processor.query_messages_by_key(CTX, "bykey", "order-0")
    assert sorted(m.body for m in found) == [b"o0", b"o3", b"o6"]
    assert all(m.topic == "bykey" for m in found)
    assert [m.body for m in await processor.query_messages_by_key(CTX, "other", "order-0")] == [b"elsewhere"]
    assert await processor.query_messages_by_key(CTX, "bykey", "order-9") == []
    assert len(await processor.query_messages_by_key(CTX, "bykey", "order-1", max_count=2)) == 2
    # time window
    assert await processor.query_messages_by_key(CTX, "bykey", "order-0", begin_ms=now_ms() + 60_000) == []
    await processor.restart(hard=True)
    assert len(await processor.query_messages_by_key(CTX, "bykey", "order-2")) == 3
