"""The machine's own limits, measured in the bench data dir: the "peer" of every store row.

* Sequential write bandwidth: ``dd if=/dev/zero of=FILE bs=1M count=N conv=fdatasync``
  (dd's byte count and elapsed time are parsed; the fdatasync is inside dd's timing).
* fsync-per-write rate: a Python loop appending 100 B with ``os.write`` and making it
  durable with ``os.fdatasync`` after every write, one writer. This is "the plain
  fsync-per-message rate" the sync-flush floor is a multiple of.
* The same loop in 64 threads, each on its own file (information only: it shows how
  much the filesystem journal batches concurrent fsyncs by itself).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_DD_LINE = re.compile(r"^(\d+) bytes .* copied, ([0-9.,]+) s,", re.M)


@dataclass
class DiskBaseline:
    """Best of the repetitions; every repetition's figure is kept for the notes."""

    dd_bytes: int = 0
    dd_seconds: float = 0.0
    dd_tool: str = "dd"
    fsync_writes: int = 0
    fsync_seconds: float = 0.0
    fsync64_writes: int = 0
    fsync64_seconds: float = 0.0
    dd_runs: list[float] = field(default_factory=list)  # MB/s
    fsync_runs: list[float] = field(default_factory=list)  # writes/s

    @property
    def dd_mb_s(self) -> float:
        return self.dd_bytes / self.dd_seconds / 1e6 if self.dd_seconds else 0.0

    @property
    def fsync_rate(self) -> float:
        return self.fsync_writes / self.fsync_seconds if self.fsync_seconds else 0.0

    @property
    def fsync64_rate(self) -> float:
        return self.fsync64_writes / self.fsync64_seconds if self.fsync64_seconds else 0.0


def dd_write(directory: Path, mib: int) -> tuple[int, float, str]:
    """Run dd with fdatasync; return (bytes, seconds, tool). Falls back to Python if dd is missing."""
    path = directory / "dd.bin"
    try:
        dd = shutil.which("dd")
        if dd is not None:
            proc = subprocess.run(
                [dd, "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                capture_output=True,
                text=True,
                env={**os.environ, "LC_ALL": "C"},
                check=True,
            )
            m = _DD_LINE.search(proc.stderr)
            if m is None:
                raise RuntimeError(f"cannot parse dd output: {proc.stderr!r}")
            return int(m.group(1)), float(m.group(2).replace(",", ".")), "dd bs=1M conv=fdatasync"
        # No dd: the same thing in Python (1 MiB writes, one fdatasync at the end).
        chunk = bytes(1 << 20)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for _ in range(mib):
                os.write(fd, chunk)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return mib << 20, time.perf_counter() - t0, "python write(1 MiB)+fdatasync (dd not found)"
    finally:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        os.sync()  # commit the deletion (and an online discard) before anything else is timed


def _fsync_loop(path: Path, seconds: float, counts: list[int], slot: int, start: threading.Event | None) -> None:
    payload = b"x" * 100
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        if start is not None:
            start.wait()
        n = 0
        deadline = time.perf_counter() + seconds
        write, fdatasync, now = os.write, os.fdatasync, time.perf_counter
        while now() < deadline:
            write(fd, payload)
            fdatasync(fd)
            n += 1
        counts[slot] = n
    finally:
        os.close(fd)
        path.unlink()


def fsync_rate(directory: Path, seconds: float) -> tuple[int, float]:
    """write(100 B) + fdatasync per message, one writer, for ``seconds``."""
    counts = [0]
    t0 = time.perf_counter()
    _fsync_loop(directory / "fsync.bin", seconds, counts, 0, None)
    return counts[0], time.perf_counter() - t0


def fsync_rate_concurrent(directory: Path, seconds: float, writers: int = 64) -> tuple[int, float]:
    """The same loop in ``writers`` threads, each appending to its own file."""
    counts = [0] * writers
    start = threading.Event()
    threads = [
        threading.Thread(target=_fsync_loop, args=(directory / f"fsync-{i}.bin", seconds, counts, i, start))
        for i in range(writers)
    ]
    for t in threads:
        t.start()
    time.sleep(0.05)  # every thread has opened its file
    t0 = time.perf_counter()
    start.set()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - t0


def measure_dd(b: DiskBaseline, directory: Path, *, quick: bool) -> None:
    """dd bandwidth: best of 3 (1 with ``quick``)."""
    for _ in range(1 if quick else 3):
        nbytes, secs, b.dd_tool = dd_write(directory, 256 if quick else 1024)
        b.dd_runs.append(nbytes / secs / 1e6)
        if not b.dd_seconds or nbytes / secs > b.dd_bytes / b.dd_seconds:
            b.dd_bytes, b.dd_seconds = nbytes, secs


def measure_fsync(b: DiskBaseline, directory: Path, *, quick: bool) -> None:
    """The single-writer fsync rate: best of 3 (1 with ``quick``); 64 writers once."""
    for _ in range(1 if quick else 3):
        n, secs = fsync_rate(directory, 1.0 if quick else 1.5)
        b.fsync_runs.append(n / secs)
        if not b.fsync_seconds or n / secs > b.fsync_rate:
            b.fsync_writes, b.fsync_seconds = n, secs
    b.fsync64_writes, b.fsync64_seconds = fsync_rate_concurrent(directory, 1.0 if quick else 1.5)


def measure(directory: Path, *, quick: bool) -> DiskBaseline:
    """The whole peer: fsync rates first (on a calm disk), then dd."""
    b = DiskBaseline()
    measure_fsync(b, directory, quick=quick)
    measure_dd(b, directory, quick=quick)
    return b
