"""Sending to batch topics: a send call's messages packed into batch records, results unpacked.

Why in the gateway: the store keeps a producer's batch as one record it never opens
(``core_broker/batch_queue.py``); the gateway is the producer for every door, so
it packs here, once the processor's send loop has given each message its queue
and its extra dispatch (LMQs): consecutive messages of one batch topic bound for
the same queue, with the same tag and door, become one record
(``gateway/batch_codec.py``). Each sender still gets one result per message: its
own queue offset (the record's first + its index), id and LMQ offsets.

What a batch topic refuses (the send's own error codes): delay, FIFO and
transactional messages (``MESSAGE_PROPERTY_CONFLICT_WITH_TYPE``); what it keeps
per message without indexing: keys and client-chosen ids.
"""

from __future__ import annotations

from typing import Sequence

from core_broker.model import Message
from core_broker.record import P_BATCH_IDS

from .api import MessageTypeMismatchError, SendResult
from .batch_codec import BatchError, batch_record, compressed_block, unpack

__all__ = ["is_batch", "check_batchable", "Packed", "pack_call", "packed_record"]


def is_batch(config) -> bool:
    """A topic whose attribute ``batch`` is ``true`` (its queues are batch queues)."""
    return config.attributes.get("batch") == "true"


def compression_of(config) -> str:
    return config.attributes.get("batch.compression", "none")


def check_batchable(topic: str, mtype: str) -> None:
    """A batch topic takes plain messages only: a batch has one queue position for all."""
    if mtype != "NORMAL":
        raise MessageTypeMismatchError(
            f"topic {topic!r} is a batch topic (batch=true): it takes NORMAL messages only, not {mtype} "
            "(delay, FIFO and transactional messages are refused)")


class Packed:
    """A send call after packing: the messages to store, and per original message where its
    result lies (the stored message's index, and its index in that batch or -1)."""

    __slots__ = ("stored", "brokers", "where", "inner_extra", "ids")

    def __init__(self, messages: Sequence[Message]) -> None:
        self.stored: list[Message] = []
        self.brokers: list[str] = []
        self.where: list[tuple[int, int]] = []
        self.inner_extra: list[list[list[int]]] = []  # per stored: per message, its positions in extra_offsets
        self.ids = [m.message_id for m in messages]  # client-chosen ids: a batched message answers with its own

    def results(self, put: Sequence[SendResult]) -> list[SendResult]:
        out = []
        for n, (k, i) in enumerate(self.where):
            r = put[k]
            if i < 0:
                out.append(r)
                continue
            mid = self.ids[n] or r.message_id  # the id a read of it shows (batch_codec.expand)
            if not self.ids[n] and len(mid) == 34:  # a server id: the store's prefix and the record's offset
                mid = mid[:18] + "%016X" % (int(mid[18:], 16) + i)
            pos = self.inner_extra[k][i]
            extra = tuple(r.extra_offsets[p] for p in pos) if r.extra_offsets else ()
            out.append(SendResult(mid, r.topic, r.broker, r.queue_id, r.queue_offset + i, r.transaction_id, extra))
        return out


def pack_call(messages: Sequence[Message], brokers: Sequence[str], batch_topics: dict[str, str]) -> Packed:
    """Group runs of messages to a batch topic (``batch_topics``: topic -> compression) that share
    queue, tag and door into batch records; every other message stays as it is."""
    p = Packed(messages)
    i, n = 0, len(messages)
    while i < n:
        m = messages[i]
        comp = batch_topics.get(m.topic)
        j = i + 1
        if comp is not None:
            while (j < n and messages[j].topic == m.topic and messages[j].queue_id == m.queue_id
                   and brokers[j] == brokers[i] and messages[j].tag == m.tag and messages[j].protocol == m.protocol):
                j += 1
        k = len(p.stored)
        if j - i == 1:
            p.stored.append(m)
            p.where.append((k, -1))
            p.inner_extra.append([])
        else:
            run = messages[i:j]
            rec = batch_record(m.topic, run, comp)
            p.stored.append(rec)
            pos, c = [], 0
            for x in run:
                pos.append(list(range(c, c + len(x.extra_dispatch))))
                c += len(x.extra_dispatch)
            p.inner_extra.append(pos)
            p.where.extend((k, q) for q in range(j - i))
        p.brokers.append(brokers[i])
        i = j
    return p


def packed_record(topic: str, body: bytes, compression: str | None, protocol: str, host: str,
                  max_size: int) -> Message | None:
    """The record of a batch packed by its producer, checked (header, lengths, decompresses) but
    not re-encoded; None when its messages carry properties, which the doors route by (MQTT,
    AMQP), so the caller sends them one by one. ``compression`` is the topic's (None: not a batch
    topic, refused: a classic queue indexes records, not messages)."""
    if compression is None:
        raise BatchError(f"topic {topic!r} is not a batch topic (batch=true): a packed batch needs one")
    if len(body) > max_size:
        raise BatchError(f"a packed batch of {len(body)} bytes exceeds max_message_size ({max_size})")
    codec, count, _ = compressed_block(body)
    u = unpack(body)  # checks every column's bounds (and that it decompresses)
    if u.has_properties():
        return None
    rec = batch_record(topic, (), body=body, count=count)
    ids = u.client_ids()
    if ids is not None:  # indexed by the store, as a gateway-packed batch's (record.P_BATCH_IDS)
        rec.properties[P_BATCH_IDS] = "\0".join(ids)
    rec.protocol, rec.born_host, rec.born_timestamp_ms = protocol, host, int(u.born[0])
    return rec
