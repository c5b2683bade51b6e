"""Store configuration: every knob of the broker core in one dataclass.

The gateway's settings (``gateway/settings.py``) embed this dataclass, so the
TOML file and the CLI flags reach the store without the core importing any
layer above it. Defaults run out of the box; tests shrink the sizes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path


class FlushMode(str, enum.Enum):
    """When a put is acknowledged relative to fsync."""

    ASYNC = "async"  # acknowledged once in the page cache; flushed every flush_interval_ms
    SYNC = "sync"  # acknowledged only after fdatasync covers it (group commit)


@dataclass
class StoreConfig:
    data_dir: Path = Path("unimq-data")
    flush: FlushMode = FlushMode.ASYNC
    # CommitLog segments are preallocated with posix_fallocate so that a full disk is an
    # error at segment creation, never a SIGBUS while writing through the mapping.
    commitlog_segment_size: int = 1 << 30
    # ConsumeQueue files hold this many 20-byte entries each (RocketMQ's default is 300k).
    cq_entries_per_file: int = 300_000
    max_message_size: int = 4 * 1024 * 1024
    flush_interval_ms: int = 500
    # How often consume queues, indexes and the checkpoint reach disk (async and sync mode).
    checkpoint_interval_ms: int = 1000
    # IndexFile geometry (hash slots and entries per file).
    index_slots: int = 500_000
    index_entries_per_file: int = 2_000_000
    # Retention: segments whose newest message is older than this are deleted, oldest first.
    retention_hours: float = 72.0
    # ... and earlier, when free space on the data disk falls under this fraction.
    disk_min_free_ratio: float = 0.10
    # Puts are refused (StoreFullError) when free space falls under this fraction.
    disk_refuse_free_ratio: float = 0.02
    retention_check_interval_s: float = 10.0
    consumer_offset_persist_interval_s: float = 5.0

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.flush = FlushMode(self.flush)
        if self.commitlog_segment_size < 4096:
            raise ValueError("commitlog_segment_size must be at least 4096 bytes")
        if self.max_message_size > self.commitlog_segment_size // 2:
            self.max_message_size = self.commitlog_segment_size // 2

