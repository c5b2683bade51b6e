"""TimerService on a real store: delayed messages parked, fired in time order into their real
queue, not fired twice after a restart, and dropped when their topic went away."""

from __future__ import annotations

import asyncio
import time

import pytest

from core_broker.journal import Journal
from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker.system_topics import P_DELIVER_AT, P_REAL_QUEUE, P_REAL_TOPIC, TIMER_TOPIC
from core_broker.timer_service import TimerService
from core_broker.topic_config import TopicConfig
from store_helpers import read_all, stores  # noqa: F401  (stores is a fixture)

pytestmark = pytest.mark.timeout(60)

HOUR_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


class Notified(list):
    """The notify callback: which topics were told they have new messages."""

    def __call__(self, topic: str) -> None:
        self.append(topic)


def service(store: MessageStore, notify=None) -> tuple[TimerService, Journal, Notified]:
    n = notify if notify is not None else Notified()
    j = Journal(store)
    return TimerService(store, j, n), j, n


@pytest.fixture
def store(stores) -> MessageStore:  # noqa: F811
    s = stores.open()
    s.topics.create(TopicConfig("orders", queues=4))
    return s


def msg(body: bytes, queue_id: int = 1, **kw) -> Message:
    return Message("orders", body, queue_id=queue_id, tag="T", properties={"user": "v"}, **kw)


def test_a_due_timer_fires_into_its_real_queue_once(store: MessageStore) -> None:
    ts, j, notified = service(store)
    r = ts.schedule(msg(b"later"), now_ms() - 1)
    assert ts.pending == 1
    assert read_all(store, "orders", 1) == []  # parked, not in its queue yet
    parked = read_all(store, TIMER_TOPIC, 0)
    assert [m.body for m in parked] == [b"later"] and parked[0].queue_offset == r.queue_offset
    assert parked[0].properties[P_REAL_TOPIC] == "orders" and parked[0].properties[P_REAL_QUEUE] == "1"

    assert ts.fire_due() == 1
    got = read_all(store, "orders", 1)
    assert [m.body for m in got] == [b"later"]
    assert got[0].tag == "T" and got[0].properties["user"] == "v"
    assert notified == ["orders"]
    assert ts.pending == 0 and ts.tracker.is_done(r.queue_offset)
    assert list(j.replay(0)) == [("tfire", {"tq": r.queue_offset})]
    assert ts.fire_due() == 0  # not again
    assert len(read_all(store, "orders", 1)) == 1


def test_a_timer_not_yet_due_waits(store: MessageStore) -> None:
    ts, _, notified = service(store)
    at = now_ms() + HOUR_MS
    ts.schedule(msg(b"in an hour"), at)
    assert ts.fire_due() == 0
    assert ts.pending == 1 and notified == [] and read_all(store, "orders", 1) == []
    parked = read_all(store, TIMER_TOPIC, 0)[0]
    assert int(parked.properties[P_DELIVER_AT]) == at == parked.delivery_time_ms


def test_due_timers_fire_in_delivery_time_order_and_later_ones_stay(store: MessageStore) -> None:
    ts, _, _ = service(store)
    t = now_ms()
    for body, at in [(b"c", t - 10), (b"a", t - 30), (b"future", t + HOUR_MS), (b"b", t - 20)]:
        ts.schedule(msg(body, queue_id=2), at)
    assert ts.fire_due() == 3
    assert [m.body for m in read_all(store, "orders", 2)] == [b"a", b"b", b"c"]
    assert ts.pending == 1


def test_a_timer_whose_topic_was_deleted_is_dropped_not_dispatched(store: MessageStore) -> None:
    store.topics.create(TopicConfig("gone", queues=1))
    ts, j, notified = service(store)
    r = ts.schedule(Message("gone", b"orphan", queue_id=0), now_ms() - 1)
    store.topics.delete("gone")
    assert ts.fire_due() == 0
    assert read_all(store, "gone", 0) == []
    assert notified == []
    assert ts.tracker.is_done(r.queue_offset) and ts.pending == 0
    assert list(j.replay(0)) == [("tfire", {"tq": r.queue_offset})]  # the drop survives a restart


def test_schedule_link_delays_a_stored_message_without_copying_it(store: MessageStore) -> None:
    ts, j, notified = service(store)
    body = b"retry me" * 200
    origin = store.put(msg(body, queue_id=0))
    r = ts.schedule_link(origin.commitlog_offset, "orders", 3, now_ms() - 1, "retry", {"g": "grp"}, {"k": "v"}, 2)
    assert r.store_size < len(body)
    assert list(j.replay(0)) == [("retry", {"g": "grp"})]  # the delay itself is journaled
    assert ts.fire_due() == 1
    got = read_all(store, "orders", 3)
    assert [m.body for m in got] == [body]
    assert got[0].reconsume_times == 2 and got[0].properties["k"] == "v"
    assert notified == ["orders"]
    assert [op for op, _ in j.replay(0)] == ["retry", "tfire"]


def test_after_a_restart_only_unfired_timers_are_pending(stores, store: MessageStore) -> None:  # noqa: F811
    ts, _, _ = service(store)
    t = now_ms()
    fired = ts.schedule(msg(b"fired"), t - 1)
    ts.schedule(msg(b"waiting"), t + HOUR_MS)
    ts.fire_due()

    s2 = stores.reopen(store)
    ts2, j2, notified = service(s2)
    for op, data in j2.replay(0):  # what the broker does on start: replay, then rebuild
        ts2.apply(op, data)
    ts2.rebuild()
    assert ts2.pending == 1
    assert ts2.tracker.is_done(fired.queue_offset)
    assert ts2.fire_due() == 0
    assert [m.body for m in read_all(s2, "orders", 1)] == [b"fired"]  # not fired twice
    assert notified == []


def test_a_timer_set_before_a_crash_still_fires_after_it(stores, store: MessageStore) -> None:  # noqa: F811
    ts, _, _ = service(store)
    ts.schedule(msg(b"due soon"), now_ms() - 1)  # never fired: the broker went down first
    s2 = stores.reopen(store)
    ts2, _, notified = service(s2)
    ts2.rebuild()
    assert ts2.fire_due() == 1
    assert [m.body for m in read_all(s2, "orders", 1)] == [b"due soon"]
    assert notified == ["orders"]


def test_a_timer_the_journal_says_fired_is_not_fired_again(store: MessageStore) -> None:
    """A fire replayed from the journal (another instance fired it) after the timer was scheduled."""
    ts, _, notified = service(store)
    r = ts.schedule(msg(b"once"), now_ms() - 1)
    ts.apply("tfire", {"tq": r.queue_offset})
    assert ts.fire_due() == 0
    assert read_all(store, "orders", 1) == [] and notified == []
    assert ts.pending == 0


def test_apply_ignores_other_journal_ops(store: MessageStore) -> None:
    ts, _, _ = service(store)
    ts.apply("ack", {"tq": 0})
    assert not ts.tracker.is_done(0)
    ts.apply("tfire", {"tq": "0"})
    assert ts.tracker.is_done(0)


def test_a_parked_record_without_a_destination_is_skipped(store: MessageStore) -> None:
    store.put(Message(TIMER_TOPIC, b"stray", queue_id=0))  # no real topic: nowhere to go
    ts, _, notified = service(store)
    ts.rebuild()
    assert ts.pending == 1
    assert ts.fire_due() == 0
    assert ts.tracker.is_done(0) and notified == []


async def test_the_running_service_fires_by_itself(store: MessageStore) -> None:
    fired = asyncio.Event()
    topics: list[str] = []

    def notify(topic: str) -> None:
        topics.append(topic)
        fired.set()

    ts, _, _ = service(store, notify)
    ts.schedule(msg(b"far"), now_ms() + HOUR_MS)
    ts.start()
    try:
        await asyncio.sleep(0.02)  # asleep towards the far timer
        ts.schedule(msg(b"near"), now_ms() + 20)  # earlier: wakes the loop
        await asyncio.wait_for(fired.wait(), 10)
        assert topics == ["orders"]
        assert [m.body for m in read_all(store, "orders", 1)] == [b"near"]
        assert ts.pending == 1
    finally:
        await ts.stop()
