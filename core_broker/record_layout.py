"""The commitlog record layout as data, for readers that decode many records at once.

Why: a columnar reader (the gateway's Arrow pages) decodes a whole page of raw
records with array operations instead of calling :func:`record.decode` per
message, so it must know where each field of a record lies. That knowledge
belongs to the store, next to the codec, and is given here as plain names,
struct type codes and constants (no numpy, no pyarrow): the reader builds its
own array types from them, and a change of the layout in ``record.py`` or
``consume_queue.py`` either shows up here or fails at import.

The type codes are read from the codec's own ``struct`` formats; this module
only names the fields (in the order ``record.py``'s docstring lists them).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from . import consume_queue, record

__all__ = ["Field", "HEADER", "ENTRY", "VARIABLE", "RecordLayout", "LAYOUT"]


class Field(NamedTuple):
    """One fixed-size field: its name, its ``struct`` type code and its byte offset."""

    name: str
    code: str
    offset: int


def _fields(names: tuple[str, ...], fmt: str) -> tuple[Field, ...]:
    """Name the fields of a little-endian ``struct`` format of single codes (no counts, no padding)."""
    if not fmt.startswith("<") or len(fmt) - 1 != len(names) or not fmt[1:].isalpha():
        raise ImportError(f"record layout out of step with the codec: {fmt!r} for {len(names)} fields")
    out, offset = [], 0
    for name, code in zip(names, fmt[1:]):
        out.append(Field(name, code, offset))
        offset += struct.calcsize("<" + code)
    if offset != struct.calcsize(fmt):
        raise ImportError(f"record layout out of step with the codec: {fmt!r} has padding")
    return tuple(out)


#: The variable-length fields that follow a record's header, in order; the header holds
#: each one's length in the field ``len_<name>``.
VARIABLE: tuple[str, ...] = (
    "topic", "born_host", "message_id", "tag", "message_group", "protocol", "keys", "properties", "dispatch",
    "body",
)

#: A record's fixed header (``record.PREFIX`` then ``record.FIXED``).
HEADER: tuple[Field, ...] = _fields(
    (
        "size", "magic", "crc",
        "flags", "queue_id", "queue_offset", "phys_offset", "born_ts", "store_ts", "delivery_ts",
        "origin_offset", "origin_size", "reconsume_times",
        *(f"len_{name}" for name in VARIABLE),
    ),
    record.PREFIX.format + record.FIXED.format[1:],
)

#: A consume-queue entry (``consume_queue.ENTRY``): where a queue offset's record lies.
ENTRY: tuple[Field, ...] = _fields(("commitlog_offset", "size", "tag_hash"), consume_queue.ENTRY.format)


class RecordLayout(NamedTuple):
    """Everything a bulk reader needs besides :data:`HEADER`, :data:`ENTRY` and :data:`VARIABLE`."""

    header_size: int  # bytes before the first variable field
    entry_size: int  # bytes of one consume-queue entry
    magic: int  # ``magic`` of a message record (a BLANK filler has another)
    flag_link: int  # bit of ``flags``: a link record, whose body is another record's
    crc_start: int  # the CRC covers the record from this byte to its end
    keys_separator: str  # between the message keys of the ``keys`` field
    property_entry: str  # ``struct`` format of (key length, value length) before each property
    message_id_hex_digits: int  # a server-assigned id: the store's prefix + the record's commitlog offset in hex


LAYOUT = RecordLayout(
    header_size=record.HEADER_SIZE,
    entry_size=consume_queue.ENTRY.size,
    magic=record.MAGIC_MESSAGE,
    flag_link=record.FLAG_LINK,
    crc_start=record.PREFIX.size,
    keys_separator="\0",
    property_entry=record.PROPERTY_ENTRY.format,
    message_id_hex_digits=16,
)

if HEADER[-1].offset + struct.calcsize("<" + HEADER[-1].code) != LAYOUT.header_size:
    raise ImportError("record layout out of step with the codec: the header's fields do not make HEADER_SIZE")
