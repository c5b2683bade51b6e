"""unimq benchmarks: one command, one table, measured beside the machine's own limits.

Run ``python -m bench`` (or ``make bench``) from the repository root; see
``python -m bench --help`` and ``bench/RESULTS.md``. Every run first measures
the "peer" (the raw disk: dd bandwidth and the fsync-per-write rate) in the
same data directory, then the selected sections, so every ratio in the table
compares figures taken minutes apart on the same machine and filesystem.

A section is a module with ``NAME``, ``TITLE`` and ``run(ctx) -> list[Row]``,
listed in :data:`bench.__main__.SECTIONS`; later issues add theirs there
(``--only store,mqtt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .disk_baseline import DiskBaseline


@dataclass
class Row:
    """One line of the table. ``msgs_s``/``mb_s`` may be None where they mean nothing."""

    section: str
    name: str
    msgs_s: float | None = None
    mb_s: float | None = None
    peer: str = "—"  # the peer figure this row is compared with, e.g. "dd 458 MB/s"
    ratio: str = "—"  # e.g. "52%" or "11.3x"
    floor: str = "—"  # the floor, e.g. ">= 200,000 msgs/s"
    meets: bool | None = None  # None: no floor for this row
    note: str = ""  # shown under the table as a footnote when non-empty


@dataclass
class Context:
    data_dir: Path  # a fresh directory for this run, removed afterwards
    quick: bool
    peer: "DiskBaseline | None" = None
    notes: list[str] = field(default_factory=list)  # run-level remarks printed under the table

    def scratch(self, name: str) -> Path:
        """A fresh sub-directory of the run's data dir."""
        p = self.data_dir / name
        p.mkdir(parents=True, exist_ok=False)
        return p

    # The disk peer is measured in two parts, each once, when a section first needs it
    # (and at the end of the run otherwise), so that a section can take its fsync-bound
    # figures next to the fsync peer, before anything writes gigabytes: the disk's
    # fsync latency stays high for seconds after dd or a bulk write.

    def fsync_peer(self) -> "DiskBaseline":
        return self._peer_part("fsync")

    def dd_peer(self) -> "DiskBaseline":
        return self._peer_part("dd")

    def _peer_part(self, part: str) -> "DiskBaseline":
        """The disk peer with ``part`` ("fsync" or "dd") measured, measuring it now if not yet."""
        from . import disk_baseline

        if self.peer is None:
            self.peer = disk_baseline.DiskBaseline()
        peer = self.peer
        runs, measure = {
            "fsync": (peer.fsync_runs, disk_baseline.measure_fsync),
            "dd": (peer.dd_runs, disk_baseline.measure_dd),
        }[part]
        if not runs:
            measure(peer, self.scratch(f"disk-{part}"), quick=self.quick)
        return peer


def fmt_int(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def fmt_mb(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"
