"""Consumer offsets per (group, topic, queue), persisted periodically and on shutdown.

Like RocketMQ's consumerOffset.json: commits are in memory and cheap; a
background thread writes the table every few seconds, and a clean shutdown
writes it last, so a crash can replay at most that window (at-least-once).
"""

from __future__ import annotations

import threading
from pathlib import Path

from .json_file import read_json, write_json_atomic
from .system_topics import LMQ_PREFIX


class ConsumerOffsetStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        # group -> (topic, queue_id) -> offset
        self.table: dict[str, dict[tuple[str, int], int]] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._dirty = False

    def load(self) -> None:
        raw = read_json(self.path, {})
        for group, entries in raw.items():
            t = self.table.setdefault(group, {})
            for key, off in entries.items():
                topic, _, qid = key.rpartition("@")
                t[(topic, int(qid))] = int(off)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self.table.setdefault(group, {})[(topic, queue_id)] = offset
            self._dirty = True

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        t = self.table.get(group)
        return None if t is None else t.get((topic, queue_id))

    def groups(self) -> list[str]:
        return list(self.table)

    def of_group(self, group: str) -> dict[tuple[str, int], int]:
        return dict(self.table.get(group, {}))

    def clear(self) -> None:
        """Forget every commit (a replica whose saved state outran its log: the journal rebuilds it)."""
        with self._lock:
            self.table.clear()

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            for t in self.table.values():
                if topic.startswith(LMQ_PREFIX):  # queue 0 only: no scan (one LMQ per subscription)
                    t.pop((topic, 0), None)
                    continue
                for k in [k for k in t if k[0] == topic]:
                    del t[k]
            self._dirty = True

    def persist(self, force: bool = False) -> None:
        """Write the table if it changed; runs on the store's background thread."""
        with self._write_lock:  # the snapshot and housekeeping threads both persist
            with self._lock:
                if not (self._dirty or force):
                    return
                snapshot = {g: {f"{tp}@{q}": o for (tp, q), o in t.items()} for g, t in self.table.items()}
                self._dirty = False
            write_json_atomic(self.path, snapshot)
