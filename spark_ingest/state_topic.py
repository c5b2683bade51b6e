"""A streaming job's keyed state in a COMPACTED unimq topic, restorable after any crash.

Why a compacted topic: Spark keeps a stateful query's state in its checkpoint
directory, so losing that directory loses the aggregates. RocketMQ Streams
keeps its state store in a compacted topic instead; so does this: one message
per state entry (its key is the entry's key, the latest value wins, an empty
body deletes it), plus one ``_progress`` message naming how far the state goes
(for a Spark job: the source offsets counted so far).

Why every value carries its previous one: a micro-batch changes many entries,
and a topic cannot take them in one atomic write (a COMPACTED topic refuses
batch records). So a commit numbered ``seq`` writes each changed entry as
``{"seq", "value", "prev"}`` (``prev``: the value committed before), and only
then ``_progress`` with ``seq``. :meth:`StateTopic.load` trusts an entry whose
``seq`` the progress record reached and takes ``prev`` from one that is one
ahead (a commit cut short by a crash): the state read back is always exactly
some committed one, and :meth:`StateTopic.load` writes the committed values of a cut commit's
entries back before the next commit reuses its number. A deleted entry is first written as ``value: null`` (so the
delete is undone with the rest), and its empty-body delete marker is sent only
after the progress record, for compaction to drop the key.

One writer per topic: two jobs committing into the same state topic would
interleave their sequence numbers; nothing here fences a second writer.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Mapping, Union

import orjson

from .client import GatewayClient

PROGRESS_KEY = "_progress"

JSON = Union[dict, list, str, int, float, bool, None]


class StateError(RuntimeError):
    """The state topic holds something this module did not write (or another type of topic)."""


@dataclass
class Snapshot:
    """A committed state: its sequence number, its progress document and its entries."""

    seq: int = 0
    progress: dict = field(default_factory=dict)
    entries: dict[str, JSON] = field(default_factory=dict)
    undone: list[str] = field(default_factory=list)  # keys a cut commit wrote (to roll back)


def restore(rows: Mapping[str, bytes]) -> Snapshot:
    """The committed state in a table read (key -> body), undoing a commit cut short."""
    raw = rows.get(PROGRESS_KEY)
    progress = orjson.loads(raw) if raw else {"seq": 0}
    seq = int(progress.pop("seq"))
    entries: dict[str, JSON] = {}
    undone: list[str] = []
    for key, body in rows.items():
        if key == PROGRESS_KEY or not body:
            continue
        rec = orjson.loads(body)
        at = int(rec["seq"])
        if at <= seq:
            value = rec["value"]
        elif at == seq + 1:  # written by the commit a crash cut before its progress record
            value = rec["prev"]
            undone.append(key)
        else:
            raise StateError(f"state entry {key!r} is at seq {at}, the progress record at {seq}: "
                             "two writers, or a progress record lost")
        if value is not None:
            entries[key] = value
    return Snapshot(seq, progress, entries, undone)


class StateTopic:
    """The state of one job in COMPACTED topic ``topic`` (created on demand, one queue)."""

    def __init__(self, endpoint: str, topic: str, timeout_s: float = 60.0) -> None:
        self.topic = topic
        self.client = GatewayClient(endpoint, timeout_s)
        self.committed = Snapshot()

    def close(self) -> None:
        self.client.close()

    def reset(self) -> bool:
        """Delete the topic and every entry in it; True if there was one."""
        self.committed = Snapshot()
        return self.client.delete_topic(self.topic)

    def load(self) -> Snapshot:
        """Create the topic if needed, and read its committed state (the table: latest per key)."""
        self.client.create_topic(self.topic, queues=1, kind="COMPACTED")
        rows = {r["key"]: base64.b64decode(r.get("body_base64") or "") for r in self.client.read_table(self.topic)}
        self.committed = snap = restore(rows)
        for key in snap.undone:  # roll a cut commit back, or the next commit (same seq) would adopt it
            value = snap.entries.get(key)
            self._send(key, b"" if value is None else orjson.dumps({"seq": snap.seq, "value": value, "prev": value}))
        return Snapshot(snap.seq, dict(snap.progress), dict(snap.entries), list(snap.undone))

    def _send(self, key: str, body: bytes) -> None:
        if "," in key:  # the door splits unimq-keys on commas
            raise ValueError(f"state key {key!r} must not contain a comma")
        self.client.send(self.topic, body, {"content-type": "application/json", "unimq-keys": key})

    def write(self, changes: Mapping[str, JSON]) -> None:
        """Write the entries of the next commit (``None``: delete), each with its undo image.

        Not visible to :meth:`load` until :meth:`commit`: a crash in between restores the
        previous commit."""
        seq = self.committed.seq + 1
        for key, value in changes.items():
            prev = self.committed.entries.get(key)
            self._send(key, orjson.dumps({"seq": seq, "value": value, "prev": prev}))

    def commit(self, changes: Mapping[str, JSON], progress: dict) -> int:
        """Write ``changes`` (``None`` deletes), then the progress record: the new committed state.
        Returns its sequence number."""
        self.write(changes)
        seq = self.committed.seq + 1
        self._send(PROGRESS_KEY, orjson.dumps({**progress, "seq": seq}))
        for key, value in changes.items():
            if value is None:
                self.committed.entries.pop(key, None)
                self._send(key, b"")  # the delete marker: compaction drops the key
            else:
                self.committed.entries[key] = value
        self.committed.seq = seq
        self.committed.progress = dict(progress)
        return seq
