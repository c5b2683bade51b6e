"""Fixed-size, preallocated, memory-mapped segment files and the ordered queue of them.

The commitlog and every consume queue are sequences of such segments, each
named by the 20-digit offset of its first byte (as RocketMQ names them), so
that any logical byte offset maps to one file without an index.

Why mmap: a put is a memcpy into the page cache (no syscall per message) and
a read is a slice, which is what lets CPython approach the throughput a
messaging store needs. Why ``posix_fallocate``: writing through a mapping of
a sparse file on a full disk raises SIGBUS and kills the process; reserving
the blocks up front turns a full disk into an ``ENOSPC`` at segment creation,
which the caller sees as :class:`StoreFullError` while the log stays readable.
Flushing uses ``os.fdatasync`` (it releases the GIL, unlike ``mmap.flush``);
on Linux it writes back pages dirtied through a shared mapping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import threading
from pathlib import Path

from .errors import StoreFullError

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_ZERO_RANGE = 0x10


def _allocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of real blocks; ENOSPC becomes StoreFullError."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFullError("no space left on the data disk for a new segment") from e
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # filesystem without fallocate
            os.ftruncate(fd, size)
        else:
            raise


def zero_range(fd: int, mm: mmap.mmap, start: int, end: int) -> None:
    """Zero [start, end) of a segment (cut a torn tail), keeping its blocks allocated."""
    if end <= start:
        return
    r = _libc.fallocate(fd, _FALLOC_FL_ZERO_RANGE | _FALLOC_FL_KEEP_SIZE, ctypes.c_long(start), ctypes.c_long(end - start))
    if r != 0:
        chunk = b"\0" * (1 << 20)
        pos = start
        while pos < end:
            n = min(len(chunk), end - pos)
            mm[pos : pos + n] = chunk[:n]
            pos += n


class MappedFile:
    """One segment: a preallocated file mapped read-write."""

    __slots__ = ("path", "base", "size", "fd", "mm", "dirty")

    def __init__(self, path: Path, base: int, size: int, create: bool, keep_fd: bool = True) -> None:
        self.path = path
        self.base = base
        self.size = size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create:
                _allocate(self.fd, size)
            else:
                actual = os.fstat(self.fd).st_size
                if actual < size:  # a segment cut short by a crash during creation
                    _allocate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            if create:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            raise
        if not keep_fd:  # the mapping keeps the file: no descriptor per segment (see sync)
            os.close(self.fd)
            self.fd = -1
        self.dirty = False

    @property
    def end(self) -> int:
        return self.base + self.size

    def sync(self) -> None:
        """fdatasync; call from a flush thread, never the event loop."""
        self.dirty = False
        if self.fd >= 0:
            os.fdatasync(self.fd)
            return
        fd = os.open(self.path, os.O_RDWR)  # a segment mapped without a kept descriptor
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # a reader still holds a view; the mapping dies with it
            pass
        if self.fd >= 0:
            os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class MappedFileQueue:
    """Ordered segments of one log; maps a logical offset to (file, position)."""

    def __init__(self, directory: Path, file_size: int, keep_fd: bool = True) -> None:
        """``keep_fd=False``: segments hold no open descriptor (consume queues: one LMQ per
        subscription would otherwise hold one per subscription, and a process may hold
        only so many)."""
        self.dir = Path(directory)
        self.file_size = file_size
        self.keep_fd = keep_fd
        self.files: list[MappedFile] = []
        self.lock = threading.Lock()  # guards the list against retention vs. readers

    def load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        names = sorted(p for p in self.dir.iterdir() if p.name.isdigit() and len(p.name) == 20)
        for p in names:
            self.files.append(MappedFile(p, int(p.name), self.file_size, create=False, keep_fd=self.keep_fd))

    def create(self, base: int) -> MappedFile:
        self.dir.mkdir(parents=True, exist_ok=True)
        f = MappedFile(self.dir / f"{base:020d}", base, self.file_size, create=True, keep_fd=self.keep_fd)
        with self.lock:
            self.files.append(f)
        return f

    def adopt(self, f: MappedFile) -> None:
        """Append a segment made elsewhere (the commitlog's prepared next segment)."""
        with self.lock:
            self.files.append(f)

    def find(self, offset: int) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        first = files[0].base
        idx = (offset - first) // self.file_size
        if 0 <= idx < len(files):
            f = files[idx]
            if f.base <= offset < f.base + f.size:
                return f
        for f in files:  # segments with gaps after retention edge cases
            if f.base <= offset < f.base + f.size:
                return f
        return None

    @property
    def min_offset(self) -> int:
        return self.files[0].base if self.files else 0

    def drop_head(self, count: int) -> list[MappedFile]:
        with self.lock:
            gone, self.files = self.files[:count], self.files[count:]
        for f in gone:
            f.destroy()
        return gone

    def drop_from(self, offset: int) -> None:
        """Delete every segment starting at or after ``offset`` (recovery truncation)."""
        with self.lock:
            keep = [f for f in self.files if f.base < offset]
            gone = [f for f in self.files if f.base >= offset]
            self.files = keep
        for f in gone:
            f.destroy()

    def sync_dirty(self) -> None:
        for f in list(self.files):
            if f.dirty:
                f.sync()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    def destroy(self) -> None:
        for f in self.files:
            f.destroy()
        self.files = []
        try:
            self.dir.rmdir()
        except OSError:
            pass
