"""The appender on its own: a commitlog, an index and consume queues in a temp folder, no store.

Both loops (record at a time, batch) and link records must write ``record.encode``'s bytes
and the same consume-queue entries; the store-level tests (test_store_encoding.py) generate
every field combination through the store's public paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core_broker import record
from core_broker.appender import Appender
from core_broker.errors import BadRequestError, MessageTooLargeError, StoreClosedError
from core_broker.model import DispatchTarget, Message, PutStatus
from store_helpers import make_appender

NOW = 1_700_000_000_000


MSGS = [
    Message("t", b"bare", queue_id=0),
    Message("t", b"x" * 300, queue_id=1, protocol="mqtt"),
    Message("t", b"props", queue_id=0, properties={"mqtt_topic": "a/b"}, tag="TagA", keys=["k1", "k2"]),
    Message("u", b"", queue_id=0, message_id="client-id-1", born_host="10.0.0.1:1"),
    # door publishes (properties and a born host only): runs of equal ones share a header template
    *[Message("t", body, queue_id=0, protocol="mqtt", properties=dict(props), born_host=host)
      for body, props, host in (
          (b"d1", {"mqtt_topic": "t/a", "mqtt_qos": "0"}, "127.0.0.1:5"),
          (b"d2", {"mqtt_topic": "t/a", "mqtt_qos": "0"}, "127.0.0.1:5"),
          (b"d3", {"mqtt_topic": "t/a", "mqtt_qos": "1"}, "127.0.0.1:5"),
          (b"y" * 300, {"mqtt_topic": "t/a", "mqtt_qos": "1"}, "127.0.0.1:5"),
          (b"d5", {"mqtt_topic": "t/a", "mqtt_qos": "1"}, "127.0.0.1:6"),
          (b"d6", {}, "127.0.0.1:6"),
          (b"d7", {"k": "v"}, ""),
      )],
    Message("u", b"d8", queue_id=0, protocol="mqtt", properties={"k": "v"}),  # only the topic differs
    Message("u", b"d9", queue_id=0, protocol="amqp", properties={"k": "v"}),  # only the protocol
    # ... and with one extra queue (an MQTT QoS 1 subscriber's LMQ): its offset is the record's own
    *[Message("t", body, queue_id=1, protocol="mqtt", properties={"mqtt_qos": "1"}, born_host="127.0.0.1:5",
              extra_dispatch=x)
      for body, x in (
          (b"x1", (DispatchTarget("%LMQ%a", 0),)),
          (b"x2", (DispatchTarget("%LMQ%a", 0),)),
          (b"z" * 300, (DispatchTarget("%LMQ%a", 0),)),
          (b"x4", (DispatchTarget("%LMQ%bb", 0),)),
          (b"x5", (DispatchTarget("%LMQ%a", 0), DispatchTarget("%LMQ%bb", 0))),  # two: the general path
          (b"x6", ()),
          (b"x7", (DispatchTarget("%LMQ%a", 0),)),
      )],
]


def stored_bytes(a: Appender, r) -> bytes:
    seg = a.commitlog.files.find(r.commitlog_offset)
    off = r.commitlog_offset - seg.base
    return bytes(seg.mm[off : off + r.store_size])


@pytest.mark.parametrize("batch", [False, True])
def test_both_loops_write_record_encode_bytes(tmp_path: Path, batch: bool) -> None:
    a = make_appender(tmp_path)
    rs = a.append_batch(MSGS, NOW) if batch else [a.append_one(m, NOW) for m in MSGS]
    for m, r in zip(MSGS, rs):
        assert r.status == PutStatus.PUT_OK
        dispatch = record.encode_dispatch(m.extra_dispatch, r.extra_offsets)
        assert stored_bytes(a, r) == record.encode(m, r.queue_offset, r.commitlog_offset, NOW, dispatch)
        assert a._cqs[(m.topic, m.queue_id)].entry(r.queue_offset)[:2] == (r.commitlog_offset, r.store_size)
        for t, o in zip(m.extra_dispatch, r.extra_offsets, strict=True):
            assert a._cqs[t].entry(o)[:2] == (r.commitlog_offset, r.store_size)
    # server-assigned ids name the store and the record's offset; a client's id is kept
    assert rs[0].message_id == a.message_id(rs[0].commitlog_offset) == f"0200112233AABBCCDD{rs[0].commitlog_offset:016X}"
    assert rs[3].message_id == "client-id-1"
    assert rs[5].message_id == a.message_id(rs[5].commitlog_offset)
    assert a.commitlog.write_pos == rs[-1].commitlog_offset + rs[-1].store_size


def test_a_link_points_at_its_origin_without_copying_the_body(tmp_path: Path) -> None:
    a = make_appender(tmp_path)
    origin = a.append_one(Message("t", b"the body" * 100, queue_id=0, tag="T"), NOW)
    stored = a.commitlog.read(origin.commitlog_offset)
    r = a.append_link(Message("%RETRY%g+t", b"", queue_id=0, tag="T"), stored, origin.commitlog_offset,
                      [("%DLQ%g", 0)], NOW)
    assert r.store_size < origin.store_size  # no body
    assert a.commitlog.link_origin(r.commitlog_offset)[0] == origin.commitlog_offset
    assert r.message_id == origin.message_id  # the id of the message it dispatches
    assert a._cqs[("%DLQ%g", 0)].entry(0)[0] == r.commitlog_offset


def test_refusals_write_nothing(tmp_path: Path) -> None:
    a = make_appender(tmp_path, max_size=100)
    with pytest.raises(MessageTooLargeError):
        a.append_one(Message("t", b"x" * 101, queue_id=0), NOW)
    with pytest.raises(BadRequestError):  # the same queue twice
        a.append_one(Message("t", b"x", queue_id=0, extra_dispatch=[("t", 0)]), NOW)
    assert a.commitlog.write_pos == 0
    # in a batch, the records before the bad one are written, the bad one is refused
    with pytest.raises(MessageTooLargeError):
        a.append_batch([Message("t", b"ok", queue_id=0), Message("t", b"x" * 101, queue_id=0)], NOW)
    assert a._cqs[("t", 0)].max_offset == 1
    a.open = False
    with pytest.raises(StoreClosedError):
        a.append_batch([Message("t", b"ok", queue_id=0)], NOW)
