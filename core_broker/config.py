"""Store configuration: every knob of the broker core in one dataclass.

The application's settings (``unimq/settings.py``) embed this dataclass, so the
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


class Warmup(str, enum.Enum):
    """Whether the flush thread zero-fills the commitlog ahead of the writer."""

    AUTO = "auto"  # in sync flush mode only (it shortens the fdatasyncs puts wait for)
    ON = "on"
    OFF = "off"


@dataclass
class StoreConfig:
    data_dir: Path = Path("unimq-data")
    flush: FlushMode = FlushMode.ASYNC
    # CommitLog segments are preallocated with posix_fallocate so that a full disk is an
    # error at segment creation, never a SIGBUS while writing through the mapping.
    commitlog_segment_size: int = 1 << 30
    # ConsumeQueue files hold this many 20-byte entries each (RocketMQ's default is 300k).
    cq_entries_per_file: int = 300_000
    # The largest message body the store holds (at most half a segment). Doors set their own,
    # lower limits: 4 MiB unless a door says otherwise (AMQP: amqp_max_message_size, 128 MiB).
    max_message_size: int = 256 * 1024 * 1024
    # Write real zeros a little ahead of the writer so that group-commit fdatasyncs flush
    # data only, not ext4's unwritten-extent conversions (see commitlog.py). Doubles the
    # bytes written to disk; worth it only where puts wait for fdatasync.
    commitlog_warmup: Warmup = Warmup.AUTO
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
    # Tiered storage (core_broker/tier/): sealed segments are uploaded to an S3-compatible
    # object store, and local retention deletes a segment only once its upload is confirmed.
    # Credentials come from boto3's usual chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
    # AWS_PROFILE, ~/.aws/credentials, instance roles).
    tier_enabled: bool = False
    tier_endpoint: str = ""  # e.g. "http://127.0.0.1:9000"; empty: AWS S3 for tier_region
    tier_bucket: str = ""  # must exist; required when the tier is on
    tier_prefix: str = "unimq"  # key prefix inside the bucket (objects go under <prefix>/<store id>/)
    tier_region: str = ""  # empty: boto3's default (AWS_REGION / ~/.aws/config)
    # Tier retention: segments whose newest message is older than this leave the tier; 0 keeps them.
    tier_retention_hours: float = 0.0
    tier_scan_interval_s: float = 5.0  # how often the upload worker looks for newly sealed segments
    tier_retry_max_s: float = 60.0  # longest back-off between two failed upload attempts
    tier_expiry_interval_s: float = 600.0  # how often tier retention runs (when no upload waits)
    # The upload process runs this much nicer than the broker (and SCHED_BATCH when > 0): uploads are background
    # work and must not take the core from the put path; 0: the broker's own priority.
    tier_upload_nice: int = 10
    # Cold reads (offsets no longer on local disk) run on this many threads of their own, read
    # the tier in blocks of tier_read_block_bytes and keep at most tier_read_cache_bytes of them;
    # a sequential reader has tier_read_ahead_bytes past its position fetched in the background.
    tier_read_threads: int = 2
    tier_read_block_bytes: int = 4 << 20
    tier_read_cache_bytes: int = 64 << 20
    tier_read_ahead_bytes: int = 16 << 20
    # Compacted topics (core_broker/compaction.py): how often the cleaner looks for a queue whose
    # dirty share passed the ratio, the topics' defaults for the ratio and for how long a delete
    # marker is kept, the most keys one pass maps (memory: ~100 bytes each), and a cap on the bytes
    # a pass reads per second (0: none).
    compaction_check_interval_s: float = 10.0
    compaction_min_cleanable_dirty_ratio: float = 0.5
    compaction_delete_retention_ms: int = 24 * 3600 * 1000
    compaction_map_entries: int = 1_000_000
    compaction_max_bytes_per_s: int = 0

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not 0 <= self.compaction_min_cleanable_dirty_ratio <= 1 or self.compaction_map_entries < 1:
            raise ValueError("compaction_min_cleanable_dirty_ratio must be in [0, 1], compaction_map_entries >= 1")
        self.flush = FlushMode(self.flush)
        self.commitlog_warmup = Warmup(self.commitlog_warmup)
        if self.commitlog_segment_size < 4096:
            raise ValueError("commitlog_segment_size must be at least 4096 bytes")
        if self.max_message_size > self.commitlog_segment_size // 2:
            self.max_message_size = self.commitlog_segment_size // 2
        if self.tier_enabled and not self.tier_bucket:
            raise ValueError("tier_enabled needs tier_bucket (an existing bucket of the object store)")
        if (self.tier_read_threads < 1 or self.tier_read_block_bytes < 4096 or self.tier_read_cache_bytes < 0
                or self.tier_read_ahead_bytes < 0):
            raise ValueError("tier_read_threads must be at least 1 and tier_read_block_bytes at least 4096")
        if not 0 <= self.tier_upload_nice <= 19:
            raise ValueError("tier_upload_nice must be in [0, 19]")
        if self.tier_retention_hours < 0 or 0 < self.tier_retention_hours < self.retention_hours:
            raise ValueError(
                "tier_retention_hours must be 0 (keep for ever) or at least retention_hours "
                f"({self.retention_hours}): the tier keeps what the local disk let go"
            )

    @property
    def warmup_enabled(self) -> bool:
        if self.commitlog_warmup == Warmup.AUTO:
            return self.flush == FlushMode.SYNC
        return self.commitlog_warmup == Warmup.ON



# RocketMQ's classic delay levels, used as the back-off between pop retries.
DEFAULT_RETRY_BACKOFF_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000,
    360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)


@dataclass
class BrokerConfig:
    """Broker-side consumption semantics: pop/retry/DLQ, timers, transactions."""

    broker_name: str = "broker-a"
    # Deliveries before a message goes to the group's dead-letter topic.
    max_delivery_attempts: int = 16
    # Extra delay before a message whose invisible time ran out is offered again
    # (index = attempts so far - 1; the last value repeats).
    retry_backoff_ms: tuple[int, ...] = DEFAULT_RETRY_BACKOFF_MS
    # Longest sleep of the revive task while messages are in flight. It wakes when the
    # earliest invisible time ends anyway (and sleeps until a pop when none is in
    # flight): this only bounds how late a wall-clock step can make a redelivery.
    revive_interval_ms: int = 1000
    # A half (prepared) transaction message older than this is checked with its producer...
    transaction_check_immunity_ms: int = 6_000
    transaction_check_interval_ms: int = 5_000
    # ... at most this many times, then rolled back.
    transaction_check_max: int = 15
    # Broker state (pop cursors, in-flight, timers, transactions) snapshot period.
    state_snapshot_interval_s: float = 5.0
    # Longest long-poll a pop may ask for.
    max_long_poll_ms: int = 30_000
    # How long a deleted door-state entry (an ended MQTT session, a deleted AMQP queue)
    # keeps its versioned tombstone. It must outlast the longest time a broker can be
    # down and come back: a broker that missed the delete still holds the entry, and
    # without the newer tombstone elsewhere a read would bring it back.
    kv_tombstone_ttl_s: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        self.retry_backoff_ms = tuple(int(x) for x in self.retry_backoff_ms) or (0,)
        if self.max_delivery_attempts < 1:
            raise ValueError("max_delivery_attempts must be at least 1")
