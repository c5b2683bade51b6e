"""The broker journal: every consumption-state change as a record in the commitlog.

Pop cursors, in-flight messages, acks, timer fires and transaction outcomes
are kept in memory and snapshotted every few seconds; between snapshots each
change is appended here, and a restart replays the journal from the offset the
last snapshot covers. Changes that also move a message (a retry, a dead
letter, a timer fire, a commit) are *one* link record dispatched both into its
destination queue and into the journal, so the move and its bookkeeping can
never be split by a crash. This is RocketMQ's CK/ACK-in-the-revive-topic idea
without copying message bodies.
"""

from __future__ import annotations

import json
from typing import Callable, Iterator

from .message_store import MessageStore
from .model import GetResult, GetStatus, Message, PutResult
from .system_topics import JOURNAL_TOPIC, P_JOURNAL_DATA, P_JOURNAL_OP

ColdGet = Callable[[str, int, int, int], "GetResult | None"]  # (topic, queue, offset, max) -> a get or None

_dumps = json.JSONEncoder(separators=(",", ":")).encode
KVS_RECORD_BYTES = 64 * 1024  # text per ``kvs`` record (at most half the store's max message size)
_jstr_cache: dict[str, str] = {}


def _jstr(s: str) -> str:
    """A string as JSON text, cached (groups and topics repeat)."""
    j = _jstr_cache.get(s)
    if j is None:
        if len(_jstr_cache) >= 4096:
            _jstr_cache.clear()
        j = _jstr_cache[s] = _dumps(s)
    return j


class Journal:
    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def append(self, op: str, data: dict) -> PutResult:
        """Write one state change (not waited for: callers await ``store.wait_durable``).

        The entry is the record's body, ``<op> <json>``, and the record has no properties:
        the store's cheapest path for the most frequent write of a pop consumer (acks).
        Older journals carried op and data as properties; replay reads both.
        """
        m = Message(JOURNAL_TOPIC, f"{op} {_dumps(data)}".encode())
        return self.store.put_nowait(m)

    def append_ack(self, group: str, topic: str, queue_id: int, offset: int) -> PutResult:
        """``append("ack", ...)`` without a JSON encoder call: one ack per popped message
        makes this the journal's most frequent entry (the same JSON text)."""
        data = f'{{"g":{_jstr(group)},"t":{_jstr(topic)},"q":{int(queue_id)},"o":{int(offset)}}}'
        return self.store.put_nowait(Message(JOURNAL_TOPIC, f"ack {data}".encode()))

    def append_kv(self, data: dict) -> PutResult:
        """``append("kv", data)`` for a door-state write ``{"n", "k", "v", "ver"}`` (``v``: base64
        or None) without the JSON encoder's generic walk: a storm of MQTT CONNECTs writes one per
        device. The same text the encoder writes (base64 needs no escaping)."""
        v = data["v"]
        vj = "null" if v is None else f'"{v}"'
        text = f'kv {{"n":{_jstr(data["n"])},"k":{_dumps(data["k"])},"v":{vj},"ver":{int(data["ver"])}}}'
        return self.store.put_nowait(Message(JOURNAL_TOPIC, text.encode()))

    def append_kvs(self, namespace: str, entries: list[tuple[str, str | None, int]]) -> PutResult | None:
        """Several door-state writes of one namespace (key, base64 value or None, version) as
        ``kvs {"n", "e": [[k, v, ver], ...]}`` records of at most :data:`KVS_RECORD_BYTES` each
        (or half the store's largest message, if smaller; one oversized entry goes alone):
        a storm of MQTT CONNECTs writes hundreds of session records per call, and one record per
        entry made the store's append (header, CRC, index) the broker's largest cost per
        CONNECT. A record is all or nothing in a crash; the caller answers only once the last is
        durable, so no write is acknowledged and then lost. Returns the last record's result
        (None for no entries)."""
        head = f'kvs {{"n":{_jstr(namespace)},"e":['
        limit = min(KVS_RECORD_BYTES, self.store.config.max_message_size // 2)
        parts: list[str] = []
        size = 0
        last = None
        for k, v, ver in entries:
            part = f'[{_dumps(k)},{"null" if v is None else f"{chr(34)}{v}{chr(34)}"},{int(ver)}]'
            if parts and size + len(part) > limit:
                last = self.store.put_nowait(Message(JOURNAL_TOPIC, f'{head}{",".join(parts)}]}}'.encode()))
                parts, size = [], 0
            parts.append(part)
            size += len(part) + 1
        if parts:
            last = self.store.put_nowait(Message(JOURNAL_TOPIC, f'{head}{",".join(parts)}]}}'.encode()))
        return last

    def link(
        self,
        origin_phys: int,
        topic: str,
        queue_id: int,
        op: str,
        data: dict,
        *,
        properties: dict[str, str] | None = None,
        reconsume_times: int = 0,
    ) -> PutResult:
        """Dispatch a stored message into (topic, queue) and journal ``op`` in one record."""
        props = dict(properties or {})
        props[P_JOURNAL_OP] = op
        props[P_JOURNAL_DATA] = _dumps(data)
        return self.store.put_link(
            origin_phys,
            topic,
            queue_id,
            properties=props,
            reconsume_times=reconsume_times,
            extra_dispatch=[(JOURNAL_TOPIC, 0)],
            wait=False,
        )

    @property
    def next_offset(self) -> int:
        return self.store.max_offset(JOURNAL_TOPIC, 0)

    def replay(self, start: int, cold: ColdGet | None = None) -> Iterator[tuple[str, dict]]:
        """Every (op, data) from journal offset ``start`` to the end; offsets below the local
        queue's minimum through ``cold`` (the tier's read, which blocks on the network) if given."""
        local_min = self.store.min_offset(JOURNAL_TOPIC, 0)
        off = start if cold is not None else max(start, local_min)
        while True:
            if off < local_min:
                cr = cold(JOURNAL_TOPIC, 0, off, 512) if cold is not None else None
                if cr is None:  # nothing there in the tier either
                    off = local_min
                    continue
                r = cr
            else:
                r = self.store.get(JOURNAL_TOPIC, 0, off, 512)
            if r.status == GetStatus.OFFSET_MOVED:
                off = r.next_offset
                continue
            if not r.messages:
                if r.status == GetStatus.NO_MATCHED_MESSAGE and r.next_offset > off:
                    off = r.next_offset
                    continue
                return
            for m in r.messages:
                op = m.properties.get(P_JOURNAL_OP)
                if op:  # a link record's entry, or an entry of an older journal
                    yield op, json.loads(m.properties.get(P_JOURNAL_DATA, "{}"))
                elif m.body:
                    op_b, _, data = bytes(m.body).partition(b" ")
                    if op_b and data:
                        yield op_b.decode(), json.loads(data)
            off = r.next_offset
