"""The data path's domain objects as rows of a block (see ``wire.pack_block``).

Why rows: a separated deployment puts every message through two RPC hops
(client or door -> gateway -> broker), and packing each message through a
Python hook (an extension type per object, a nested packer per payload) cost
more than storing it. Here a batch becomes a list of tuples taken by
``operator.attrgetter`` (C code) and packed in one call by msgpack's C packer;
the reading side builds the objects back in one loop over the unpacked tuples.

Row layouts (positional; both ends run the same unimq version, which the frame
kind checks, see ``codec.py``):

- message: the fields of ``Message.__slots__`` in order (15);
- stored message: ``Message.__slots__ + StoredMessage.__slots__`` (19);
- send answer: ``(PutResult as a tuple, transaction id)``;
- popped message: ``(stored message row, receipt handle, delivery attempt,
  invisible until ms)``;
- get result: ``(status, [stored message rows], next, min, max offset)``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable, Sequence

from ..model import DispatchTarget, GetResult, GetStatus, Message, PutResult, PutStatus, StoredMessage
from ..pop_service import PoppedMessage
from .wire import pack_block, unpack_block

MESSAGE_FIELDS = Message.__slots__
STORED_FIELDS = Message.__slots__ + StoredMessage.__slots__
_message_row = attrgetter(*MESSAGE_FIELDS)
_stored_row = attrgetter(*STORED_FIELDS)
_new_tuple = tuple.__new__
_PUT_STATUS = {s.value: s for s in PutStatus}
_GET_STATUS = {s.value: s for s in GetStatus}


def _dispatch(extra: tuple) -> tuple[DispatchTarget, ...]:
    return tuple(_new_tuple(DispatchTarget, (t, q)) for t, q in extra)


# -- messages a producer sends --------------------------------------------------------

def messages_to_block(msgs: Iterable[Message]) -> bytes:
    return pack_block(list(map(_message_row, msgs)))


def messages_from_block(data: bytes) -> list[Message]:
    out = []
    new = Message.__new__
    for row in unpack_block(data):
        m = new(Message)
        (m.topic, m.body, m.tag, m.keys, m.properties, m.message_group, m.delivery_time_ms,
         m.born_timestamp_ms, m.born_host, m.protocol, m.message_id, m.queue_id, m.extra_dispatch,
         m.reconsume_times, m.flags) = row
        if m.extra_dispatch:
            m.extra_dispatch = _dispatch(m.extra_dispatch)
        out.append(m)
    return out


# -- stored messages (pop, pull) --------------------------------------------------------

def _stored(row: tuple) -> StoredMessage:
    sm = StoredMessage.__new__(StoredMessage)
    (sm.topic, sm.body, sm.tag, sm.keys, sm.properties, sm.message_group, sm.delivery_time_ms,
     sm.born_timestamp_ms, sm.born_host, sm.protocol, sm.message_id, sm.queue_id, sm.extra_dispatch,
     sm.reconsume_times, sm.flags, sm.queue_offset, sm.commitlog_offset, sm.store_size,
     sm.store_timestamp_ms) = row
    if sm.extra_dispatch:
        sm.extra_dispatch = _dispatch(sm.extra_dispatch)
    return sm


def popped_to_block(popped: Sequence[PoppedMessage]) -> bytes:
    row = _stored_row
    return pack_block([(row(m), h, a, until) for m, h, a, until in popped])


def popped_from_block(data: bytes) -> list[PoppedMessage]:
    new = _new_tuple
    stored = _stored
    return [new(PoppedMessage, (stored(r), h, a, until)) for r, h, a, until in unpack_block(data)]


def get_result_to_block(r: GetResult) -> bytes:
    return pack_block((r.status.value, list(map(_stored_row, r.messages)), r.next_offset, r.min_offset,
                       r.max_offset))


def get_result_from_block(data: bytes) -> GetResult:
    status, rows, nxt, lo, hi = unpack_block(data)
    return GetResult(_GET_STATUS[status], list(map(_stored, rows)), nxt, lo, hi)


# -- what a broker answers a send ----------------------------------------------------

def put_results_to_block(put: Sequence[tuple[PutResult, str | None]]) -> bytes:
    """A broker's ``(PutResult, transaction id)`` per message: tuples already, packed as they are."""
    return pack_block(put)


def put_results_from_block(data: bytes) -> list[tuple[PutResult, str | None]]:
    new = _new_tuple
    st = _PUT_STATUS
    return [
        (new(PutResult, (st[s], mid, qid, qo, clo, size, extra)), tid)
        for (s, mid, qid, qo, clo, size, extra), tid in unpack_block(data)
    ]
