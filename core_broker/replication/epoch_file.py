"""The epoch file: which master wrote which part of the log.

Each entry is (master epoch, start offset): the master of that epoch wrote the
log from that offset on. A master appends its epoch when it takes office; a
replica keeps a copy of its master's entries. Comparing two files newest first
finds the last offset both logs agree on (:func:`common_end`), which is where a
rejoining replica (or a deposed master) must cut its log before it catches up:
whatever it holds past that point was written by a master whose writes the
group did not keep. This is RocketMQ 5's epoch file / Kafka's leader epoch cache.

Written atomically (temp file, fsync, rename: ``json_file.write_json_atomic``).
"""

from __future__ import annotations

from pathlib import Path

from ..json_file import read_json, write_json_atomic

__all__ = ["EpochFile", "common_end"]

Entries = list[tuple[int, int]]


class EpochFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: Entries = []

    def load(self) -> None:
        self.entries = [(int(e), int(s)) for e, s in read_json(self.path, {"entries": []})["entries"]]

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """This broker is master of ``epoch`` from ``start`` on (idempotent)."""
        if self.entries and self.entries[-1][0] >= epoch:
            return
        self._write([*self.entries, (epoch, start)])

    def adopt(self, master_entries: Entries, upto: int) -> None:
        """A replica's copy of its master's history, limited to what it holds (< ``upto``)."""
        mine = [(e, s) for e, s in master_entries if s <= upto]
        if mine != self.entries:
            self._write(mine)

    def cut(self, offset: int) -> None:
        """Forget epochs that start past ``offset`` (the log was cut there)."""
        keep = [(e, s) for e, s in self.entries if s <= offset]
        if keep != self.entries:
            self._write(keep)

    def _write(self, entries: Entries) -> None:
        write_json_atomic(self.path, {"entries": [list(x) for x in entries]})
        self.entries = entries


def _end_of(entries: Entries, i: int, log_end: int) -> int:
    return entries[i + 1][1] if i + 1 < len(entries) else log_end


def common_end(mine: Entries, my_end: int, theirs: Entries, their_end: int) -> int:
    """The offset up to which two logs are the same, judged by their epoch histories.

    The newest epoch both histories name, with the same start, was written by one
    master: both logs agree up to where the shorter of the two stops in it. With no
    common epoch nothing can be trusted: 0 (the replica copies from scratch).
    """
    starts = {e: i for i, (e, _) in enumerate(theirs)}
    for i in range(len(mine) - 1, -1, -1):
        epoch, start = mine[i]
        j = starts.get(epoch)
        if j is None or theirs[j][1] != start:
            continue
        return min(_end_of(mine, i, my_end), _end_of(theirs, j, their_end))
    return 0
