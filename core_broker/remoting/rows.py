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
- popped messages: ``([(stored message row, receipt handle, delivery attempt, invisible until
  ms)], shared)``;
- get result: ``(status, [stored message rows], next, min, max offset, shared)``.

A read of a batch topic answers one stored message per queue offset, the copies of one batch
record sharing its body (``core_broker/bulk_reads.py``): a row whose body is the previous row's
object carries ``None`` for it, and the reading side gives it the previous row's body back, so a
batch record crosses the wire once per read (and is unpacked once, ``gateway/batch_codec.py``).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable, Sequence

from ..model import DispatchTarget, GetResult, GetStatus, Message, PutResult, PutStatus, StoredMessage
from ..pop_service import PoppedMessage
from ..record import FLAG_BATCH as _FLAG_BATCH
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

def _stored_rows(messages: Sequence[StoredMessage]) -> tuple[list[tuple], bool]:
    """Rows of stored messages, a batch record's body shared with the previous row sent once (see
    above); and whether any was (the reading side then looks for them, else it need not)."""
    rows = list(map(_stored_row, messages))
    for m in messages:  # a plain loop: cheaper than any() over a generator, on every pull and pop
        if m.flags & _FLAG_BATCH:
            break
    else:
        return rows, False
    prev = None
    for i, m in enumerate(messages):
        b = m.body
        if b is prev and m.flags & _FLAG_BATCH:
            r = rows[i]
            rows[i] = (r[0], None, *r[2:])
        prev = b
    return rows, True


def _stored_all(rows: list, shared: bool) -> list[StoredMessage]:
    out = list(map(_stored, rows))
    if shared:
        prev = None
        for sm in out:
            if sm.body is None:
                sm.body = prev
            prev = sm.body
    return out


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
    rows, shared = _stored_rows([p[0] for p in popped])
    return pack_block(([(r, h, a, until) for r, (_, h, a, until) in zip(rows, popped)], shared))


def popped_from_block(data: bytes) -> list[PoppedMessage]:
    new = _new_tuple
    items, shared = unpack_block(data)
    msgs = _stored_all([it[0] for it in items], shared)
    return [new(PoppedMessage, (m, h, a, until)) for m, (_, h, a, until) in zip(msgs, items)]


def get_result_to_block(r: GetResult) -> bytes:
    rows, shared = _stored_rows(r.messages)
    return pack_block((r.status.value, rows, r.next_offset, r.min_offset, r.max_offset, shared))


def get_result_from_block(data: bytes) -> GetResult:
    status, rows, nxt, lo, hi, shared = unpack_block(data)
    return GetResult(_GET_STATUS[status], _stored_all(rows, shared), nxt, lo, hi)


def batches_to_block(page: tuple[list, int, int] | None) -> bytes:
    """A batch queue's records whole (``MessageStore.get_batches``): ``([(first, count, stored
    message row)], min, max)``, or None."""
    if page is None:
        return pack_block(None)
    recs, lo, hi = page
    return pack_block(([(first, n, _stored_row(m)) for first, n, m in recs], lo, hi))


def batches_from_block(data: bytes) -> tuple[list, int, int] | None:
    page = unpack_block(data)
    if page is None:
        return None
    recs, lo, hi = page
    return [(first, n, _stored(r)) for first, n, r in recs], lo, hi


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
