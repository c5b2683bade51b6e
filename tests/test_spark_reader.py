"""Tier 0 of the Spark connector: the reader's logic without a JVM, against a real `unimq up`.

The reader classes are plain Python; these tests build them from option dicts
and call them the way Spark's three processes do (driver planning, pickled
copies reading in executors), so everything but the engine itself is covered
in seconds: option parsing, the offset JSON, new topics, the rate-limit split
(ReadAllAvailable vs ReadMaxRows), availableNow clamping, partition planning,
data-loss detection (retention, a recreated topic), Arrow pages equal to
``to_arrow_schema`` of the declared schema, the columnar record decoder equal
to the store's own decode, and cloudpickle round trips.
"""

from __future__ import annotations

import base64
import json
import random
import time
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pyspark import cloudpickle  # noqa: E402
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from gateway import arrow_pages  # noqa: E402
from spark_ingest import offsets as off  # noqa: E402
from spark_ingest import wire  # noqa: E402
from spark_ingest.client import GatewayClient  # noqa: E402
from spark_ingest.options import MAX_PAGE, OptionError, SinkOptions, SourceOptions  # noqa: E402
from spark_ingest.schema import COLUMNS, SCHEMA_DDL, spark_schema  # noqa: E402
from spark_ingest.source import (  # noqa: E402
    DataLossError,
    UnimqBatchReader,
    UnimqPartition,
    UnimqPartitionGroup,
    UnimqStreamReader,
    publish_rows,
    read_range,
    row_to_message,
)
from spark_helpers import Http, start_server  # noqa: E402

pytestmark = pytest.mark.timeout(300)

N_PLAIN = 240
N_EVENTS = 160


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("spark-reader"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    h = Http(server.endpoint)
    yield h
    h.close()


@pytest.fixture(scope="module")
def loaded(http) -> dict:
    """Topic ``sr-data`` (4 queues): plain messages with tags/keys/properties, then CloudEvents."""
    http.create_topic("sr-data", 4)
    sent = {}
    for i in range(N_PLAIN):
        body = json.dumps({"i": i, "temp": 20 + i % 7, "name": f"dev-é-{i % 5}"}).encode()
        r = http.send("sr-data", body, {"content-type": "application/json", "unimq-tag": f"t{i % 3}",
                                        "unimq-keys": f"k{i},kk{i % 2}", "unimq-prop-unit": "°C",
                                        "unimq-prop-seq": str(i)})
        sent[(r["queue_id"], r["queue_offset"])] = body
    http.send_events("sr-data", ({"j": j, "amount": j * 1.5} for j in range(N_EVENTS)))
    return sent


def opts(server, **kw) -> dict:
    return {"endpoint": server.endpoint, "topics": "sr-data", **{k: str(v) for k, v in kw.items()}}


def read_all(reader, parts) -> pa.Table:
    batches = [b for p in parts for b in reader.read(p)]
    return pa.Table.from_batches(batches, wire.ARROW_SCHEMA) if batches else wire.ARROW_SCHEMA.empty_table()


# ------------------------------------------------------------------------------ options


def test_options_defaults_types_and_case():
    o = SourceOptions.parse({"ENDPOINT": "http://h:1/", "Topics": " a, b ,", "maxMessagesPerTrigger": "500",
                             "FAILONDATALOSS": "False", "requestTimeoutMs": "2500"})
    assert o.endpoint == "http://h:1" and o.topics == ("a", "b") and o.topic_pattern is None
    assert o.max_messages_per_trigger == 500 and o.fail_on_data_loss is False and o.request_timeout_s == 2.5
    assert o.starting_offsets == "earliest" and o.ending_offsets == "latest"
    assert o.page_size == MAX_PAGE and o.page_format == "arrow" and o.max_messages_per_partition == 250_000
    assert SourceOptions.parse({"path": "http://x:2", "topicPattern": "f.*"}).topic_pattern == "f.*"
    s = SinkOptions.parse({"endpoint": "http://x:2", "topic": "out", "checkpointLocation": "/tmp/c"})
    assert s.topic == "out"


@pytest.mark.parametrize("bad, words", [
    ({"topics": "a"}, "endpoint is required"),
    ({"endpoint": "127.0.0.1:8080", "topics": "a"}, "endpoint is required"),
    ({"endpoint": "http://h:1"}, "exactly one of"),
    ({"endpoint": "http://h:1", "topics": "a", "topicPattern": "b"}, "exactly one of"),
    ({"endpoint": "http://h:1", "topicPattern": "("}, "not a valid regular expression"),
    ({"endpoint": "http://h:1", "topics": "a", "maxMessagesPerTrigger": "lots"}, "must be an integer"),
    ({"endpoint": "http://h:1", "topics": "a", "maxMessagesPerTrigger": "0"}, "at least 1"),
    ({"endpoint": "http://h:1", "topics": "a", "pageSize": str(MAX_PAGE + 1)}, f"at most {MAX_PAGE}"),
    ({"endpoint": "http://h:1", "topics": "a", "failOnDataLoss": "maybe"}, "true or false"),
    ({"endpoint": "http://h:1", "topics": "a", "startingOffsets": "first"}, "earliest, latest or a JSON"),
    ({"endpoint": "http://h:1", "topics": "a", "endingOffsets": "earliest"}, "would read nothing"),
    ({"endpoint": "http://h:1", "topics": "a", "pageFormat": "xml"}, "arrow or json"),
    ({"endpoint": "http://h:1", "topics": "a", "maxMesagesPerTrigger": "5"}, "unknown option"),
])
def test_options_errors_name_the_option(bad, words):
    with pytest.raises(OptionError, match=words):
        SourceOptions.parse(bad)


# ------------------------------------------------------------------------------ offsets JSON


def test_offsets_json_round_trip_and_validation():
    doc = {"b": {"10": 5, "2": 0}, "a": {"0": 7}}
    text = off.dumps(doc)
    assert text == '{"a":{"0":7},"b":{"2":0,"10":5}}'
    assert off.parse_offsets(text, "x") == doc
    assert off.parse_offsets('{"t": {"3": -2}}', "x") == {"t": {"3": -2}}
    for bad in ('[1]', '{"t": 3}', '{"t": {"q": 1}}', '{"t": {"0": -3}}', '{"t": {"0": 1.5}}', '{"t": {"0": true}}', "{"):
        with pytest.raises(ValueError):
            off.parse_offsets(bad, "startingOffsets")


def test_resolve_earliest_latest_and_json_markers():
    bounds = {"t": {"0": (5, 10), "1": (0, 3)}, "u": {"0": (0, 0)}}
    assert off.resolve("earliest", bounds, "s", False) == {"t": {"0": 5, "1": 0}, "u": {"0": 0}}
    assert off.resolve("LATEST", bounds, "s", False) == {"t": {"0": 10, "1": 3}, "u": {"0": 0}}
    # a queue missing from the JSON: earliest for a start, latest for an end; -2/-1 markers
    assert off.resolve('{"t": {"0": 7}}', bounds, "s", False) == {"t": {"0": 7, "1": 0}, "u": {"0": 0}}
    assert off.resolve('{"t": {"0": -2, "1": -1}}', bounds, "e", True) == {"t": {"0": 5, "1": 3}, "u": {"0": 0}}
    with pytest.raises(ValueError, match="not read: v"):
        off.resolve('{"v": {"0": 1}}', bounds, "startingOffsets", False)


# ------------------------------------------------------------------------------ rate limit


def test_cap_split_examples():
    start = {"t": {"0": 0, "1": 0, "2": 50}}
    latest = {"t": {"0": 100, "1": 300, "2": 50}}
    assert off.cap(start, latest, 100) == {"t": {"0": 25, "1": 75, "2": 50}}
    assert off.cap(start, latest, None) == latest
    assert off.cap(start, latest, 10_000) == latest
    # remainders go to the largest fractional parts: 3 rows over backlogs 1,1,1,1 -> exactly 3
    end = off.cap({"t": {str(q): 0 for q in range(4)}}, {"t": {str(q): 1 for q in range(4)}}, 3)
    assert off.total({"t": {str(q): 0 for q in range(4)}}, end) == 3


@settings(max_examples=300, deadline=None)
@given(backlogs=st.lists(st.integers(0, 10_000), min_size=1, max_size=12), max_rows=st.integers(1, 50_000),
       base=st.integers(0, 1_000_000))
def test_cap_split_is_exact_and_proportional(backlogs, max_rows, base):
    start = {"t": {str(i): base for i in range(len(backlogs))}}
    latest = {"t": {str(i): base + b for i, b in enumerate(backlogs)}}
    end = off.cap(start, latest, max_rows)
    taken = [end["t"][str(i)] - base for i in range(len(backlogs))]
    assert sum(taken) == min(max_rows, sum(backlogs))
    total = sum(backlogs)
    for t, b in zip(taken, backlogs):
        assert 0 <= t <= b
        if total > max_rows:
            assert abs(t - max_rows * b / total) < 1  # proportional to the backlog, rounded


def test_read_limit_all_available_vs_max_rows(server, loaded):
    r = UnimqStreamReader(opts(server, maxMessagesPerTrigger=100))
    assert isinstance(r.getDefaultReadLimit(), ReadMaxRows) and r.getDefaultReadLimit().max_rows == 100
    assert isinstance(UnimqStreamReader(opts(server)).getDefaultReadLimit(), ReadAllAvailable)
    start = r.initialOffset()
    total = N_PLAIN + N_EVENTS
    # the engine's limit wins over the option: ReadAllAvailable reads everything
    everything = r.latestOffset(start, ReadAllAvailable())
    assert off.total(start, everything) == total
    assert everything == off.latest(off.to_bounds({"sr-data": GatewayClient(server.endpoint).describe("sr-data")}))
    capped = r.latestOffset(start, ReadMaxRows(137))
    assert off.total(start, capped) == 137
    # consecutive capped batches cover everything exactly once
    seen, cur = 0, start
    while True:
        nxt = r.latestOffset(cur, ReadMaxRows(137))
        n = off.total(cur, nxt)
        if n == 0:
            break
        assert n <= 137
        seen += n
        cur = nxt
    assert seen == total and cur == everything
    assert r.reportLatestOffset() == everything


def test_available_now_clamps_to_target(server, http):
    http.create_topic("sr-now", 2)
    for i in range(50):
        http.send("sr-now", b"x%d" % i)
    r = UnimqStreamReader({"endpoint": server.endpoint, "topics": "sr-now", "maxMessagesPerTrigger": "20"})
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    for i in range(30):  # arrives after the query started: not part of this availableNow run
        http.send("sr-now", b"late%d" % i)
    ends, cur = [], start
    while True:
        nxt = r.latestOffset(cur, r.getDefaultReadLimit())
        if nxt == cur:
            break
        ends.append(off.total(cur, nxt))
        cur = nxt
    assert ends == [20, 20, 10]  # ReadMaxRows respected up to the target, then nothing more
    assert off.total(start, cur) == 50
    assert off.total(cur, r.reportLatestOffset()) == 30  # the lag shows the late messages
    # ReadAllAvailable under availableNow also stops at the target
    assert r.latestOffset(start, ReadAllAvailable()) == cur


def test_new_topic_enters_at_earliest_then_is_read(server, http):
    http.create_topic("srp-a", 2)
    http.send("srp-a", b"a0")
    r = UnimqStreamReader({"endpoint": server.endpoint, "topicPattern": "srp-.*", "startingOffsets": "latest"})
    start = r.initialOffset()
    assert set(start) == {"srp-a"} and off.total({"srp-a": {"0": 0, "1": 0}}, start) == 1
    http.create_topic("srp-b", 3)
    for i in range(7):
        http.send("srp-b", b"b%d" % i)
    http.send("srp-a", b"a1")
    e1 = r.latestOffset(start, ReadAllAvailable())
    # the new topic enters the end offset at its earliest offset (no rows yet) ...
    assert e1["srp-b"] == {"0": 0, "1": 0, "2": 0}
    parts = r.partitions(start, e1)
    assert [(p.topic, p.end - p.start) for p in parts] == [("srp-a", 1)]
    # ... and the next batch reads it from there, although startingOffsets was latest
    e2 = r.latestOffset(e1, ReadAllAvailable())
    parts = r.partitions(e1, e2)
    assert sum(p.end - p.start for p in parts if p.topic == "srp-b") == 7
    rows = read_all(r, parts)
    assert sorted(rows.column("body").to_pylist()) == sorted(b"b%d" % i for i in range(7))


# ------------------------------------------------------------------------------ planning and reading


def test_plan_splits_large_ranges():
    ranges = off.plan({"t": {"0": 10, "1": 5, "2": 0}}, {"t": {"0": 35, "1": 5, "2": 4}}, 10)
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [(0, 10, 20), (0, 20, 30), (0, 30, 35), (2, 0, 4)]


def test_pack_spreads_ranges_over_at_most_the_tasks_given():
    ranges = off.plan({"t": {"0": 0, "1": 0, "2": 0, "3": 0}}, {"t": {"0": 250, "1": 250, "2": 100, "3": 400}}, 1000)
    assert off.pack(ranges, None) == off.pack(ranges, 4) == [(r,) for r in ranges]
    two = off.pack(ranges, 2)
    assert sorted((r for g in two for r in g), key=ranges.index) == ranges and len(two) == 2
    assert sorted(sum(r.end - r.start for r in g) for g in two) == [500, 500]  # balanced by messages
    assert all(list(g) == sorted(g, key=ranges.index) for g in two)  # read in plan order
    assert off.pack(ranges, 1) == [tuple(ranges)] and off.pack(ranges, 2) == two  # deterministic


def test_max_partitions_packs_tasks_with_the_same_rows(server, loaded):
    by_range = UnimqBatchReader(opts(server, maxMessagesPerPartition=30))
    parts = by_range.partitions()
    assert len(parts) > 4
    packed = UnimqBatchReader(opts(server, maxMessagesPerPartition=30, maxPartitions=3))
    groups = packed.partitions()
    assert len(groups) == 3 and all(isinstance(g, UnimqPartitionGroup) for g in groups)
    assert sorted((p.queue_id, p.start) for g in groups for p in g.parts) == sorted((p.queue_id, p.start) for p in parts)
    key = [("queue_id", "ascending"), ("queue_offset", "ascending")]
    assert read_all(packed, groups).sort_by(key).equals(read_all(by_range, parts).sort_by(key))
    assert cloudpickle.loads(cloudpickle.dumps(groups)) == groups
    # the session's default (source.register) gives way to the option, and 0 turns packing off
    assert len(UnimqBatchReader(opts(server, maxMessagesPerPartition=30), None, 2).partitions()) == 2
    assert UnimqBatchReader(opts(server, maxMessagesPerPartition=30, maxPartitions=0), None, 2).partitions() == parts
    # a micro-batch plans the same way from its offsets alone (a replay gets the same tasks)
    s = UnimqStreamReader(opts(server, maxPartitions=2))
    start = s.initialOffset()
    end = s.latestOffset(start, ReadAllAvailable())
    s_parts = s.partitions(start, end)
    assert len(s_parts) == 2 and s_parts == s.partitions(start, end)
    assert read_all(s, s_parts).num_rows == N_PLAIN + N_EVENTS


def test_batch_reader_partitions_and_exact_rows(server, loaded):
    bounds = GatewayClient(server.endpoint).describe("sr-data")
    assert sum(hi for _, hi in bounds.values()) == N_PLAIN + N_EVENTS
    r = UnimqBatchReader(opts(server, maxMessagesPerPartition=30))
    parts = r.partitions()
    assert isinstance(parts, list) and all(p.end - p.start <= 30 for p in parts)
    assert sum(p.end - p.start for p in parts) == N_PLAIN + N_EVENTS
    t = read_all(r, parts)
    assert t.num_rows == N_PLAIN + N_EVENTS
    keys = list(zip(t.column("queue_id").to_pylist(), t.column("queue_offset").to_pylist()))
    assert len(set(keys)) == len(keys)
    for q, (lo, hi) in bounds.items():
        assert sorted(o for qq, o in keys if qq == q) == list(range(lo, hi))
    got = dict(zip(keys, t.column("body").to_pylist()))
    assert all(got[k] == body for k, body in loaded.items())  # bodies byte for byte
    # a JSON start and end range reads exactly that
    r2 = UnimqBatchReader(opts(server, startingOffsets='{"sr-data": {"0": 10}}',
                               endingOffsets='{"sr-data": {"0": 20, "1": -2, "2": 0, "3": 1}}'))
    parts = r2.partitions()
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 10, 20), (3, 0, 1)]
    assert read_all(r2, parts).column("queue_offset").to_pylist()[:10] == list(range(10, 20))


def test_unknown_topic_fails_batch_but_not_stream(server):
    with pytest.raises(ValueError, match="does not exist"):
        UnimqBatchReader({"endpoint": server.endpoint, "topics": "sr-missing"}).partitions()
    r = UnimqStreamReader({"endpoint": server.endpoint, "topics": "sr-missing"})
    assert r.initialOffset() == {"sr-missing": {}}
    assert r.latestOffset({"sr-missing": {}}, ReadAllAvailable()) == {"sr-missing": {}}  # no batch to run


# ------------------------------------------------------------------------------ data loss


def test_check_data_loss_rules():
    bounds = {"t": {"0": (10, 20), "1": (0, 5)}}
    assert off.check_data_loss({"t": {"0": 10, "1": 5}}, bounds, True) == {"t": {"0": 10, "1": 5}}
    with pytest.raises(DataLossError, match="no longer retained"):
        off.check_data_loss({"t": {"0": 3}}, bounds, True)
    with pytest.raises(DataLossError, match="deleted and recreated"):
        off.check_data_loss({"t": {"1": 9}}, bounds, True)
    with pytest.raises(DataLossError, match="is gone"):
        off.check_data_loss({"t": {"7": 1}}, bounds, True)
    assert off.check_data_loss({"t": {"0": 3, "1": 9, "7": 1}}, bounds, False) == {"t": {"0": 10, "1": 0, "7": 1}}


def test_recreated_topic_is_data_loss(server, http):
    http.create_topic("sr-gone", 1)
    for i in range(10):
        http.send("sr-gone", b"%d" % i)
    r = UnimqBatchReader({"endpoint": server.endpoint, "topics": "sr-gone"})
    parts = r.partitions()
    http.delete_topic("sr-gone")
    http.create_topic("sr-gone", 1)
    for i in range(3):
        http.send("sr-gone", b"new%d" % i)
    with pytest.raises(DataLossError, match="no message at offset 3"):
        list(r.read(parts[0]))
    s = UnimqStreamReader({"endpoint": server.endpoint, "topics": "sr-gone"})
    with pytest.raises(DataLossError, match="deleted and recreated"):
        s.latestOffset({"sr-gone": {"0": 10}}, ReadAllAvailable())
    s2 = UnimqStreamReader({"endpoint": server.endpoint, "topics": "sr-gone", "failOnDataLoss": "false"})
    first = s2.latestOffset({"sr-gone": {"0": 10}}, ReadAllAvailable())
    assert first == {"sr-gone": {"0": 0}}  # back to the recreated queue's start, no rows this batch ...
    assert s2.partitions({"sr-gone": {"0": 10}}, first) == []
    second = s2.latestOffset(first, ReadAllAvailable())  # ... then all of it
    assert [(p.start, p.end) for p in s2.partitions(first, second)] == [(0, 3)]


def test_retention_below_minimum_is_data_loss(tmp_path_factory):
    """A server whose retention deletes old segments: offset 0 is gone, the reader says so."""
    srv = start_server(tmp_path_factory.mktemp("spark-retention"), store={
        "commitlog_segment_size": 65536, "retention_hours": 1.0 / 3600, "retention_check_interval_s": 0.2})
    h = Http(srv.endpoint)
    try:
        h.create_topic("sr-old", 1)
        body = b"y" * 2000
        for i in range(120):  # about 4 segments of 64 KiB
            h.send("sr-old", body)
        deadline = time.monotonic() + 60
        while h.describe("sr-old")[0][0] == 0:
            assert time.monotonic() < deadline, "retention never removed a segment"
            h.send("sr-old", body)  # keeps a newer segment; older ones expire after a second
            time.sleep(0.5)
        lo, hi = h.describe("sr-old")[0]
        o = {"endpoint": srv.endpoint, "topics": "sr-old", "startingOffsets": '{"sr-old": {"0": 0}}'}
        with pytest.raises(DataLossError, match="no longer retained"):
            UnimqBatchReader(o).partitions()
        lenient = UnimqBatchReader({**o, "failOnDataLoss": "false", "endingOffsets": f'{{"sr-old": {{"0": {hi}}}}}'})
        parts = lenient.partitions()
        assert parts[0].start >= lo > 0
        # an executor holding a range that retention cut meanwhile: fail, or skip to the minimum
        cut = UnimqPartition("sr-old", 0, 0, hi)
        with pytest.raises(DataLossError, match="deleted by retention"):
            list(read_range(SourceOptions.parse(o), cut))
        rows = pa.Table.from_batches(list(read_range(SourceOptions.parse({**o, "failOnDataLoss": "false"}), cut)))
        assert rows.column("queue_offset").to_pylist() == list(range(rows.column("queue_offset")[0].as_py(), hi))
    finally:
        h.close()
        srv.stop()


# ------------------------------------------------------------------------------ Arrow pages


def test_arrow_schema_is_what_spark_expects():
    from pyspark.sql.pandas.types import to_arrow_schema

    expected = to_arrow_schema(spark_schema(), timezone="UTC")
    assert wire.ARROW_SCHEMA.equals(expected), f"{wire.ARROW_SCHEMA}\n!=\n{expected}"
    assert tuple(wire.ARROW_SCHEMA.names) == COLUMNS == tuple(f.name for f in spark_schema().fields)
    assert SCHEMA_DDL.count(",") == len(COLUMNS)  # 16 columns; MAP<STRING, STRING> has one comma


def test_json_and_arrow_pages_convert_identically(server, loaded):
    c = GatewayClient(server.endpoint)
    for q in range(4):
        page = c.pull_json("sr-data", q, 0, 4096)
        from_json = wire.json_to_batch(page["messages"])
        batches, nxt, lo, hi = c.pull_arrow("sr-data", q, 0, 4096)
        (from_arrow,) = batches
        assert from_arrow.schema.equals(wire.ARROW_SCHEMA) and from_json.schema.equals(wire.ARROW_SCHEMA)
        assert from_arrow.to_pylist() == from_json.to_pylist()
        assert (nxt, lo, hi) == (page["next_offset"], page["min_offset"], page["max_offset"])
    rows = [r for q in range(4) for r in c.pull_arrow("sr-data", q, 0, 4096)[0][0].to_pylist()]
    plain = [r for r in rows if r["protocol"] == "http"]
    events = [r for r in rows if r["protocol"] == "cloudevents"]
    assert len(plain) == N_PLAIN and len(events) == N_EVENTS
    r0 = next(r for r in plain if dict(r["properties"])["seq"] == "0")
    assert r0["tag"] == "t0" and r0["keys"] == ["k0", "kk0"] and r0["topic"] == "sr-data"
    assert dict(r0["properties"]) == {"unit": "°C", "seq": "0", "content_type": "application/json"}
    assert json.loads(r0["body"]) == {"i": 0, "temp": 20, "name": "dev-é-0"}
    assert r0["store_timestamp"].tzinfo is not None and r0["mqtt_topic"] is None and r0["ce_type"] is None
    e = events[0]
    assert e["ce_type"] == "test.event" and e["ce_source"] == "/test" and e["tag"] == "test.event"
    # a tag-filtered Arrow page (decoded path) has only matching rows
    _, headers, data = c.request("GET", "/v1/topics/sr-data/queues/0/messages?offset=0&max=4096&format=arrow&tag=t1")
    assert {r["tag"] for r in wire.from_ipc(data)[0].to_pylist()} == {"t1"}


def _random_store_messages(store, n: int, seed: int) -> None:
    from core_broker.model import Message

    rnd = random.Random(seed)

    def rs(k: int) -> str:
        return "".join(rnd.choice("ab/é€😀 \x01z") for _ in range(rnd.randint(0, k)))

    for i in range(n):
        props = {(rs(6) or "k"): rs(12) for _ in range(rnd.randint(0, 5))}
        if i % 7 == 0:
            props["__reserved"] = "hidden"
        if i % 5 == 0:
            props["mqtt_topic"] = f"a/b/{i}"
        if i % 3 == 0:
            props.update(ce_type=f"t{i}", ce_source="/s", ce_subject=rs(4))
        m = Message("T", bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 60))), tag=rs(5) or None,
                    keys=[k for k in (rs(4), rs(4)) if k] if i % 2 else [], properties=props,
                    message_group=rs(3) or None, protocol=rnd.choice(["mqtt", "http", "amqp", "cloudevents"]),
                    message_id=f"id-{i}" if i % 4 == 0 else "")
        m.queue_id = 0
        store.put(m)


def test_columnar_decoder_equals_store_decode(tmp_path: Path):
    from core_broker.config import StoreConfig
    from core_broker.message_store import MessageStore
    from core_broker.system_topics import public_properties
    from core_broker.topic_config import TopicConfig

    store = MessageStore(StoreConfig(data_dir=tmp_path, commitlog_segment_size=1 << 20,
                                     disk_refuse_free_ratio=0.0, disk_min_free_ratio=0.0))
    store.start()
    try:
        store.topics.create(TopicConfig("T", queues=1))
        _random_store_messages(store, 1500, seed=3)
        offset = pages = 0
        while (raw := store.get_raw("T", 0, offset, 400, max_span=40_000)) is not None:
            entries, span, base, prefix, lo, hi = raw
            fast = arrow_pages.raw_to_batch("T", 0, offset, entries, span, base, prefix)
            assert fast is not None and fast.schema.equals(wire.ARROW_SCHEMA)
            slow = store.get("T", 0, offset, fast.num_rows).messages
            for m in slow:
                m.properties = public_properties(m.properties)
            assert fast.to_pylist() == arrow_pages.messages_to_batch(slow).to_pylist()
            offset += fast.num_rows
            pages += 1
        assert offset == 1500 and pages > 1500 // 400  # max_span cut some pages short
        # a corrupt record (CRC mismatch) is never decoded by the fast path
        entries, span, base, prefix, _, _ = store.get_raw("T", 0, 0, 10)
        bad = bytearray(span)
        bad[len(span) // 2] ^= 0xFF
        assert arrow_pages.raw_to_batch("T", 0, 0, entries, bytes(bad), base, prefix) is None
        assert arrow_pages.raw_to_batch("T", 0, 0, entries, span[:-1], base, prefix) is None  # a record past the span
    finally:
        store.shutdown()


# ------------------------------------------------------------------------------ pickling


def test_readers_and_partitions_survive_cloudpickle(server, loaded):
    b = UnimqBatchReader(opts(server, maxMessagesPerPartition=100))
    parts = b.partitions()
    s = UnimqStreamReader(opts(server))
    start = s.initialOffset()  # the driver-side reader now holds a live client ...
    end = s.latestOffset(start, ReadAllAvailable())
    assert s._client is not None
    for reader in (b, s):
        copy = cloudpickle.loads(cloudpickle.dumps(reader))  # ... which is not shipped
        assert getattr(copy, "_client", None) is None and copy.opts == reader.opts
    pparts = cloudpickle.loads(cloudpickle.dumps(parts))
    assert pparts == parts
    s_parts = s.partitions(start, end)
    executor_copy = cloudpickle.loads(cloudpickle.dumps(s))
    got = read_all(executor_copy, cloudpickle.loads(cloudpickle.dumps(s_parts)))
    assert got.num_rows == N_PLAIN + N_EVENTS
    assert got.sort_by([("queue_id", "ascending"), ("queue_offset", "ascending")]).equals(
        read_all(b, parts).sort_by([("queue_id", "ascending"), ("queue_offset", "ascending")]))


# ------------------------------------------------------------------------------ sink


def test_sink_rows_become_messages(server, http):
    topic, body, headers = row_to_message({"topic": "x", "value": "hé", "tag": "T", "keys": ["a", "b"],
                                           "properties": {"p": "ü"}, "message_group": "g"}, None)
    assert (topic, body) == ("x", "hé".encode())
    assert headers["unimq-keys"] == b"a,b" and headers["unimq-prop-p"] == "ü".encode()
    assert row_to_message({"topic": "x", "body": {"a": 1}}, "forced")[:2] == ("forced", b'{"a": 1}')
    with pytest.raises(ValueError, match="topic"):
        row_to_message({"body": b"x"}, None)
    http.create_topic("sr-sink", 1)
    n = publish_rows(SinkOptions.parse({"endpoint": server.endpoint, "topic": "sr-sink"}),
                     iter([{"body": b"\x00\x01", "tag": "bin", "properties": {"k": "v€"}},
                           {"value": "text", "keys": ["only"]}]))
    assert n == 2
    rows = pa.Table.from_batches(list(read_range(
        SourceOptions.parse({"endpoint": server.endpoint, "topics": "sr-sink"}), UnimqPartition("sr-sink", 0, 0, 2)))
    ).to_pylist()
    assert [r["body"] for r in rows] == [b"\x00\x01", b"text"]
    assert rows[0]["tag"] == "bin" and dict(rows[0]["properties"])["k"] == "v€" and rows[1]["keys"] == ["only"]
    assert {r["protocol"] for r in rows} == {"http"}


def test_body_base64_json_fallback_page(server, loaded):
    """pageFormat=json reads the same rows as the Arrow pages."""
    o = opts(server, pageFormat="json")
    r_json, r_arrow = UnimqBatchReader(o), UnimqBatchReader(opts(server))
    a = read_all(r_json, r_json.partitions()).to_pylist()
    b = read_all(r_arrow, r_arrow.partitions()).to_pylist()
    assert a == b and len(a) == N_PLAIN + N_EVENTS
    assert base64.b64encode(a[0]["body"])  # bytes, not text


def test_arrow_page_with_link_records_falls_back_to_decoding(server, http):
    """A delay message is stored as a link record when it fires: the bulk decoder hands over."""
    http.create_topic("sr-delay", 1)
    http.send("sr-delay", b"now")
    http.send("sr-delay", b"later", {"unimq-delivery-time-ms": str(int(time.time() * 1000) + 300)})
    http.send("sr-delay", b"now2")
    deadline = time.monotonic() + 60
    while http.describe("sr-delay")[0][1] < 3:
        assert time.monotonic() < deadline, "the delay message never fired"
        time.sleep(0.1)
    c = GatewayClient(server.endpoint)
    (batch,), nxt, lo, hi = c.pull_arrow("sr-delay", 0, 0, 10)
    assert (nxt, lo, hi) == (3, 0, 3)
    assert batch.column("body").to_pylist() == [b"now", b"now2", b"later"]
    assert batch.to_pylist() == wire.json_to_batch(c.pull_json("sr-delay", 0, 0, 10)["messages"]).to_pylist()


def test_unimq_demo_feeds_all_three_doors(server, http):
    import subprocess
    import sys

    missing = [d for d in ("mqtt", "amqp") if d not in server.ports]
    if missing:
        pytest.skip(f"unimq up announced no {', '.join(missing)} door: {server.lines}")
    r = subprocess.run([sys.executable, "-m", "unimq", "demo", "--http-port", str(server.ports["http"]),
                        "--mqtt-port", str(server.ports["mqtt"]), "--amqp-port", str(server.ports["amqp"]),
                        "--seconds", "3", "--devices", "2", "--rate", "5"],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "python -m spark_ingest.jobs.stats --endpoint" in r.stdout and "[demo" in r.stdout
    reader = UnimqBatchReader({"endpoint": server.endpoint, "topics": "factory,events,orders"})
    rows = read_all(reader, reader.partitions()).select(["topic", "protocol", "mqtt_topic", "ce_type", "tag"])
    by_topic = {}
    for row in rows.to_pylist():
        by_topic.setdefault(row["topic"], set()).add(row["protocol"])
    assert by_topic == {"factory": {"mqtt"}, "events": {"cloudevents"}, "orders": {"amqp"}}, by_topic
    assert all(m.startswith("factory/line-") for m in rows.column("mqtt_topic").drop_null().to_pylist())
    assert rows.column("ce_type").drop_null().to_pylist()[0].startswith("com.example.")


def test_a_door_from_before_large_pages_is_read_in_pages_of_its_size(server, loaded):
    """A door whose Arrow pages stop at 16,384 rows answers 422 to more: the reader asks again
    in pages of that size, in Arrow (not the JSON fallback). The older door is a proxy in front
    of the real one that refuses ``max`` above 16,384 as such a door did."""
    import http.server
    import threading
    import urllib.parse
    import urllib.request

    import httpx

    seen: list[tuple[int, str]] = []

    class OldDoor(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if "max" in q:
                seen.append((int(q["max"][0]), q.get("format", ["json"])[0]))
            if "max" in q and int(q["max"][0]) > 16384:
                body, status, headers = b'{"error": "VALIDATION", "message": "max"}', 422, {}
            else:
                with urllib.request.urlopen(server.endpoint + self.path, timeout=30) as r:
                    body, status, headers = r.read(), r.status, dict(r.headers)
            self.send_response(status)
            for k, v in headers.items():
                if k.lower().startswith(("content-type", "unimq-")):
                    self.send_header(k, v)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    from core_broker.model import Message
    from gateway.batch_codec import pack

    packed = pack([Message("sr-old", b"o%d" % i) for i in range(10_000)])
    with httpx.Client(base_url=server.endpoint, timeout=60) as c:
        c.post("/v1/topics", json={"name": "sr-old", "queues": 1, "attributes": {"batch": "true"}}).raise_for_status()
        for _ in range(2):  # two records: 20,000 rows, more than one old page
            c.post("/v1/topics/sr-old/messages", content=packed,
                   headers={"content-type": "application/vnd.unimq.batch"}).raise_for_status()
    door = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OldDoor)
    threading.Thread(target=door.serve_forever, daemon=True).start()
    try:
        o = SourceOptions.parse({"endpoint": f"http://127.0.0.1:{door.server_address[1]}", "topics": "sr-old"})
        assert o.page_size == MAX_PAGE > 16384
        got = pa.Table.from_batches(list(read_range(o, UnimqPartition("sr-old", 0, 0, 20_000))))
        assert got.column("queue_offset").to_pylist() == list(range(20_000))
        assert seen == [(20_000, "arrow"), (16384, "arrow"), (20_000 - 16384, "arrow")]
    finally:
        door.shutdown()
        door.server_close()
