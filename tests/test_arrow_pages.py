"""Arrow pages without a server: the store's published record layout, the page builder, the processor's call.

- ``core_broker/record_layout.py`` names every field of what ``record.encode`` writes,
  at the right offsets (read back with ``struct`` from an encoded record);
- ``gateway/arrow_pages.py``'s columnar decoder gives, for a hand-made page of records
  (properties, keys, tags, groups, ids stored and derived, reserved properties), what
  ``record.decode`` + the decoded-message page give, and refuses a link record;
- ``pull_page`` takes the raw path when it can and the processor's pull otherwise;
- ``MessagingProcessor.pull_arrow`` without pyarrow is the typed 406 error.
"""

from __future__ import annotations

import struct
import sys

import pytest

pa = pytest.importorskip("pyarrow")

from core_broker import consume_queue, record  # noqa: E402
from core_broker.model import FilterExpression, FilterType, GetResult, GetStatus, Message  # noqa: E402
from core_broker.record_layout import ENTRY, HEADER, LAYOUT, VARIABLE  # noqa: E402
from gateway import arrow_pages  # noqa: E402
from gateway.api import ArrowPage, ArrowUnavailableError  # noqa: E402
from gateway.arrow_schema import ARROW_SCHEMA, MEDIA_TYPE  # noqa: E402
from gateway.context import RequestContext  # noqa: E402

PREFIX = "01ABCDEF0123456789"  # a store's id prefix (any string: it is copied)
CTX = RequestContext(protocol="test")


def _field(buf: bytes, name: str) -> int:
    f = next(f for f in HEADER if f.name == name)
    return struct.unpack_from("<" + f.code, buf, f.offset)[0]


def test_the_layout_names_what_the_codec_writes() -> None:
    m = Message("topic-1", b"body!", tag="tg", keys=["k1", "k2"], properties={"a": "1"}, message_group="grp",
                born_host="h:1", protocol="http", message_id="mid", queue_id=3, reconsume_times=2,
                born_timestamp_ms=1111, delivery_time_ms=3333)
    buf = record.encode(m, queue_offset=7, phys_offset=4096, store_ts=2222)
    got = {f.name: _field(buf, f.name) for f in HEADER}
    assert got["size"] == len(buf) and got["magic"] == LAYOUT.magic == record.MAGIC_MESSAGE
    assert (got["queue_id"], got["queue_offset"], got["phys_offset"]) == (3, 7, 4096)
    assert (got["born_ts"], got["store_ts"], got["delivery_ts"]) == (1111, 2222, 3333)
    assert (got["origin_offset"], got["reconsume_times"], got["flags"] & LAYOUT.flag_link) == (-1, 2, 0)
    # the variable fields follow the header in VARIABLE's order, each as long as its len_ field says
    pos, parts = LAYOUT.header_size, {}
    for name in VARIABLE:
        parts[name] = buf[pos : pos + got[f"len_{name}"]]
        pos += got[f"len_{name}"]
    assert pos == len(buf)
    assert parts["topic"] == b"topic-1" and parts["born_host"] == b"h:1" and parts["message_id"] == b"mid"
    assert parts["tag"] == b"tg" and parts["message_group"] == b"grp" and parts["protocol"] == b"http"
    assert parts["keys"] == LAYOUT.keys_separator.join(["k1", "k2"]).encode() and parts["body"] == b"body!"
    assert parts["properties"] == struct.pack(LAYOUT.property_entry, 1, 1) + b"a1"
    assert record.check(buf, 0, len(buf)) == (1, len(buf))  # crc_start: what the CRC covers
    from crc32c import crc32c

    assert crc32c(buf[LAYOUT.crc_start :]) == got["crc"]


def test_the_layout_names_what_the_bare_record_packer_writes() -> None:
    """A message with no tag, keys, properties or ids takes the store's bare-record packer."""
    buf = record.encode(Message("tp", b"xyz", protocol="mqtt", queue_id=1), queue_offset=9, phys_offset=64,
                        store_ts=5)
    got = {f.name: _field(buf, f.name) for f in HEADER}
    assert (got["size"], got["queue_id"], got["queue_offset"], got["phys_offset"]) == (len(buf), 1, 9, 64)
    assert (got["store_ts"], got["origin_offset"]) == (5, -1)
    lens = {name: got[f"len_{name}"] for name in VARIABLE}
    assert lens == {**dict.fromkeys(VARIABLE, 0), "topic": 2, "protocol": 4, "body": 3}
    assert buf[LAYOUT.header_size :] == b"tpmqttxyz"


def test_the_layout_names_the_consume_queue_entry() -> None:
    e = consume_queue.ENTRY.pack(123456789, 321, -5)
    assert LAYOUT.entry_size == len(e)
    assert [struct.unpack_from("<" + f.code, e, f.offset)[0] for f in ENTRY] == [123456789, 321, -5]
    assert [f.name for f in ENTRY] == ["commitlog_offset", "size", "tag_hash"]


# ------------------------------------------------------------------------------ the page builder


def _messages() -> list[Message]:
    return [
        Message("T", b"plain", protocol="http"),
        Message("T", b"\x00\xff", tag="a-tag", keys=["k1", "k2"], message_group="g", protocol="amqp",
                properties={"unit": "°C", "__reserved": "hidden", "seq": "1"}, message_id="chosen-id"),
        Message("T", b"", properties={"mqtt_topic": "a/b/c", "mqtt_qos": "1"}, protocol="mqtt",
                born_timestamp_ms=1_700_000_000_123),
        Message("T", b"{}", tag="evt", properties={"ce_type": "t.x", "ce_source": "/s", "ce_subject": "sub",
                                                   "ce_id": "e1"}, keys=["only"], protocol="cloudevents"),
    ]


def _page(msgs: list[Message], base: int = 1000, first_offset: int = 40,
          origin: int = -1) -> tuple[bytes, bytes, list]:
    """(entries, span, decoded messages) as the store would hand them: records laid out from
    commitlog offset ``base``, queue offsets from ``first_offset``."""
    entries, records, decoded, pos = [], [], [], base
    for i, m in enumerate(msgs):
        buf = record.encode(m, first_offset + i, pos, 1_700_000_000_500 + i, origin_offset=origin)
        entries.append(consume_queue.ENTRY.pack(pos, len(buf), 0))
        d = record.decode(buf, 0)
        d.message_id = d.message_id or f"{PREFIX}{pos:016X}"  # what the store's read path fills in
        decoded.append(d)
        records.append(buf)
        pos += len(buf)
    return b"".join(entries), b"".join(records), decoded


def test_raw_page_equals_the_decoded_page() -> None:
    entries, span, decoded = _page(_messages())
    fast = arrow_pages.raw_to_batch("T", 0, 40, entries, span, 1000, PREFIX)
    assert fast is not None and fast.schema.equals(ARROW_SCHEMA)
    assert fast.to_pylist() == arrow_pages.messages_to_batch(decoded).to_pylist()
    rows = fast.to_pylist()
    assert [r["queue_offset"] for r in rows] == [40, 41, 42, 43]
    assert rows[0]["message_id"] == f"{PREFIX}{1000:016X}" and rows[1]["message_id"] == "chosen-id"
    assert rows[0]["keys"] == [] and rows[1]["keys"] == ["k1", "k2"] and rows[3]["keys"] == ["only"]
    assert rows[0]["tag"] is None and rows[1]["tag"] == "a-tag" and rows[1]["message_group"] == "g"
    assert dict(rows[1]["properties"]) == {"unit": "°C", "seq": "1"}  # the reserved property left out
    assert rows[2]["mqtt_topic"] == "a/b/c" and rows[0]["mqtt_topic"] is None
    assert (rows[3]["ce_type"], rows[3]["ce_source"], rows[3]["ce_subject"]) == ("t.x", "/s", "sub")
    assert rows[2]["born_timestamp"].timestamp() == 1_700_000_000.123


def test_the_raw_page_refuses_what_it_cannot_decode() -> None:
    entries, span, _ = _page(_messages(), origin=64)  # link records: their body is another record's
    assert arrow_pages.raw_to_batch("T", 0, 40, entries, span, 1000, PREFIX) is None
    entries, span, _ = _page(_messages())
    assert arrow_pages.raw_to_batch("T", 0, 40, entries, span, 999, PREFIX) is None  # records misplaced
    bad = bytearray(span)
    bad[-1] ^= 0xFF  # the last body byte: only the CRC tells (checked unless pages skip it, VERIFY_CRC)
    assert arrow_pages.raw_to_batch("T", 0, 40, entries, bytes(bad), 1000, PREFIX) is None
    assert arrow_pages.raw_to_batch("T", 0, 40, entries, bytes(bad), 1000, PREFIX, verify=False) is not None
    assert arrow_pages.raw_to_batch("T", 0, 40, b"", b"", 0, PREFIX).num_rows == 0


class FakeReader:
    def __init__(self, raw: tuple | None, decoded: list) -> None:
        self.raw, self.decoded, self.calls = raw, decoded, []

    async def pull_raw(self, ctx, topic, queue_id, offset, max_count):  # noqa: ANN001, ANN201
        self.calls.append("pull_raw")
        return self.raw

    async def pull(self, ctx, topic, queue_id, offset, max_count=32, filter_expression=None, wait_ms=0):  # noqa
        self.calls.append(("pull", filter_expression, wait_ms))
        return GetResult(GetStatus.FOUND, self.decoded, offset + len(self.decoded), 0, 99)


def _rows(page: ArrowPage) -> list[dict]:
    return [r for b in pa.ipc.open_stream(pa.py_buffer(page.data)) for r in b.to_pylist()]


async def test_pull_page_reads_raw_records_when_it_can() -> None:
    entries, span, decoded = _page(_messages())
    reader = FakeReader((entries, memoryview(span), 1000, PREFIX, 0, 44), decoded)
    page = await arrow_pages.pull_page(reader, CTX, "T", 0, 40, 10)
    assert reader.calls == ["pull_raw"]
    assert page.media_type == MEDIA_TYPE and (page.next_offset, page.min_offset, page.max_offset) == (44, 0, 44)
    assert _rows(page) == arrow_pages.messages_to_batch(decoded).to_pylist()


async def test_pull_page_falls_back_to_pull() -> None:
    entries, span, decoded = _page(_messages(), origin=64)
    reader = FakeReader((entries, memoryview(span), 1000, PREFIX, 0, 44), decoded)  # link records
    page = await arrow_pages.pull_page(reader, CTX, "T", 0, 40, 10, wait_ms=5)
    assert reader.calls == ["pull_raw", ("pull", None, 5)] and (page.next_offset, page.max_offset) == (44, 99)
    assert len(_rows(page)) == 4
    tags = FilterExpression("evt", FilterType.TAG)
    reader = FakeReader(None, decoded[3:])
    page = await arrow_pages.pull_page(reader, CTX, "T", 0, 43, 10, tags)
    assert reader.calls == [("pull", tags, 0)]  # a filtered read never asks for raw records
    assert [r["tag"] for r in _rows(page)] == ["evt"]


async def test_pull_arrow_without_pyarrow_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.broker_client import LocalBrokerClient
    from gateway.processor import MessagingProcessor

    p = MessagingProcessor(LocalBrokerClient.__new__(LocalBrokerClient))
    import gateway

    monkeypatch.setitem(sys.modules, "gateway.arrow_pages", None)  # as if pyarrow were missing
    monkeypatch.delattr(gateway, "arrow_pages")
    with pytest.raises(ArrowUnavailableError) as e:
        await p.pull_arrow(CTX, "T", 0, 0, 10)
    assert e.value.code == "NOT_ACCEPTABLE" and "unimq[spark]" in str(e.value)
