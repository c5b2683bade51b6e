"""The broker journal on a real store: entries written, replayed in order, and link records
that move a message and journal the move in one record."""

from __future__ import annotations

import pytest

from core_broker.journal import Journal
from core_broker.model import Message
from core_broker.system_topics import JOURNAL_TOPIC, P_JOURNAL_DATA, P_JOURNAL_OP
from store_helpers import read_all, stores  # noqa: F401  (stores is a fixture)

pytestmark = pytest.mark.timeout(60)


def test_entries_replay_in_order_with_their_data(stores) -> None:  # noqa: F811
    j = Journal(stores.open())
    assert j.next_offset == 0
    entries = [
        ("pop", {"g": "g1", "t": "orders", "q": 0, "o": 5, "n": 3}),
        ("ack", {"g": "g1", "t": "orders", "q": 0, "o": 5}),
        ("txn", {"id": "abc", "commit": True, "props": {"k": "v"}, "none": None}),
    ]
    for i, (op, data) in enumerate(entries):
        r = j.append(op, data)
        assert r.queue_offset == i
    assert j.next_offset == 3
    assert list(j.replay(0)) == entries


def test_replay_from_an_offset_skips_what_the_snapshot_covers(stores) -> None:  # noqa: F811
    j = Journal(stores.open())
    for i in range(10):
        j.append("n", {"i": i})
    assert [d["i"] for _, d in j.replay(7)] == [7, 8, 9]
    assert list(j.replay(10)) == []
    assert list(j.replay(50)) == []


def test_replay_reads_a_journal_longer_than_one_read(stores) -> None:  # noqa: F811
    j = Journal(stores.open())
    for i in range(1300):
        j.append("n", {"i": i})
    assert [d["i"] for _, d in j.replay(0)] == list(range(1300))


@pytest.mark.parametrize(
    "group, topic",
    [("g1", "orders"), ('we"ird\\group', "tópic/ü"), ("line\nbreak", "%RETRY%g+t"), ("", "t\u2028")],
)
def test_append_ack_is_the_same_entry_as_append_of_ack(stores, group: str, topic: str) -> None:  # noqa: F811
    j = Journal(stores.open())
    j.append_ack(group, topic, 3, 99)
    j.append_ack(group, topic, 3, 100)  # the cached JSON strings are used again
    j.append("ack", {"g": group, "t": topic, "q": 3, "o": 101})
    assert list(j.replay(0)) == [("ack", {"g": group, "t": topic, "q": 3, "o": o}) for o in (99, 100, 101)]


@pytest.mark.parametrize("key", ["dev-1", 'we"ird\\key', "clé\u2028", ""])
def test_append_kv_is_the_same_entry_as_append_of_kv(stores, key: str) -> None:  # noqa: F811
    s = stores.open()
    j = Journal(s)
    entries = [{"n": "mqtt.sessions", "k": key, "v": "eyJ4IjoxfQ==", "ver": 123456789 << 20},
               {"n": 'n"s', "k": key, "v": None, "ver": 7}]
    for d in entries:
        j.append_kv(d)
        j.append("kv", d)
    bodies = [bytes(m.body) for m in read_all(s, JOURNAL_TOPIC, 0)]
    assert bodies[0] == bodies[1] and bodies[2] == bodies[3]
    assert list(j.replay(0)) == [("kv", d) for d in entries for _ in (0, 1)]


def test_a_link_moves_a_message_and_journals_the_move_in_one_record(stores) -> None:  # noqa: F811
    s = stores.open()
    j = Journal(s)
    j.append("before", {})
    body = b"the body" * 500
    origin = s.put(Message("orders", body, queue_id=0, tag="T", properties={"user": "p"}))
    r = j.link(origin.commitlog_offset, "dest", 2, "tfire", {"tq": 7}, properties={"extra": "x"},
               reconsume_times=3)
    moved = read_all(s, "dest", 2)
    assert len(moved) == 1
    m = moved[0]
    assert m.body == body and m.tag == "T" and m.reconsume_times == 3
    assert m.properties["extra"] == "x"
    assert r.store_size < len(body)  # the body was not copied
    assert list(j.replay(0)) == [("before", {}), ("tfire", {"tq": 7})]
    assert j.next_offset == 2
    # the journal entry is the same record as the dispatch
    assert s.phys_at(JOURNAL_TOPIC, 0, 1) == s.phys_at("dest", 2, 0) == r.commitlog_offset


def test_entries_of_the_older_journal_format_are_replayed(stores) -> None:  # noqa: F811
    """Older journals carried op and data as properties of an empty record."""
    s = stores.open()
    j = Journal(s)
    s.put(Message(JOURNAL_TOPIC, b"", properties={P_JOURNAL_OP: "ack", P_JOURNAL_DATA: '{"o":1}'}))
    s.put(Message(JOURNAL_TOPIC, b"", properties={P_JOURNAL_OP: "noop"}))  # no data: {}
    j.append("new", {"o": 2})
    assert list(j.replay(0)) == [("ack", {"o": 1}), ("noop", {}), ("new", {"o": 2})]


def test_records_that_are_no_entries_are_skipped(stores) -> None:  # noqa: F811
    s = stores.open()
    j = Journal(s)
    j.append("a", {"n": 1})
    s.put(Message(JOURNAL_TOPIC, b""))
    s.put(Message(JOURNAL_TOPIC, b"lonely-op"))  # no data part
    j.append("b", {"n": 2})
    assert list(j.replay(0)) == [("a", {"n": 1}), ("b", {"n": 2})]


def test_the_journal_survives_a_restart(stores) -> None:  # noqa: F811
    s = stores.open()
    j = Journal(s)
    origin = s.put(Message("orders", b"x"))
    j.append("a", {"n": 1})
    j.append_ack("g", "t", 0, 4)
    j.link(origin.commitlog_offset, "dest", 0, "moved", {"n": 2})
    s2 = stores.reopen(s)
    assert list(Journal(s2).replay(0)) == [
        ("a", {"n": 1}),
        ("ack", {"g": "g", "t": "t", "q": 0, "o": 4}),
        ("moved", {"n": 2}),
    ]


def test_door_state_writes_of_one_call_share_records_and_replay_as_written(stores) -> None:  # noqa: F811
    from core_broker.journal import KVS_RECORD_BYTES

    s = stores.open()
    j = Journal(s)
    assert j.append_kvs("mqtt.sessions", []) is None  # nothing to write: no record
    value = "eyJ4IjoxfQ==" * 20  # a base64 session record of 240 characters
    entries = [(f'dev-{i}"\\', value if i % 7 else None, (i + 1) << 20) for i in range(1000)]
    last = j.append_kvs("mqtt.sessions", entries)
    records = read_all(s, JOURNAL_TOPIC, 0)
    # a thousand writes in a few records, each within the bound, the last one's result returned
    limit = min(KVS_RECORD_BYTES, s.config.max_message_size // 2)
    assert 1 < len(records) <= 1000 * 270 // limit + 2
    assert all(len(bytes(m.body)) <= limit + 100 for m in records)
    assert last is not None and last.queue_offset == len(records) - 1
    replayed = [(k, v, ver) for op, d in j.replay(0) for k, v, ver in d["e"] if op == "kvs" and d["n"] == "mqtt.sessions"]
    assert replayed == entries


async def test_batched_door_state_replays_from_the_journal_without_a_snapshot(tmp_path) -> None:
    """kv_put_many's records are what a restart reads when the snapshot does not cover them."""
    from core_broker.broker_controller import BrokerController
    from core_broker.config import BrokerConfig
    from store_helpers import make_config

    bc = BrokerController(make_config(tmp_path / "data"), BrokerConfig())
    await bc.start()
    v = bc.next_kv_version()
    await bc.kv_put_many("mqtt.sessions", [(f"c{i}", f"rec{i}".encode() * 50, v + i) for i in range(2000)], "gw")
    await bc.kv_put_many("mqtt.sessions", [("c1", None, v + 5000), ("c2", b"stale", v)], "gw")  # delete; too old
    await bc.stop()
    bc._state_path.unlink()  # as if the broker died before any snapshot: the journal from its start
    bc = BrokerController(make_config(tmp_path / "data"), BrokerConfig())
    await bc.start()
    try:
        want = {f"c{i}": f"rec{i}".encode() * 50 for i in range(2000) if i != 1}
        assert bc.kv_items("mqtt.sessions") == want
        assert bc.kv_get_versioned("mqtt.sessions", "c1") == (v + 5000, None)
        assert bc.kv_get_versioned("mqtt.sessions", "c2")[0] == v + 2
    finally:
        await bc.stop()
