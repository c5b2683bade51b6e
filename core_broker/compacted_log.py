"""One queue's compacted log: the sealed, compacted prefix of a compacted topic's queue.

Why a log of its own per queue (RocketMQ 5's CompactionStore, not Kafka's
in-place rewrite): the commitlog is shared by every topic, so a topic's old
messages cannot be rewritten where they are. The cleaner
(``core_broker/compaction.py``) copies the records it keeps, byte for byte
(CRC, ids and queue offsets unchanged), into a new *generation* of this log;
readers of queue offsets below the generation's ``boundary`` are served from
it, everything from the boundary on from the commitlog as before.

Files of ``compacted/<topic>/<queue>/``::

    <gen>.log    the kept records, one after the other (copies of commitlog records)
    <gen>.idx    20-byte entries: queue offset i64, position in <gen>.log i64, size i32,
                 in offset order (offsets have gaps where older values were dropped)
    state.json   {"gen": N, "boundary": B, "count": C}: which generation is live

A generation is written under ``.tmp`` names, fsync'ed, renamed into place,
and only then named by ``state.json`` (written atomically, then the directory
fsync'ed). A crash at any point leaves the old generation named and whole; the
files of any other generation are deleted when the queue is opened again.
Files of a live generation never change, so readers need no lock: a reader
keeps the generation object it started with, whose mappings stay valid after
the files are unlinked.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from pathlib import Path
from typing import Iterator

from . import record
from .json_file import read_json, write_json_atomic
from .model import StoredMessage

ENTRY = struct.Struct("<qqi")
ENTRY_SIZE = ENTRY.size
_unpack_from = ENTRY.unpack_from


def _map(path: Path) -> mmap.mmap | None:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Generation:
    """An immutable compacted log and its index (generation 0: empty, no files)."""

    __slots__ = ("gen", "boundary", "count", "_log", "_idx", "size")

    def __init__(self, directory: Path | None, gen: int, boundary: int, count: int) -> None:
        self.gen, self.boundary, self.count = gen, boundary, count
        self._log = self._idx = None
        self.size = 0
        if directory is not None and count:
            self._log = _map(directory / f"{gen}.log")
            self._idx = _map(directory / f"{gen}.idx")
            self.size = len(self._log) if self._log is not None else 0

    def entry(self, i: int) -> tuple[int, int, int]:
        return _unpack_from(self._idx, i * ENTRY_SIZE)  # type: ignore[arg-type]

    def first_offset(self) -> int:
        return self.entry(0)[0] if self.count else self.boundary

    def index_of(self, queue_offset: int) -> int:
        """Index of the first kept entry at or after ``queue_offset`` (a binary search of the
        mapped index: no list of the offsets, whatever the generation's size)."""
        return bisect.bisect_left(_QueueOffsets(self), queue_offset)

    @property
    def buffer(self) -> mmap.mmap | None:
        """The log's mapping (None while the generation is empty)."""
        return self._log

    def raw(self, pos: int, size: int) -> memoryview:
        return memoryview(self._log)[pos : pos + size]  # type: ignore[arg-type]

    def entries(self, start: int = 0) -> Iterator[tuple[int, int, int]]:
        for i in range(start, self.count):
            yield _unpack_from(self._idx, i * ENTRY_SIZE)  # type: ignore[arg-type]

    def message(self, pos: int) -> StoredMessage:
        return record.decode(self._log, pos)


class _QueueOffsets:
    """The queue offsets of a generation's index as a sequence (what ``bisect`` searches)."""

    __slots__ = ("_g",)

    def __init__(self, g: Generation) -> None:
        self._g = g

    def __len__(self) -> int:
        return self._g.count

    def __getitem__(self, i: int) -> int:
        return self._g.entry(i)[0]


class GenerationWriter:
    """Writes the next generation under temporary names; :meth:`commit` makes it the live one."""

    def __init__(self, directory: Path, gen: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.gen = directory, gen
        self._log_tmp = directory / f"{gen}.log.tmp"
        self._idx_tmp = directory / f"{gen}.idx.tmp"
        self._log = open(self._log_tmp, "wb", buffering=1 << 20)
        self._idx = open(self._idx_tmp, "wb", buffering=1 << 16)
        self.pos = 0
        self.count = 0

    def add(self, queue_offset: int, raw: bytes | memoryview) -> None:
        self._log.write(raw)
        self._idx.write(ENTRY.pack(queue_offset, self.pos, len(raw)))
        self.pos += len(raw)
        self.count += 1

    def commit(self, boundary: int) -> Generation:
        """fsync both files, rename them into place, then name them in ``state.json``."""
        for f in (self._log, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        d = self.directory
        os.replace(self._log_tmp, d / f"{self.gen}.log")
        os.replace(self._idx_tmp, d / f"{self.gen}.idx")
        _fsync_dir(d)
        write_json_atomic(d / "state.json", {"gen": self.gen, "boundary": boundary, "count": self.count})
        _fsync_dir(d)
        return Generation(d, self.gen, boundary, self.count)

    def abort(self) -> None:
        for f, p in ((self._log, self._log_tmp), (self._idx, self._idx_tmp)):
            f.close()
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def open_generation(directory: Path) -> Generation:
    """The live generation of a queue's compacted log; files of any other are deleted."""
    state = read_json(directory / "state.json", {}) if directory.exists() else {}
    gen = int(state.get("gen", 0))
    g = Generation(directory, gen, int(state.get("boundary", 0)), int(state.get("count", 0)))
    if directory.exists():
        remove_other_generations(directory, gen)
    return g


def remove_other_generations(directory: Path, live: int) -> None:
    """Delete the files of every generation but ``live`` (an old one, or one a crash left)."""
    keep = {f"{live}.log", f"{live}.idx", "state.json"}
    for p in directory.iterdir():
        if p.name not in keep and (p.name.endswith((".log", ".idx", ".tmp"))):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
