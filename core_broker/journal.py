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
from typing import Iterator

from .message_store import MessageStore
from .model import GetStatus, Message, PutResult
from .system_topics import JOURNAL_TOPIC, P_JOURNAL_DATA, P_JOURNAL_OP

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class Journal:
    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def append(self, op: str, data: dict) -> PutResult:
        """Write one state change (not waited for: callers await ``store.wait_durable``)."""
        m = Message(
            JOURNAL_TOPIC, b"", properties={P_JOURNAL_OP: op, P_JOURNAL_DATA: _dumps(data)}, queue_id=0
        )
        return self.store.put_nowait(m)

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

    def replay(self, start: int) -> Iterator[tuple[str, dict]]:
        """Every (op, data) from journal offset ``start`` to the end."""
        off = max(start, self.store.min_offset(JOURNAL_TOPIC, 0))
        while True:
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
                if op:
                    yield op, json.loads(m.properties.get(P_JOURNAL_DATA, "{}"))
            off = r.next_offset
