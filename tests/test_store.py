"""MessageStore: round trips, multi-dispatch, links, the read path, indexes, restart, sync flush.

Every test runs a real store in a temp dir with small geometry (64 KiB
segments, 64-entry consume-queue files, tiny index files) so that segment,
consume-queue and index rolls happen within a few hundred messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import pytest

from core_broker import record
from core_broker.config import FlushMode
from core_broker.errors import (
    BadRequestError,
    MessageTooLargeError,
    StoreClosedError,
    UnimqError,
)
from core_broker.filter import compile_filter
from core_broker.message_store import MessageStore, iter_messages
from core_broker.model import (
    DispatchTarget,
    FilterExpression,
    FilterType,
    GetStatus,
    Message,
    MessageType,
    Protocol,
    PutStatus,
)
from core_broker.topic_config import TopicConfig

from store_helpers import (  # noqa: F401  (stores is a fixture)
    SEG,
    assert_same_message,
    body_for,
    next_ms,
    read_all,
    record_size,
    segment_paths,
    stores,
    walk_segment,
)

ODD_PROPS = {
    "plain": "value",
    "unicode-ключ": "значение ✓ 日本語",
    "emoji": "😀🚀",
    "empty": "",
    "eq=semi;colon:": "a=b;c:d",
    "nul": "a\x00b",
    "newline\n": "line1\nline2\r\n",
    "separators\x01\x02": "\x01\x02\x1f",
    "long": "x" * 5000,
    "mqtt.topic": "a/b/c",
}


def _full_message(**over) -> Message:
    kw = dict(
        tag="TagA",
        keys=("order-1", "user-ü", "k with space"),
        properties=dict(ODD_PROPS),
        message_group="group-1",
        delivery_time_ms=1_900_000_000_123,
        born_timestamp_ms=1_700_000_000_456,
        born_host="10.0.0.7:51234",
        protocol=Protocol.MQTT,
        queue_id=3,
        reconsume_times=2,
    )
    kw.update(over)
    topic = kw.pop("topic", "T-full")
    return Message(topic, kw.pop("body", bytes(range(256)) * 3), **kw)


# ============================================================================ round trip


def test_round_trip_every_field(stores) -> None:
    s = stores.open()
    sent = _full_message()
    t0 = int(time.time() * 1000)
    r = s.put(sent)
    t1 = int(time.time() * 1000)
    assert r.status == PutStatus.PUT_OK
    assert (r.queue_id, r.queue_offset, r.commitlog_offset) == (3, 0, 0)
    assert r.store_size == s.commitlog.write_pos
    # server-derived id: version + store id + commitlog offset, stable and decodable
    assert len(r.message_id) == 34 and r.message_id == f"02{s.store_id}{0:016X}"

    g = s.get("T-full", 3, 0, 10)
    assert g.status == GetStatus.FOUND and len(g.messages) == 1
    assert (g.next_offset, g.min_offset, g.max_offset) == (1, 0, 1)
    m = g.messages[0]
    assert_same_message(m, sent, message_id=r.message_id)
    assert m.topic == "T-full" and m.queue_id == 3 and m.queue_offset == 0
    assert m.protocol == "mqtt"
    assert m.born_timestamp_ms == 1_700_000_000_456
    assert m.commitlog_offset == r.commitlog_offset and m.store_size == r.store_size
    assert t0 <= m.store_timestamp_ms <= t1
    assert m.extra_dispatch == ()
    assert isinstance(m.body, bytes)

    # the other read doors agree
    for other in (s.read_at("T-full", 3, 0), s.read_phys(r.commitlog_offset), s.query_by_id(r.message_id)):
        assert other is not None
        assert_same_message(other, sent, message_id=r.message_id)


def test_round_trip_minimal_and_empty_body(stores) -> None:
    s = stores.open()
    r_empty = s.put(Message("T", b""))
    r_zero = s.put(Message("T", b"\x00" * 100))
    r_bin = s.put(Message("T", os.urandom(4096)))
    msgs = s.get("T", 0, 0, 10).messages
    assert [m.body for m in msgs] == [b"", b"\x00" * 100, s.read_phys(r_bin.commitlog_offset).body]
    m = msgs[0]
    assert m.tag is None and m.keys == () and m.properties == {} and m.message_group is None
    assert m.delivery_time_ms == 0 and m.reconsume_times == 0 and m.born_host == ""
    assert m.protocol == "internal"
    # born time defaults to the store time when the producer gave none
    assert m.born_timestamp_ms == m.store_timestamp_ms > 0
    assert [x.message_id for x in msgs] == [r_empty.message_id, r_zero.message_id, r_bin.message_id]
    assert len({r_empty.message_id, r_zero.message_id, r_bin.message_id}) == 3


@pytest.mark.parametrize("proto", list(Protocol))
def test_protocol_is_recorded(stores, proto: Protocol) -> None:
    s = stores.open()
    s.put(Message("T", b"x", protocol=proto))
    s.put(Message("T", b"y", protocol=proto.value, tag="t"))  # the plain string works too
    assert [m.protocol for m in s.get("T", 0, 0, 5).messages] == [proto.value, proto.value]


def test_client_message_id_is_kept_and_indexed(stores) -> None:
    s = stores.open()
    cid = "client-chosen-id-ü-123"
    r = s.put(Message("T", b"body", message_id=cid))
    assert r.message_id == cid
    m = s.get("T", 0, 0, 1).messages[0]
    assert m.message_id == cid
    q = s.query_by_id(cid)
    assert q is not None and q.body == b"body" and q.commitlog_offset == r.commitlog_offset
    # the position-derived id does not name a client-id message
    assert s.query_by_id(f"02{s.store_id}{r.commitlog_offset:016X}") is None


def test_user_flags_round_trip_and_never_turn_a_message_into_a_link(stores) -> None:
    s = stores.open()
    for flags in (0, 0x2, 0x1, 0xFFFF_FFFF):
        r = s.put(Message("T", b"f%d" % flags, flags=flags))
        m = s.read_phys(r.commitlog_offset)
        assert m.body == b"f%d" % flags
        assert m.message_id == r.message_id
    assert [m.body for m in s.get("T", 0, 0, 10).messages] == [b"f0", b"f2", b"f1", b"f4294967295"]


def test_re_putting_a_message_read_through_a_link_stores_a_real_copy(stores) -> None:
    """A retry re-puts what a consumer got; what came through a link must not stay a link."""
    s = stores.open()
    r = s.put(Message("T", b"origin", tag="x"))
    s.put_link(r.commitlog_offset, "DELAY", 0)
    got = s.get("DELAY", 0, 0, 1).messages[0]
    got.topic, got.queue_id, got.extra_dispatch, got.message_id = "RETRY", 0, (), ""
    r2 = s.put(got)
    again = s.get("RETRY", 0, 0, 1).messages
    assert len(again) == 1 and again[0].body == b"origin" and again[0].commitlog_offset == r2.commitlog_offset


def test_queue_and_commitlog_offsets(stores) -> None:
    s = stores.open()
    last_phys = -1
    expect: dict[tuple[str, int], int] = {}
    ids = set()
    for i in range(300):
        topic = f"T{i % 3}"
        qid = i % 4
        r = s.put(Message(topic, body_for(i), queue_id=qid))
        key = (topic, qid)
        assert r.queue_offset == expect.get(key, 0)
        expect[key] = r.queue_offset + 1
        assert r.commitlog_offset > last_phys
        last_phys = r.commitlog_offset
        ids.add(r.message_id)
    assert len(ids) == 300
    for (topic, qid), n in expect.items():
        assert s.max_offset(topic, qid) == n and s.min_offset(topic, qid) == 0
        got = read_all(s, topic, qid)
        assert [m.queue_offset for m in got] == list(range(n))
    assert s.queue_ids("T0") == [0, 1, 2, 3]
    assert s.queue_topics() == ["T0", "T1", "T2"]
    assert [m.body for m in iter_messages(s, "T1", 1)] == [m.body for m in read_all(s, "T1", 1)]


# ============================================================================ batch & async


def _mixed_batch(n: int) -> list[Message]:
    out = []
    for i in range(n):
        kw: dict = {"queue_id": i % 2, "tag": f"t{i % 3}"}
        if i % 7 == 3:
            kw["keys"] = (f"bk{i}",)
        if i % 11 == 5:
            kw["message_id"] = f"batch-client-{i}"
        if i % 13 == 6:
            kw["extra_dispatch"] = (DispatchTarget("BX", 0),)
        if i % 5 == 1:
            kw["properties"] = {"i": str(i), "ü": "✓"}
        out.append(Message("B", body_for(i), **kw))
    return out


def _check_batch(s: MessageStore, msgs: list[Message], results) -> None:
    assert len(results) == len(msgs)
    assert all(r.status == PutStatus.PUT_OK for r in results)
    phys = [r.commitlog_offset for r in results]
    assert phys == sorted(phys) and len(set(phys)) == len(phys)
    for m, r in zip(msgs, results):
        got = s.read_at(m.topic, m.queue_id, r.queue_offset)
        assert got is not None
        assert_same_message(got, m, message_id=r.message_id)
        assert got.commitlog_offset == r.commitlog_offset
        if m.extra_dispatch:
            assert len(r.extra_offsets) == 1
            x = s.read_at("BX", 0, r.extra_offsets[0])
            assert x is not None and x.body == m.body
        if m.message_id:
            assert s.query_by_id(m.message_id).body == m.body
        for k in m.keys:
            assert [q.body for q in s.query_by_key("B", k)] == [m.body]
    for qid in (0, 1):
        offs = [r.queue_offset for m, r in zip(msgs, results) if m.queue_id == qid]
        assert not offs or offs == list(range(offs[0], offs[0] + len(offs)))


def test_put_batch_mixed_messages(stores) -> None:
    s = stores.open()
    s.put(Message("B", b"before", queue_id=0))
    msgs = _mixed_batch(400)  # ~70 KiB: crosses a segment and several CQ files
    results = s.put_batch(msgs)
    _check_batch(s, msgs, results)
    assert results[0].queue_offset == 1  # continues after the single put
    assert len(segment_paths(s.root)) >= 2
    assert s.put_batch([]) == []


def test_put_batch_larger_than_a_segment_rolls_cleanly(stores) -> None:
    s = stores.open()
    msgs = [Message("B", body_for(i, 1500), queue_id=0) for i in range(200)]  # ~300 KiB in one call
    results = s.put_batch(msgs)
    _check_batch(s, msgs, results)
    assert len(segment_paths(s.root)) >= 5
    for r in results:
        # records never straddle a segment boundary
        assert r.commitlog_offset // SEG == (r.commitlog_offset + r.store_size - 1) // SEG


async def test_put_async_and_put_batch_async(stores) -> None:
    s = stores.open()
    sent = _full_message(queue_id=0)
    r = await s.put_async(sent)
    assert r.status == PutStatus.PUT_OK
    assert_same_message(s.get("T-full", 0, 0, 1).messages[0], sent, message_id=r.message_id)
    msgs = _mixed_batch(120)
    results = await s.put_batch_async(msgs)
    _check_batch(s, msgs, results)


async def test_many_concurrent_put_async(stores) -> None:
    s = stores.open()
    rs = await asyncio.wait_for(
        asyncio.gather(*(s.put_async(Message("A", body_for(i), queue_id=i % 4)) for i in range(500))), 30
    )
    per_q: dict[int, list[int]] = {}
    for r in rs:
        per_q.setdefault(r.queue_id, []).append(r.queue_offset)
    for offs in per_q.values():
        assert sorted(offs) == list(range(len(offs)))


# ============================================================================ segments & sizes


def test_segment_rolls_records_never_split(stores) -> None:
    s = stores.open()
    rng = random.Random(7)
    sent = []
    for i in range(1500):
        body = rng.randbytes(rng.randint(0, 900))
        r = s.put(Message("R", body, queue_id=i % 3, tag=f"t{i % 5}", keys=(f"k{i}",)))
        sent.append((r, body))
    paths = segment_paths(s.root)
    assert len(paths) >= 10
    assert [int(p.name) for p in paths] == [i * SEG for i in range(len(paths))]
    # walk every segment: whole records back to back, a blank filler (or < 12 spare bytes)
    # at the end of every full segment, and every put record found exactly once
    found = set()
    for idx, p in enumerate(paths):
        recs, end = walk_segment(p)
        base = int(p.name)
        for off, kind, size in recs:
            assert off + size <= SEG
            if kind == 1:
                found.add(base + off)
        if idx < len(paths) - 1:
            assert recs[-1][1] == 2 or SEG - end < 12, f"segment {p.name} not closed"
        else:
            assert base + end == s.commitlog.write_pos
    assert found == {r.commitlog_offset for r, _ in sent}
    for r, body in sent:
        m = s.read_phys(r.commitlog_offset)
        assert m.body == body and m.message_id == r.message_id
    for q in range(3):
        assert [m.body for m in read_all(s, "R", q)] == [b for i, (_, b) in enumerate(sent) if i % 3 == q]


def test_a_segment_tail_under_12_bytes_is_skipped(stores) -> None:
    """A record that leaves 1..11 bytes at a segment's end: no room for a blank filler."""
    s = stores.open()
    hdr = record_size("Z", b"")
    first = b"a" * (SEG // 2 - hdr)
    s.put(Message("Z", first))
    used = s.commitlog.write_pos
    second = b"b" * (SEG - used - 5 - hdr)  # leaves exactly 5 bytes
    s.put(Message("Z", second))
    assert SEG - s.commitlog.write_pos == 5
    r3 = s.put(Message("Z", b"third"))
    assert r3.commitlog_offset == SEG
    s = stores.reopen(s)
    assert [m.body for m in read_all(s, "Z", 0)] == [first, second, b"third"]
    assert s.put(Message("Z", b"fourth")).queue_offset == 3


def test_messages_near_max_message_size(stores) -> None:
    s = stores.open()
    limit = s.config.max_message_size
    assert limit == SEG // 2  # capped so that any allowed body fits a segment
    s.put(Message("M", b"small"))
    big = os.urandom(limit)
    r1 = s.put(Message("M", big, tag="big", keys=("big",), properties={"p": "v"}))
    r2 = s.put(Message("M", big[:-1]))
    r3 = s.put(Message("M", big))  # forces a roll: two max bodies cannot share a segment
    assert r3.commitlog_offset // SEG > r1.commitlog_offset // SEG
    for r, b in ((r1, big), (r2, big[:-1]), (r3, big)):
        assert s.read_phys(r.commitlog_offset).body == b
    pos = s.commitlog.write_pos
    with pytest.raises(MessageTooLargeError) as ei:
        s.put(Message("M", big + b"!"))
    assert ei.value.code == "MESSAGE_BODY_TOO_LARGE"
    with pytest.raises(MessageTooLargeError):
        s.put_batch([Message("M", b"ok-in-batch"), Message("M", big + b"!")])
    # the batch wrote the message before the too-large one, the too-large one not at all
    assert [m.body for m in read_all(s, "M", 0)][-1] == b"ok-in-batch"
    assert s.commitlog.write_pos > pos
    pos = s.commitlog.write_pos
    with pytest.raises(MessageTooLargeError):
        asyncio.run(s.put_async(Message("M", big + b"!")))
    assert s.commitlog.write_pos == pos
    assert s.put(Message("M", b"after")).queue_offset == 5
    assert [m.body for m in read_all(s, "M", 0)] == [b"small", big, big[:-1], big, b"ok-in-batch", b"after"]


def test_record_larger_than_a_segment_is_refused_cleanly(stores) -> None:
    """A body under the limit with huge properties must not break the log."""
    s = stores.open()
    s.put(Message("M", b"first"))
    pos = s.commitlog.write_pos
    segs = len(segment_paths(s.root))
    with pytest.raises(MessageTooLargeError):
        s.put(Message("M", b"x" * 1000, properties={"huge": "p" * SEG}))
    with pytest.raises(MessageTooLargeError):
        s.put_batch([Message("M", b"x", properties={"huge": "p" * SEG})])
    assert s.commitlog.write_pos == pos and len(segment_paths(s.root)) == segs
    assert s.max_offset("M", 0) == 1
    s.put(Message("M", b"second"))
    assert [m.body for m in read_all(s, "M", 0)] == [b"first", b"second"]


def test_put_after_shutdown_is_refused(stores) -> None:
    s = stores.open()
    s.put(Message("T", b"x"))
    s.shutdown()
    with pytest.raises(StoreClosedError):
        s.put(Message("T", b"y"))
    with pytest.raises(StoreClosedError):
        s.put_batch([Message("T", b"y")])
    assert isinstance(StoreClosedError(), UnimqError)


# ============================================================================ multi-dispatch


def test_multi_dispatch_stores_the_body_once(stores) -> None:
    s = stores.open()
    s.put(Message("X", b"pre-1", queue_id=1))  # so target offsets are not all zero
    s.put(Message("mqtt-wild", b"pre-2", queue_id=0))
    targets = (DispatchTarget("mqtt-wild", 0), DispatchTarget("amqp-q1", 2), DispatchTarget("X", 1))
    sent = Message("src", os.urandom(3000), queue_id=0, tag="TagW", keys=("kw",), properties={"mqtt.topic": "a/b"},
                   extra_dispatch=targets)
    before = s.commitlog.write_pos
    r = s.put(sent)
    assert s.commitlog.write_pos - before == r.store_size  # one record for four queues
    assert r.store_size < 3000 + 400
    assert r.extra_offsets == (1, 0, 1)
    reads = [s.get("src", 0, 0, 5).messages[0]]
    for (t, q), off in zip(targets, r.extra_offsets):
        g = s.get(t, q, off, 5)
        assert g.status == GetStatus.FOUND and len(g.messages) == 1
        m = g.messages[0]
        assert m.topic == t and m.queue_id == q and m.queue_offset == off
        reads.append(m)
    for m in reads:
        assert m.body == sent.body and m.message_id == r.message_id
        assert m.commitlog_offset == r.commitlog_offset and m.properties == {"mqtt.topic": "a/b"}
        assert m.tag == "TagW"
    assert reads[0].extra_dispatch == targets
    # a second message continues every target's offsets
    r2 = s.put(Message("src", b"two", extra_dispatch=targets))
    assert r2.queue_offset == 1 and r2.extra_offsets == (2, 1, 2)
    # tag filters apply in the extra queues too (from the consume-queue tag hash)
    flt = compile_filter(FilterExpression("TagW"))
    assert [m.body for m in s.get("amqp-q1", 2, 0, 10, flt).messages] == [sent.body]
    # only the primary put indexes the key, once
    assert [m.commitlog_offset for m in s.query_by_key("src", "kw")] == [r.commitlog_offset]


def test_multi_dispatch_rejects_duplicate_targets_without_writing(stores) -> None:
    s = stores.open()
    s.put(Message("src", b"a"))
    pos = s.commitlog.write_pos
    bad = [
        Message("src", b"dup", extra_dispatch=(DispatchTarget("o", 0), DispatchTarget("o", 0))),
        Message("src", b"self", queue_id=0, extra_dispatch=(DispatchTarget("src", 0),)),
        Message("src", b"self2", queue_id=1, extra_dispatch=(("o", 1), ("src", 1))),
    ]
    for m in bad:
        with pytest.raises(BadRequestError):
            s.put(m)
        with pytest.raises(BadRequestError):
            s.put_batch([m])
    assert s.commitlog.write_pos == pos
    assert s.max_offset("src", 0) == 1 and s.max_offset("o", 0) == 0 and s.max_offset("src", 1) == 0
    r = s.put(Message("src", b"b", extra_dispatch=(("o", 0), ("o", 1), ("src", 1))))
    assert r.queue_offset == 1 and r.extra_offsets == (0, 0, 0)


# ============================================================================ links


def test_put_link_reads_the_origin_with_merged_properties(stores) -> None:
    s = stores.open()
    body = os.urandom(10_000)
    origin = Message("orig", body, tag="TagL", keys=("lk",), properties={"a": "origin", "b": "origin"},
                     message_group="g", born_host="h:1", protocol="amqp", born_timestamp_ms=1234)
    ro = s.put(origin)
    s.put(Message("DELAY", b"unrelated"))
    before = s.commitlog.write_pos
    rl = s.put_link(ro.commitlog_offset, "DELAY", 0, properties={"b": "link", "c": "link"}, reconsume_times=3)
    assert s.commitlog.write_pos - before == rl.store_size < 1000  # the body was not copied
    assert rl.queue_offset == 1 and rl.message_id == ro.message_id
    m = s.get("DELAY", 0, 1, 5).messages[0]
    assert m.body == body and m.message_id == ro.message_id and m.tag == "TagL"
    assert m.properties == {"a": "origin", "b": "link", "c": "link"}
    assert m.reconsume_times == 3 and m.queue_offset == 1 and m.topic == "DELAY"
    assert m.keys == ("lk",) and m.message_group == "g" and m.born_host == "h:1" and m.born_timestamp_ms == 1234
    assert m.flags & record.FLAG_LINK
    # link of a link points at the real origin; properties accumulate
    rl2 = s.put_link(rl.commitlog_offset, "RETRY", 2, properties={"d": "link2"})
    assert s.commitlog.link_origin(rl2.commitlog_offset)[0] == ro.commitlog_offset
    m2 = s.read_at("RETRY", 2, 0)
    assert m2.body == body and m2.message_id == ro.message_id
    assert m2.properties == {"a": "origin", "b": "link", "c": "link", "d": "link2"}
    # the origin itself is untouched, and links are not indexed as extra copies
    assert s.get("orig", 0, 0, 1).messages[0].properties == {"a": "origin", "b": "origin"}
    assert [x.commitlog_offset for x in s.query_by_key("orig", "lk")] == [ro.commitlog_offset]
    assert s.query_by_id(ro.message_id).properties == {"a": "origin", "b": "origin"}
    # tag filter on the link's queue uses the origin's tag
    assert [x.queue_offset for x in s.get("DELAY", 0, 0, 5, compile_filter(FilterExpression("TagL"))).messages] == [1]
    # survives a restart
    s = stores.reopen(s)
    assert s.read_at("RETRY", 2, 0).properties["d"] == "link2"
    assert s.read_at("DELAY", 0, 1).body == body


def test_put_link_to_client_id_message(stores) -> None:
    s = stores.open()
    ro = s.put(Message("o", b"cid-body", message_id="my-id"))
    rl = s.put_link(ro.commitlog_offset, "L", 0)
    assert rl.message_id == "my-id"
    assert s.read_at("L", 0, 0).message_id == "my-id"


# ============================================================================ get()


def test_get_statuses_and_next_offset(stores) -> None:
    s = stores.open()
    g = s.get("nope", 0, 0, 10)
    assert g.status == GetStatus.NO_MESSAGE_IN_QUEUE and g.messages == []
    assert (g.min_offset, g.max_offset) == (0, 0)
    for i in range(150):  # three consume-queue files
        s.put(Message("G", body_for(i)))
    g = s.get("G", 0, 0, 10)
    assert g.status == GetStatus.FOUND and [m.queue_offset for m in g.messages] == list(range(10))
    assert (g.next_offset, g.min_offset, g.max_offset) == (10, 0, 150)
    g = s.get("G", 0, 60, 10)  # across a consume-queue file boundary
    assert [m.queue_offset for m in g.messages] == list(range(60, 70)) and g.next_offset == 70
    assert [m.body for m in g.messages] == [body_for(i) for i in range(60, 70)]
    g = s.get("G", 0, 145, 10)
    assert [m.queue_offset for m in g.messages] == list(range(145, 150)) and g.next_offset == 150
    g = s.get("G", 0, 150, 10)
    assert g.status == GetStatus.OFFSET_OVERFLOW_ONE and g.messages == [] and g.next_offset == 150
    g = s.get("G", 0, 151, 10)
    assert g.status == GetStatus.OFFSET_OVERFLOW_BADLY and g.next_offset == 150
    g = s.get("G", 0, 10_000, 10)
    assert g.status == GetStatus.OFFSET_OVERFLOW_BADLY and g.next_offset == 150
    g = s.get("G", 0, -1, 10)
    assert g.status == GetStatus.OFFSET_MOVED and g.next_offset == 0
    g = s.get("G", 0, 0, 1000)
    assert len(g.messages) == 150 and g.next_offset == 150
    assert s.get("G", 1, 0, 1).status == GetStatus.NO_MESSAGE_IN_QUEUE


def test_get_with_tag_filter(stores) -> None:
    s = stores.open()
    tags = ["A", "B", "C", None, "AB", "a"]
    for i in range(300):
        s.put(Message("F", body_for(i), tag=tags[i % len(tags)]))
    flt = compile_filter(FilterExpression("A || B"))
    got = read_all(s, "F", 0, flt=flt)
    assert [m.queue_offset for m in got] == [i for i in range(300) if tags[i % 6] in ("A", "B")]
    assert all(m.tag in ("A", "B") for m in got)
    g = s.get("F", 0, 0, 3, flt)
    assert [m.queue_offset for m in g.messages] == [0, 1, 6]
    assert g.next_offset == 7  # just past the last returned message
    g = s.get("F", 0, 2, 1, flt)  # offsets 2..5 do not match: they are skipped in one call
    assert [m.queue_offset for m in g.messages] == [6] and g.next_offset == 7
    # nothing matches -> NO_MATCHED_MESSAGE and the offset still advances past what was scanned
    g = s.get("F", 0, 0, 10, compile_filter(FilterExpression("Nope")))
    assert g.status == GetStatus.NO_MATCHED_MESSAGE and g.messages == [] and g.next_offset == 300
    for expr in ("*", "", "A || *"):
        assert len(s.get("F", 0, 0, 500, compile_filter(FilterExpression(expr))).messages) == 300
    assert [m.queue_offset for m in s.get("F", 0, 0, 4, compile_filter(FilterExpression(" a "))).messages] == [
        5, 11, 17, 23
    ]


def test_get_with_sql92_filter(stores) -> None:
    s = stores.open()
    for i in range(100):
        props = {"n": str(i), "color": ["red", "green", "blue"][i % 3]}
        if i % 10 == 0:
            props.pop("n")
        s.put(Message("S", body_for(i), tag="even" if i % 2 == 0 else "odd", properties=props))
    flt = compile_filter(FilterExpression("n > 90 AND color IN ('red', 'blue')", FilterType.SQL92))
    got = read_all(s, "S", 0, flt=flt)
    assert [m.queue_offset for m in got] == [i for i in range(91, 100) if i % 3 in (0, 2)]
    flt = compile_filter(FilterExpression("TAGS = 'even' AND n IS NULL", FilterType.SQL92))
    assert [m.queue_offset for m in read_all(s, "S", 0, flt=flt)] == list(range(0, 100, 10))
    flt = compile_filter(FilterExpression("NOT (n < 50)", FilterType.SQL92))  # unknown for missing n
    got = s.get("S", 0, 0, 5, flt)
    assert [m.queue_offset for m in got.messages] == [51, 52, 53, 54, 55] and got.next_offset == 56


# ============================================================================ index


def test_query_by_key_time_ranges_and_many_messages(stores) -> None:
    s = stores.open()
    rs = []
    ts = []
    for i in range(6):
        r = s.put(Message("K", body_for(i), keys=("shared", f"own-{i}")))
        s.put(Message("other", b"o", keys=("shared",)))
        rs.append(r)
        ts.append(s.read_phys(r.commitlog_offset).store_timestamp_ms)
        next_ms(ts[-1])
    hits = s.query_by_key("K", "shared")
    assert sorted(m.commitlog_offset for m in hits) == [r.commitlog_offset for r in rs]
    assert all(m.topic == "K" for m in hits)
    assert len(s.query_by_key("other", "shared")) == 6
    assert s.query_by_key("K", "own-3")[0].body == body_for(3)
    assert s.query_by_key("K", "missing") == []
    assert s.query_by_key("nope", "shared") == []
    # time range [ts[2], ts[4]] holds exactly messages 2..4 (distinct ms by construction)
    hits = s.query_by_key("K", "shared", ts[2], ts[4])
    assert sorted(m.commitlog_offset for m in hits) == [r.commitlog_offset for r in rs[2:5]]
    assert s.query_by_key("K", "shared", ts[5] + 1) == []
    assert s.query_by_key("K", "shared", 0, ts[0] - 1) == []
    assert len(s.query_by_key("K", "shared", max_count=2)) == 2


def test_index_rolls_and_queries_cover_every_file(stores) -> None:
    s = stores.open(index_entries_per_file=16, index_slots=8)
    rs = {}
    for i in range(200):
        cid = f"cid-{i}" if i % 2 else ""
        r = s.put(Message("K", body_for(i), keys=(f"k{i}", "all" if i < 20 else f"x{i}"), message_id=cid))
        rs[i] = r
    index_files = [p for p in (s.root / "index").iterdir() if p.name.isdigit()]
    assert len(index_files) >= 20
    for i in (0, 1, 17, 99, 150, 199):
        got = s.query_by_key("K", f"k{i}")
        assert [m.body for m in got] == [body_for(i)]
        m = s.query_by_id(rs[i].message_id)
        assert m is not None and m.body == body_for(i)
    assert sorted(m.commitlog_offset for m in s.query_by_key("K", "all", max_count=64)) == sorted(
        rs[i].commitlog_offset for i in range(20)
    )
    s = stores.reopen(s)
    assert s.query_by_id("cid-151").body == body_for(151)
    assert [m.body for m in s.query_by_key("K", "k3")] == [body_for(3)]


def test_query_by_id_unknown_ids_return_none(stores) -> None:
    s = stores.open()
    r = s.put(Message("T", b"x" * 100))
    s.put(Message("T", b"y", message_id="known"))
    for i in range(3):  # past the first segment, so its tail is below the write position
        s.put(Message("T", b"z" * 30_000))
    assert s.commitlog.write_pos > SEG
    assert s.query_by_id(r.message_id).body == b"x" * 100
    prefix = f"02{s.store_id}"
    unknown = [
        "",
        "unknown-client-id",
        "02" + "0" * 16 + f"{r.commitlog_offset:016X}",  # another store's server id
        prefix + f"{1:016X}",  # inside a record
        prefix + f"{5:016X}",
        prefix + f"{s.commitlog.write_pos:016X}",  # past the end
        prefix + f"{SEG - 4:016X}",  # the last bytes of a segment (blank filler)
        prefix + f"{SEG - 12:016X}",
        prefix + f"{10 * SEG:016X}",  # no such segment
        prefix + "ZZZZZZZZZZZZZZZZ",  # not hex
        prefix + "FFFFFFFFFFFFFFFF",
        r.message_id.lower(),
    ]
    for mid in unknown:
        assert s.query_by_id(mid) is None, mid


# ============================================================================ restart


def test_restart_after_clean_stop(stores) -> None:
    s = stores.open()
    assert (s.root / "abort").exists()
    s.topics.create(TopicConfig("T", queues=4, message_type=MessageType.FIFO))
    s.topics.create(TopicConfig("D", queues=1, message_type=MessageType.DELAY, perm=4, attributes={"x": "y"}))
    sent: dict[tuple[str, int], list[bytes]] = {}
    rs = []
    for i in range(700):
        q = i % 4
        m = Message("T", body_for(i), queue_id=q, tag=f"t{i % 3}", keys=(f"k{i}",),
                    message_id=f"c{i}" if i % 5 == 0 else "", extra_dispatch=(("W", 0),) if i % 9 == 0 else ())
        rs.append(s.put(m))
        sent.setdefault(("T", q), []).append(m.body)
        if i % 9 == 0:
            sent.setdefault(("W", 0), []).append(m.body)
    rl = s.put_link(rs[1].commitlog_offset, "D", 0, properties={"fired": "1"})
    s.offsets.commit("g1", "T", 0, 17)
    s.offsets.commit("g1", "T", 1, 5)
    s.offsets.commit("g@2", "topic@with@at", 3, 9)
    write_pos = s.commitlog.write_pos
    store_id = s.store_id
    s.shutdown()
    assert not (s.root / "abort").exists()
    cp = json.loads((s.root / "checkpoint").read_text())
    assert cp["clean_end"] == write_pos
    s.shutdown()  # idempotent

    s = stores.open(s.config)
    assert s.recovered_abnormally is False
    assert (s.root / "abort").exists()
    assert s.store_id == store_id and s.commitlog.write_pos == write_pos
    for (t, q), bodies in sent.items():
        assert [m.body for m in read_all(s, t, q)] == bodies
        assert s.max_offset(t, q) == len(bodies)
    assert s.read_at("D", 0, 0).properties == {"fired": "1"}
    assert s.read_at("D", 0, 0).message_id == rl.message_id
    for i in (0, 5, 333, 699):
        assert s.query_by_id(rs[i].message_id).body == body_for(i)
        assert [m.body for m in s.query_by_key("T", f"k{i}")] == [body_for(i)]
    tc = s.topics.require("T")
    assert (tc.queues, tc.message_type) == (4, MessageType.FIFO)
    d = s.topics.require("D")
    assert (d.message_type, d.perm, d.attributes, d.readable, d.writable) == (MessageType.DELAY, 4, {"x": "y"}, True,
                                                                             False)
    assert s.offsets.get("g1", "T", 0) == 17 and s.offsets.get("g1", "T", 1) == 5
    assert s.offsets.get("g@2", "topic@with@at", 3) == 9
    assert s.offsets.get("g1", "T", 2) is None
    # offsets continue: no queue offset is handed out twice
    r = s.put(Message("T", b"new", queue_id=0, extra_dispatch=(("W", 0),)))
    assert r.queue_offset == len(sent[("T", 0)]) and r.extra_offsets == (len(sent[("W", 0)]),)
    assert r.commitlog_offset >= write_pos
    assert s.read_at("T", 0, r.queue_offset).body == b"new"
    assert s.read_at("T", 0, r.queue_offset - 1).body == sent[("T", 0)][-1]
    s2 = stores.reopen(s)
    assert s2.recovered_abnormally is False
    assert s2.read_at("W", 0, r.extra_offsets[0]).body == b"new"


def test_restart_of_an_empty_store(stores) -> None:
    s = stores.reopen(stores.open())
    assert s.recovered_abnormally is False
    assert s.get("T", 0, 0, 1).status == GetStatus.NO_MESSAGE_IN_QUEUE
    r = s.put(Message("T", b"first"))
    assert (r.commitlog_offset, r.queue_offset) == (0, 0)
    s = stores.reopen(s)
    assert s.read_at("T", 0, 0).body == b"first"


ODD_TOPICS = ["a/b/c", "100%", "%41", "with space", "é-ü", "日本", "emoji😀", "UPPER", "lower", ".", "..", "-",
              "a.b", "%u0041", "x" * 200]


def test_odd_topic_names_survive_restart(stores) -> None:
    s = stores.open()
    for i, t in enumerate(ODD_TOPICS):
        s.put(Message(t, t.encode(), queue_id=i % 3))
    s = stores.reopen(s)
    assert sorted(s.queue_topics()) == sorted(ODD_TOPICS)
    for i, t in enumerate(ODD_TOPICS):
        g = s.get(t, i % 3, 0, 5)
        assert [m.body for m in g.messages] == [t.encode()], t
        assert g.messages[0].topic == t
    # nothing escaped the consume-queue directory
    assert sorted(p.name for p in s.root.iterdir()) == sorted(
        ["abort", "checkpoint", "commitlog", "config", "consumequeue", "index", "store_id"]
    )


def test_case_only_different_topics_are_separate_queues(stores) -> None:
    s = stores.open()
    s.put(Message("Topic", b"upper"))
    s.put(Message("topic", b"lower"))
    s = stores.reopen(s)
    assert [m.body for m in read_all(s, "Topic", 0)] == [b"upper"]
    assert [m.body for m in read_all(s, "topic", 0)] == [b"lower"]


# ============================================================================ sync flush


def test_sync_flush_put_returns_after_fsync(stores) -> None:
    s = stores.open(flush=FlushMode.SYNC, flush_interval_ms=1000)
    for i in range(50):
        r = s.put(Message("S", body_for(i), queue_id=i % 2))
        assert r.status == PutStatus.PUT_OK
        assert s._flush.flushed >= r.commitlog_offset + r.store_size
    rs = s.put_batch([Message("S", body_for(i)) for i in range(100)])
    assert all(r.status == PutStatus.PUT_OK for r in rs)
    assert s._flush.flushed >= rs[-1].commitlog_offset + rs[-1].store_size
    rl = s.put_link(rs[0].commitlog_offset, "L", 0)
    assert s._flush.flushed >= rl.commitlog_offset + rl.store_size
    assert len(read_all(s, "S", 0)) == 125


async def test_sync_flush_64_concurrent_put_async(stores) -> None:
    s = stores.open(flush=FlushMode.SYNC, flush_interval_ms=1000)

    async def one(i: int):
        r = await s.put_async(Message("C", body_for(i), queue_id=i % 8, keys=(f"k{i}",)))
        assert s._flush.flushed >= r.commitlog_offset + r.store_size
        return r

    for round_ in range(3):
        rs = await asyncio.wait_for(asyncio.gather(*(one(round_ * 64 + i) for i in range(64))), 30)
        assert len(rs) == 64 and all(r.status == PutStatus.PUT_OK for r in rs)
    rs = await asyncio.wait_for(
        asyncio.gather(*(s.put_batch_async([Message("C", body_for(i)) for i in range(5)]) for _ in range(64))), 30
    )
    last = max((r for batch in rs for r in batch), key=lambda r: r.commitlog_offset)
    assert s._flush.flushed >= last.commitlog_offset + last.store_size
    for q in range(8):
        offs = [m.queue_offset for m in read_all(s, "C", q)]
        assert offs == list(range(len(offs)))
    assert sum(s.max_offset("C", q) for q in range(8)) == 3 * 64 + 64 * 5


def test_sync_flush_from_many_threads(stores) -> None:
    import threading

    s = stores.open(flush=FlushMode.SYNC, flush_interval_ms=1000)
    results = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for i in range(20):
            r = s.put(Message("TH", body_for(w * 100 + i), queue_id=w % 4))
            with lock:
                results.append(r)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert len(results) == 320 and all(r.status == PutStatus.PUT_OK for r in results)
    end = max(r.commitlog_offset + r.store_size for r in results)
    assert s._flush.flushed >= end


def test_sync_flush_failure_is_reported_to_the_writer(stores) -> None:
    """fdatasync failing (EIO) reaches the caller as an error, and the store recovers after it."""
    import errno

    # Warm-up off: a warm-up piece's own fdatasync (not the one broken below) may legitimately
    # cover a record written just before it, and the put would then succeed.
    s = stores.open(flush=FlushMode.SYNC, flush_interval_ms=1000, commitlog_warmup="off")
    s.put(Message("E", b"ok-1"))
    real = s._flush._sync_commitlog
    broken = True

    def sync() -> None:
        if broken:
            raise OSError(errno.EIO, "Input/output error")
        real()

    s._flush._sync_commitlog = sync
    with pytest.raises(OSError):
        s.put(Message("E", b"not-durable"))

    async def one():
        return await asyncio.wait_for(s.put_async(Message("E", b"not-durable-async")), 10)

    with pytest.raises(OSError):
        asyncio.run(one())
    broken = False
    # the first put after the disk recovered must not see the old error
    r = s.put(Message("E", b"ok-2"))
    assert r.status == PutStatus.PUT_OK and s._flush.flushed >= r.commitlog_offset + r.store_size
    assert asyncio.run(one()).status == PutStatus.PUT_OK


def test_batch_of_max_size_messages(stores) -> None:
    s = stores.open()
    big = [os.urandom(s.config.max_message_size) for _ in range(3)]
    rs = s.put_batch([Message("M", b) for b in big])
    assert len({r.commitlog_offset // SEG for r in rs}) == 3
    assert [m.body for m in read_all(s, "M", 0)] == big


def test_concurrent_writers_and_readers_see_only_whole_messages(stores) -> None:
    """Readers follow queues while writers roll segments and consume-queue files under them."""
    import threading

    s = stores.open()
    n_per_writer = 400
    errors: list[BaseException] = []
    done = threading.Event()

    def body(q: int, seq: int) -> bytes:
        return (b"%d:%d:" % (q, seq)) * (1 + seq % 40)

    def writer(q: int) -> None:
        try:
            for seq in range(n_per_writer):
                if seq % 10 == 0:
                    s.put_batch([Message("CC", body(q, seq + j), queue_id=q) for j in range(10)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    seen: dict[int, int] = {}

    def reader(q: int) -> None:
        off = 0
        try:
            deadline = time.monotonic() + 60
            while off < n_per_writer and time.monotonic() < deadline:
                g = s.get("CC", q, off, 16)
                for m in g.messages:
                    assert m.queue_offset == off and m.body == body(q, off), (q, off)
                    off += 1
                if not g.messages:
                    time.sleep(0.0005)
            seen[q] = off
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(q,)) for q in range(4)]
    threads += [threading.Thread(target=reader, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
        assert not t.is_alive()
    done.set()
    assert not errors, errors[0]
    assert seen == {q: n_per_writer for q in range(4)}
    assert len(segment_paths(s.root)) >= 3


def test_offset_for_timestamp(stores) -> None:
    s = stores.open()
    stamps = []
    for i in range(5):
        r = s.put(Message("TS", b"%d" % i))
        stamps.append(s.read_phys(r.commitlog_offset).store_timestamp_ms)
        next_ms(stamps[-1])
    assert s.offset_for_timestamp("TS", 0, 0) == 0
    assert s.offset_for_timestamp("TS", 0, stamps[2]) == 2
    assert s.offset_for_timestamp("TS", 0, stamps[4] + 1) == 5
    assert s.offset_for_timestamp("nope", 0, 0) == 0


def test_topic_config_changes_persist(stores) -> None:
    from core_broker.errors import TopicExistsError, TopicNotFoundError

    s = stores.open()
    s.topics.create(TopicConfig("A", queues=2))
    s.topics.create(TopicConfig("B", queues=3, message_type=MessageType.TRANSACTION))
    s.topics.update(TopicConfig("A", queues=16, perm=2))
    s.topics.delete("B")
    with pytest.raises(TopicExistsError):
        s.topics.create(TopicConfig("A", message_type=MessageType.FIFO))
    assert s.topics.create(TopicConfig("A", queues=1), exist_ok=True).queues == 16
    s = stores.reopen(s)
    assert s.topics.get("B") is None
    a = s.topics.require("A")
    assert (a.queues, a.perm, a.writable, a.readable) == (16, 2, True, False)
    with pytest.raises(TopicNotFoundError):
        s.topics.require("B")
