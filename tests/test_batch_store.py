"""The batch consume queue in the store itself: a batch record indexed once, read per offset;
recovery after a crash; and stores written before batch topics existed still read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from store_helpers import crash_copy, make_config, read_all

from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker.topic_config import TopicConfig
from gateway.batch_codec import batch_record, expand_all


def _open(path: Path) -> MessageStore:
    s = MessageStore(make_config(path))
    s.start()
    return s


def test_one_entry_per_batch_and_offsets_count_messages(tmp_path: Path) -> None:
    s = _open(tmp_path / "d")
    try:
        s.topics.create(TopicConfig("b", queues=1, attributes={"batch": "true"}))
        r1 = s.put(batch_record("b", [Message("b", b"a%d" % i) for i in range(100)], "zstd"))
        r2 = s.put(Message("b", b"single"))
        r3 = s.put(batch_record("b", [Message("b", b"c%d" % i) for i in range(7)]))
        assert (r1.queue_offset, r2.queue_offset, r3.queue_offset) == (0, 100, 101)
        cq = s._cqs[("b", 0)]
        assert (cq.entries, cq.max_offset) == (3, 108)
        got = expand_all(read_all(s, "b", 0))
        assert [m.queue_offset for m in got] == list(range(108))
        assert [m.body for m in got] == [b"a%d" % i for i in range(100)] + [b"single"] + [b"c%d" % i for i in range(7)]
        assert s.read_at("b", 0, 104).properties["__batch_i"] == "3"
        # the body is stored as the producer packed it: compressed, never re-encoded
        assert s.read_phys(r1.commitlog_offset).body[4] == 1  # codec byte: zstd
        copy = crash_copy(s, tmp_path / "crashed")
    finally:
        s.shutdown()
    # recovery after a crash rebuilds the batch queue from the commitlog
    for q in (copy / "batchqueue").rglob("0000*"):
        q.write_bytes(b"\0" * q.stat().st_size)
    (copy / "checkpoint").unlink(missing_ok=True)
    s = _open(copy)
    try:
        got = expand_all(read_all(s, "b", 0))
        assert [m.queue_offset for m in got] == list(range(108)) and got[50].body == b"a50"
        assert s._cqs[("b", 0)].entries == 3
    finally:
        s.shutdown()


def test_a_store_from_before_batch_topics_reads_as_before(tmp_path: Path) -> None:
    """A store written before this change has classic 20-byte consume-queue entries only; its
    queues stay classic after the upgrade whatever the topic's attributes say, and read the same."""
    d = tmp_path / "old"
    s = _open(d)
    try:
        s.topics.create(TopicConfig("t", queues=1))
        for i in range(10):
            s.put(Message("t", b"m%d" % i))
    finally:
        s.shutdown()
    assert not (d / "batchqueue").exists()
    f = sorted((d / "consumequeue" / "t" / "0").iterdir())[0].read_bytes()
    entries = [struct.unpack_from("<qiq", f, 20 * i) for i in range(10)]  # the old on-disk format
    assert all(size > 0 for _, size, _ in entries) and entries[0][0] == 0
    # the topic later marked batch (topics.json edited by hand): its data still reads
    topics = d / "config" / "topics.json"
    doc = json.loads(topics.read_text())
    (doc["topics"] if "topics" in doc else doc)["t"]["attributes"] = {"batch": "true"}
    topics.write_text(json.dumps(doc))
    s = _open(d)
    try:
        assert [m.body for m in read_all(s, "t", 0)] == [b"m%d" % i for i in range(10)]
        assert s.put(Message("t", b"after")).queue_offset == 10
    finally:
        s.shutdown()


def test_query_by_id_finds_every_message_of_a_batch(tmp_path: Path) -> None:
    """Server ids (the record's offset + the message's index) by looking back from the offset to
    the record holding it; client-chosen ids by the index entries written from the record's
    ``__batch_ids``; the index rebuilt from the commitlog after a crash finds them again."""
    s = _open(tmp_path / "d")
    try:
        s.topics.create(TopicConfig("b", queues=1, attributes={"batch": "true"}))
        s.put(Message("b", b"before"))
        # bodies holding the record magic and a fake header: the search must not stop in them
        fake = struct.pack("<II", 64, 0xDAA320A7) * 50
        r1 = s.put(batch_record("b", [Message("b", fake + b"%d" % i) for i in range(40)], "none"))
        r2 = s.put(batch_record("b", [Message("b", b"c%d" % i, message_id=f"client-{i}" if i % 2 else None)
                                      for i in range(9)], "zstd"))
        prefix = r1.message_id[:18]

        def by_id(store: MessageStore, mid: str) -> Message | None:
            m = store.query_by_id(mid)
            return expand_all([m])[0] if m is not None else None

        def check(store: MessageStore) -> None:
            for i in (0, 1, 20, 39):
                m = by_id(store, prefix + "%016X" % (r1.commitlog_offset + i))
                assert m is not None and m.body == fake + b"%d" % i and m.queue_offset == 1 + i
            assert by_id(store, prefix + "%016X" % (r1.commitlog_offset + 40)) is None  # past its count
            for i in (1, 3, 7):
                m = by_id(store, f"client-{i}")
                assert m is not None and m.body == b"c%d" % i and m.queue_offset == 41 + i and m.message_id == f"client-{i}"
            assert by_id(store, "client-2") is None
            m = by_id(store, prefix + "%016X" % (r2.commitlog_offset + 2))
            assert m is not None and m.body == b"c2"

        check(s)
        copy = crash_copy(s, tmp_path / "crashed")
    finally:
        s.shutdown()
    for f in (copy / "index").rglob("*"):
        if f.is_file():
            f.unlink()
    (copy / "checkpoint").unlink(missing_ok=True)
    s = _open(copy)
    try:
        check(s)
    finally:
        s.shutdown()


def test_a_page_of_plain_records_equals_the_page_built_record_by_record(tmp_path: Path) -> None:
    """``page_rows`` builds a page of plain batch records (no keys, properties, client ids) column
    by column for the whole page; it must equal the per-record build it replaces, from any
    offset, and a page stops after ``max_bytes`` of records (at least one)."""
    import pyarrow as pa

    from gateway.batch_arrow import page_rows, record_rows
    from gateway.batch_codec import Unpacked

    s = _open(tmp_path / "d")
    try:
        s.topics.create(TopicConfig("b", queues=1, attributes={"batch": "true"}))
        for k in range(4):
            s.put(batch_record("b", [Message("b", b"x%d-%d" % (k, i) * (i % 3)) for i in range(37 + k)]))
        s.put(batch_record("b", [Message("b", b"k%d" % i, keys=("a",)) for i in range(5)]))
        recs, _, _ = s.get_batches("b", 0, 0, 1000)
        for off, most in ((0, 1000), (5, 60), (40, 100), (3, 2), (150, 10)):
            covering = [r for r in recs if r[0] + r[1] > off and r[0] < off + most]
            (page,), end = page_rows("b", 0, off, most, covering)
            slow, e = [], off
            for first, n, rec in covering:
                hi = min(first + n, off + most)
                slow.append(record_rows("b", 0, first, rec, Unpacked(rec.body), max(first, e) - first, hi - first))
                e = hi
            page.validate(full=True)
            assert end == e and page.num_rows == end - off
            assert page.equals(pa.concat_batches(slow)), (off, most)
        (page,), end = page_rows("b", 0, 0, 1000, recs, max_bytes=1)
        assert end == 37 and page.num_rows == 37  # one record, then the reader asks again
    finally:
        s.shutdown()
