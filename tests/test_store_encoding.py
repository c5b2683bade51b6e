"""The put paths write exactly record.encode's bytes, whatever fields a message carries.

The batch path (put_batch, put_batch_async, grouped put_async) and the single
path encode door-shaped messages -- properties, keys, client ids, tags, extra
dispatch into light queues -- through record.encode_head with the body written
apart. These tests generate messages with every combination of fields, put
them through each path, and compare the stored bytes with ``record.encode``
and ``record.encode`` itself with a reference encoder written from the layout
in record.py's docstring. Then they check what the bytes are for: consume
queue entries in every dispatched queue, index lookups, recovery after a crash.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
from pathlib import Path

from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_broker import record
from core_broker.message_store import MessageStore
from core_broker.model import DispatchTarget, GetStatus, Message, PutStatus

from store_helpers import crash_copy, make_config, stores  # noqa: F401  (stores is a fixture)

TOPICS = ["orders", "sensors/room1", "ü-topic"]
LMQS = [DispatchTarget("%LMQ%sub-a", 0), DispatchTarget("%LMQ%sub-b", 0), DispatchTarget("%LMQ%sub-b", 1)]

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
_props = st.dictionaries(
    st.sampled_from(["mqtt_topic", "mqtt_qos", "ce_id", "ce_type", "ce_source", "ce_time", "amqp_rk", "ключ"]) | _text,
    _text,
    max_size=7,
)


@st.composite
def messages(draw) -> Message:
    return Message(
        draw(st.sampled_from(TOPICS)),
        draw(st.binary(max_size=300)),
        queue_id=draw(st.integers(0, 2)),
        tag=draw(st.none() | _text.filter(bool)),
        keys=draw(st.lists(_text.filter(bool), max_size=3)),
        message_id=draw(st.just("") | _text),
        properties=draw(_props),
        message_group=draw(st.none() | _text.filter(bool)),
        born_host=draw(st.just("") | st.just("10.0.0.7:51234")),
        born_timestamp_ms=draw(st.just(0) | st.integers(1, 2**40)),
        delivery_time_ms=draw(st.just(0) | st.integers(1, 2**40)),
        extra_dispatch=draw(st.lists(st.sampled_from(LMQS), unique=True, max_size=3)),
        reconsume_times=draw(st.integers(0, 16)),
        # any flags but the batch bit: a batch record is only ever made by the gateway's batch
        # codec (tested in test_batch_store.py); the link bit must never make a link (see below)
        flags=draw(st.integers(0, 0xFF)) & ~record.FLAG_BATCH,
        protocol=draw(st.sampled_from(["internal", "mqtt", "amqp", "http"])),
    )


def reference_encode(msg: Message, qo: int, phys: int, store_ts: int, dispatch: list[tuple[str, int, int]]) -> bytes:
    """The record layout of record.py's docstring, written out field by field."""
    enc = [s.encode() for s in (msg.topic, msg.born_host, msg.message_id, msg.tag or "", msg.message_group or "",
                                msg.protocol)]
    keys = "\0".join(msg.keys).encode()
    props = b"".join(struct.pack("<HI", len(k.encode()), len(v.encode())) + k.encode() + v.encode()
                     for k, v in msg.properties.items())
    disp = b"".join(struct.pack("<Hiq", len(t.encode()), q, o) + t.encode() for t, q, o in dispatch)
    fixed = struct.pack(
        "<IiqqqqqqiiHHHHHHIIII", msg.flags & ~record.FLAG_LINK, msg.queue_id, qo, phys,
        msg.born_timestamp_ms or store_ts, store_ts, msg.delivery_time_ms, -1, 0, msg.reconsume_times,
        *map(len, enc), len(keys), len(props), len(disp), len(msg.body),
    )
    tail = fixed + b"".join(enc) + keys + props + disp + msg.body
    return struct.pack("<III", len(tail) + 12, record.MAGIC_MESSAGE, crc32c(tail)) + tail


@settings(max_examples=300, deadline=None)
@given(messages(), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(1, 2**41))
def test_encode_matches_the_reference_layout(msg: Message, qo: int, phys: int, now: int) -> None:
    offsets = list(range(5, 5 + len(msg.extra_dispatch)))
    dispatch = record.encode_dispatch(msg.extra_dispatch, offsets)
    data = record.encode(msg, qo, phys, now, dispatch)
    ref = reference_encode(msg, qo, phys, now, [(t, q, o) for (t, q), o in zip(msg.extra_dispatch, offsets)])
    assert data == ref
    assert record.check(data, 0, len(data)) == (1, len(data))
    if msg.tag or msg.keys or msg.message_id or msg.properties or msg.message_group or msg.born_host or dispatch:
        assert record.encode_head(msg, qo, phys, now, dispatch) + msg.body == data


@settings(max_examples=300, deadline=None)
@given(messages(), st.integers(0, 2**40), st.integers(1, 2**41))
def test_decode_gives_back_what_was_encoded_every_time(msg: Message, qo: int, now: int) -> None:
    """decode shares decoded property blocks and dispatch targets between records: the
    second decode of the same bytes must equal the first, and a caller changing what
    it got must not change what the next decode returns."""
    offsets = list(range(7, 7 + len(msg.extra_dispatch)))
    data = record.encode(msg, qo, 0, now, record.encode_dispatch(msg.extra_dispatch, offsets))
    for _ in range(2):
        m = record.decode(data, 0)
        assert (m.topic, m.body, m.tag, m.keys, m.properties) == (msg.topic, msg.body, msg.tag, msg.keys,
                                                                 msg.properties)
        assert (m.message_group, m.born_host, m.protocol, m.queue_id, m.queue_offset) == (
            msg.message_group, msg.born_host, msg.protocol, msg.queue_id, qo)
        assert m.extra_dispatch == tuple(msg.extra_dispatch)
        m.properties["changed-by-a-caller"] = "x"


def _stored_bytes(s: MessageStore, phys: int, size: int) -> bytes:
    seg = s.commitlog.files.find(phys)
    return bytes(seg.mm[phys - seg.base : phys - seg.base + size])


def _check_stored(s: MessageStore, sent: list[Message], results) -> None:
    for m, r in zip(sent, results):
        assert r.status == PutStatus.PUT_OK
        got = s.read_phys(r.commitlog_offset)
        dispatch = record.encode_dispatch(m.extra_dispatch, r.extra_offsets)
        want = record.encode(m, r.queue_offset, r.commitlog_offset, got.store_timestamp_ms, dispatch)
        assert _stored_bytes(s, r.commitlog_offset, r.store_size) == want
        assert len(r.extra_offsets) == len(m.extra_dispatch)
        for (t, q), o in zip(((m.topic, m.queue_id), *m.extra_dispatch), (r.queue_offset, *r.extra_offsets)):
            assert s.phys_at(t, q, o) == r.commitlog_offset
        if m.message_id:
            assert r.message_id == m.message_id
            assert s.query_by_id(m.message_id) is not None
        for k in m.keys:
            assert r.commitlog_offset in [x.commitlog_offset for x in s.query_by_key(m.topic, k, max_count=1000)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(messages(), min_size=1, max_size=40), st.sampled_from(["put_batch", "put", "put_batch_async"]))
def test_every_put_path_stores_record_encode_bytes(sent: list[Message], path: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        s = MessageStore(make_config(Path(d) / "data"))
        s.start()
        try:
            if path == "put_batch":
                results = s.put_batch(sent)
            elif path == "put":
                results = [s.put(m) for m in sent]
            else:
                results = asyncio.run(s.put_batch_async(sent))
            _check_stored(s, sent, results)
        finally:
            s.shutdown()


def test_batch_of_door_messages_rolls_segments_and_queue_files(stores) -> None:
    """Many LMQ-dispatched messages with properties and keys: segment and queue-file rolls mid-batch."""
    s = stores.open()
    sent = [
        Message("orders", b"x" * 700, properties={"mqtt_topic": f"a/{i}", "mqtt_qos": "1"}, keys=[f"k{i}"],
                extra_dispatch=[LMQS[i % 3]], tag="t" if i % 2 else None)
        for i in range(400)
    ]
    results = []
    for i in range(0, 400, 50):
        results += s.put_batch(sent[i : i + 50])
    _check_stored(s, sent, results)
    assert s.max_offset("%LMQ%sub-b", 0) == sum(1 for i in range(400) if i % 3 == 1)


def test_batch_refuses_a_duplicate_dispatch_target_alone(stores) -> None:
    s = stores.open()
    ok = Message("orders", b"a", properties={"p": "1"}, extra_dispatch=[LMQS[0]])
    bad = Message("orders", b"b", extra_dispatch=[DispatchTarget("orders", 0)])
    try:
        s.put_batch([ok, bad])
    except Exception as e:  # the batch stops at the bad message; the one before it is stored
        assert "at most once" in str(e)
    else:
        raise AssertionError("a message dispatched twice into one queue was accepted")
    assert s.max_offset("orders", 0) == 1 and s.max_offset("%LMQ%sub-a", 0) == 1


def test_recovery_rebuilds_queues_and_index_of_batched_door_messages(stores, tmp_path: Path) -> None:
    s = stores.open()
    sent = [Message("orders", b"body%d" % i, properties={"ce_id": str(i)}, keys=[f"key{i}"], message_id=f"id-{i}",
                    extra_dispatch=[LMQS[i % 2]]) for i in range(100)]
    results = s.put_batch(sent)
    copy = crash_copy(s, tmp_path / "crashed")
    s2 = stores.open(make_config(copy))
    for m, r in zip(sent, results):
        got = s2.read_at(m.extra_dispatch[0].topic, m.extra_dispatch[0].queue_id, r.extra_offsets[0])
        assert got is not None and got.body == m.body and got.properties == m.properties
        assert s2.query_by_id(m.message_id).body == m.body
        assert [x.body for x in s2.query_by_key("orders", m.keys[0])] == [m.body]
    g = s2.get("%LMQ%sub-a", 0, 0, 100)
    assert g.status == GetStatus.FOUND and len(g.messages) == 50
