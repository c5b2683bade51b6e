"""Parking a message in a system queue, and finding the unfinished ones again, on a real store."""

from __future__ import annotations

import os
import time

import pytest

from core_broker.model import Message
from core_broker.system_queue import SCAN_BATCH, park, unfinished
from core_broker.system_queue_tracker import SystemQueueTracker
from core_broker.system_topics import P_REAL_QUEUE, P_REAL_TOPIC, TIMER_TOPIC
from store_helpers import segment_paths, stores  # noqa: F401  (stores is a fixture)

pytestmark = pytest.mark.timeout(60)

SYS = "%SYS_TEST%"


def original() -> Message:
    return Message(
        "orders", b"the body", tag="TagA", keys=["k1", "k2"], properties={"user": "v"}, message_group="grp",
        born_timestamp_ms=1_700_000_000_000, born_host="10.0.0.9:5000", protocol="amqp", message_id="CLIENT-ID",
        queue_id=5, delivery_time_ms=0, reconsume_times=2,
    )


def test_park_keeps_the_message_and_records_where_it_really_goes() -> None:
    m = original()
    p = park(m, TIMER_TOPIC, {"__dt": "123"})
    assert p.topic == TIMER_TOPIC and p.queue_id == 0
    assert p.body is m.body  # not copied
    assert p.properties == {"user": "v", P_REAL_TOPIC: "orders", P_REAL_QUEUE: "5", "__dt": "123"}
    assert (p.tag, p.keys, p.message_group, p.born_timestamp_ms, p.born_host, p.protocol, p.message_id) == (
        "TagA", ("k1", "k2"), "grp", 1_700_000_000_000, "10.0.0.9:5000", "amqp", "CLIENT-ID"
    )
    assert m.properties == {"user": "v"}  # the producer's message is not changed


def test_park_fields_set_or_override_message_fields() -> None:
    p = park(original(), TIMER_TOPIC, {}, delivery_time_ms=99, reconsume_times=2, tag="Other")
    assert (p.delivery_time_ms, p.reconsume_times, p.tag) == (99, 2, "Other")


def test_the_real_destination_cannot_be_forged_by_the_producers_properties() -> None:
    m = original()
    m.properties[P_REAL_TOPIC] = "forged"
    m.properties[P_REAL_QUEUE] = "77"
    p = park(m, SYS, {"user": "system"})
    assert (p.properties[P_REAL_TOPIC], p.properties[P_REAL_QUEUE]) == ("orders", "5")
    assert p.properties["user"] == "system"  # extra wins over the message's own


def fill(store, n: int) -> list[int]:
    return [store.put(park(Message("dest", f"m{i}".encode(), queue_id=1), SYS, {})).queue_offset for i in range(n)]


def test_unfinished_yields_every_parked_message_not_done_in_queue_order(stores) -> None:  # noqa: F811
    s = stores.open()
    fill(s, 10)
    tracker = SystemQueueTracker()
    for off in (0, 1, 2, 5, 8):
        tracker.mark_done(off)
    got = list(unfinished(s, SYS, tracker))
    assert [m.queue_offset for m in got] == [3, 4, 6, 7, 9]
    assert [m.body for m in got] == [b"m3", b"m4", b"m6", b"m7", b"m9"]
    assert all(m.properties[P_REAL_TOPIC] == "dest" and m.properties[P_REAL_QUEUE] == "1" for m in got)


def test_unfinished_of_an_empty_or_finished_queue_is_empty(stores) -> None:  # noqa: F811
    s = stores.open()
    assert list(unfinished(s, SYS, SystemQueueTracker())) == []
    fill(s, 3)
    assert list(unfinished(s, SYS, SystemQueueTracker(low_water=3))) == []


def test_unfinished_reads_past_one_scan_batch(stores) -> None:  # noqa: F811
    s = stores.open()
    n = SCAN_BATCH + 40
    s.put_batch([park(Message("dest", b"x", queue_id=0), SYS, {}) for _ in range(n)])
    tracker = SystemQueueTracker(low_water=10)
    assert [m.queue_offset for m in unfinished(s, SYS, tracker)] == list(range(10, n))


def test_unfinished_starts_at_the_queues_first_offset_when_retention_removed_more(stores) -> None:  # noqa: F811
    """A low-water mark below what retention kept: the scan starts where the queue starts now."""
    s = stores.open(retention_hours=1.0)
    n = 200
    for i in range(n):  # ~200 KB: several 64 KiB segments
        s.put(park(Message("dest", bytes([i % 256]) * 1000, queue_id=0), SYS, {}))
    segs = segment_paths(s.root)
    assert len(segs) >= 3
    old = time.time() - 2 * 3600
    for path in segs[:2]:
        os.utime(path, (old, old))
    assert s.run_retention() == 2
    first = s.min_offset(SYS, 0)
    assert 0 < first < n
    tracker = SystemQueueTracker()  # low water 0: below what is left
    tracker.mark_done(first + 1)
    offsets = [m.queue_offset for m in unfinished(s, SYS, tracker)]
    assert offsets == [first] + list(range(first + 2, n))
