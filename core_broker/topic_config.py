"""Topic configuration: queues, permission and message type per topic, persisted.

Typed topics (FIFO, DELAY, TRANSACTION) are what RocketMQ 5 clients check
before sending, so the type lives with the topic, not the message.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import BadRequestError, TopicExistsError, TopicNotFoundError
from .json_file import read_json, write_json_atomic
from .model import MessageType
from .system_topics import LMQ_PREFIX

PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_RW = PERM_READ | PERM_WRITE
# The attributes a gateway acts on when it sends (batch topics are packed by the gateway,
# gateway/batch_send.py): a broker registers them with its routes so that a gateway of the
# separated deployment, which learns topics from the nameservers, packs as a merged one does.
ROUTE_ATTRIBUTES = ("batch", "batch.compression", "batch.linger_ms")


# slots: a broker holds one per LMQ it hosts (a fleet's device each: issue 21's memory), and a
# per-instance dict was ~100 bytes of each
@dataclass(slots=True)
class TopicConfig:
    name: str
    queues: int = 8
    message_type: MessageType = MessageType.NORMAL
    perm: int = PERM_RW
    system: bool = False
    attributes: dict[str, str] = field(default_factory=dict)
    # First queue id on this broker. In a separated deployment each broker of a topic
    # gets its own range, so a queue id names one queue across the cluster.
    queue_base: int = 0
    # A static topic's map of logic queues onto brokers' physical queues (logic_queue.QueueMapping
    # as JSON); None for every other topic. Every broker holding part of it keeps the whole map.
    mapping: dict | None = None

    @property
    def static(self) -> bool:
        return self.mapping is not None

    def __post_init__(self) -> None:
        self.message_type = MessageType(self.message_type)
        if not 1 <= self.queues <= 1024:
            raise BadRequestError(f"a topic has 1 to 1024 queues, not {self.queues}")
        if self.attributes.get("batch") == "true" and self.message_type != MessageType.NORMAL:
            raise BadRequestError(
                f"a batch topic (batch=true) is NORMAL, not {self.message_type.value}: a batch has one queue "
                "position for all its messages (no FIFO order by group, delay, transaction or compaction)")
        if self.attributes.get("batch") == "true" and self.attributes.get("static") == "true":
            raise BadRequestError("a topic is a batch topic (batch=true) or static (static=true), not both (yet)")

    def route_attributes(self) -> dict[str, str]:
        """The attributes a route carries (:data:`ROUTE_ATTRIBUTES` the topic has)."""
        a = self.attributes
        return {k: a[k] for k in ROUTE_ATTRIBUTES if k in a}

    @property
    def queue_ids(self) -> range:
        return range(self.queue_base, self.queue_base + self.queues)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    def to_json(self) -> dict:
        d = asdict(self)
        d["message_type"] = self.message_type.value
        return d


def validate_topic_name(name: str) -> None:
    if not name or len(name) > 255:
        raise BadRequestError("topic name must be 1 to 255 characters")
    if any(ord(c) < 32 for c in name):
        raise BadRequestError("topic name must not contain control characters")


def validate_attributes(attributes: dict) -> dict[str, str]:
    """Topic attributes as strings; a known one must hold what it means (``tier_retention_hours``:
    hours >= 0, 0 keeping a topic in the tier for ever; a compacted topic's
    ``min_cleanable_dirty_ratio`` in [0, 1] and ``delete_retention_ms`` >= 0)."""
    attrs = {str(k): str(v) for k, v in attributes.items()}
    if attrs.get("static", "false") not in ("true", "false"):
        raise BadRequestError(f"static must be true or false, not {attrs['static']!r}")
    for name, top in (("min_cleanable_dirty_ratio", 1.0), ("delete_retention_ms", math.inf)):
        v = attrs.get(name)
        try:
            ok = v is None or 0 <= float(v) <= top
        except ValueError:
            ok = False
        if not ok:
            raise BadRequestError(f"{name} must be a number from 0 to {top}, not {v!r}")
    hours = attrs.get("tier_retention_hours")
    if hours is not None:
        try:
            ok = math.isfinite(float(hours)) and float(hours) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise BadRequestError(f"tier_retention_hours must be a number of hours >= 0, not {hours!r}")
    if attrs.get("batch", "false") not in ("true", "false"):
        raise BadRequestError(f"batch is true or false, not {attrs['batch']!r}")
    if attrs.get("batch.compression", "none") not in ("none", "zstd", "lz4"):
        raise BadRequestError(f"batch.compression is none, zstd or lz4, not {attrs['batch.compression']!r}")
    linger = attrs.get("batch.linger_ms", "0")
    if not (linger.isdigit() and int(linger) <= 1000):
        raise BadRequestError(f"batch.linger_ms is a whole number of ms from 0 to 1000, not {linger!r}")
    return attrs


def merge_attributes(current: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    """A topic's attributes after an update: ``changes`` merged over ``current``, a ``None`` value
    removing that attribute, the result checked as at creation (:func:`validate_attributes`)."""
    merged = dict(current)
    if "batch" in changes and changes["batch"] != current.get("batch", "false" if changes["batch"] is not None else None):
        raise BadRequestError("batch is fixed when a topic is created (its queues are batch queues or not)")
    for k, v in changes.items():
        if v is None:
            merged.pop(str(k), None)
        else:
            merged[str(k)] = str(v)
    return validate_attributes(merged)


class TopicConfigManager:
    """All topics of one store; every change is written through to ``topics.json``.

    Light message queues (``%LMQ%`` names) are not in the table: every broker holds
    every LMQ implicitly (one queue, id 0), the part of it that multi-dispatch wrote
    there. Creating one costs a dict entry, no write, no fsync; :attr:`topics` and
    ``topics.json`` never list them (a fleet's million subscriptions would make the
    table, and each save of it, grow for ever).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.topics: dict[str, TopicConfig] = {}
        self._lmqs: dict[str, TopicConfig] = {}  # the config objects handed out for LMQs
        self._lock = threading.Lock()

    def load(self) -> None:
        dropped = False
        for d in read_json(self.path, {}).values():
            tc = TopicConfig(**d)
            if tc.name.startswith(LMQ_PREFIX):  # written by an older version: implicit now
                dropped = True
                continue
            self.topics[tc.name] = tc
        if dropped:
            self._save()

    def lmq(self, name: str) -> TopicConfig:
        """The config of LMQ ``name``, noted as hosted here (the same object until deleted)."""
        tc = self._lmqs.get(name)
        if tc is None:
            tc = self._lmqs[name] = TopicConfig(name, queues=1)
        return tc

    def hosted(self, name: str) -> TopicConfig | None:
        """LMQ ``name``'s config if it was created (hosted) here since the start."""
        return self._lmqs.get(name)

    def get(self, name: str) -> TopicConfig | None:
        """A topic's config; any LMQ has one (it exists on every broker)."""
        tc = self.topics.get(name)
        if tc is None and name.startswith(LMQ_PREFIX):
            return self._lmqs.get(name) or TopicConfig(name, queues=1)
        return tc

    def require(self, name: str) -> TopicConfig:
        tc = self.get(name)
        if tc is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return tc

    def create(self, tc: TopicConfig, exist_ok: bool = False) -> TopicConfig:
        validate_topic_name(tc.name)
        if tc.name.startswith(LMQ_PREFIX):
            return self.lmq(tc.name)  # never ``tc``: nothing new to journal
        with self._lock:
            old = self.topics.get(tc.name)
            if old is not None:
                if exist_ok and old.message_type == tc.message_type:
                    return old
                raise TopicExistsError(
                    f"topic {tc.name!r} exists with type {old.message_type.value}",
                    existing_type=old.message_type.value,
                )
            self.topics[tc.name] = tc
            self._save()
        return tc

    def update(self, tc: TopicConfig) -> TopicConfig:
        if tc.name.startswith(LMQ_PREFIX):
            self._lmqs[tc.name] = tc
            return tc
        with self._lock:
            self.require(tc.name)
            self.topics[tc.name] = tc
            self._save()
        return tc

    def delete(self, name: str) -> TopicConfig:
        if name.startswith(LMQ_PREFIX):
            return self._lmqs.pop(name, None) or TopicConfig(name, queues=1)
        with self._lock:
            tc = self.topics.pop(name, None)
            if tc is None:
                raise TopicNotFoundError(f"topic {name!r} does not exist")
            self._save()
        return tc

    def put(self, tc: TopicConfig) -> None:
        """Set a topic as a journal replay found it (create or replace, no checks)."""
        if tc.name.startswith(LMQ_PREFIX):
            return  # an older version's journal: LMQs are implicit now
        with self._lock:
            if self.topics.get(tc.name) != tc:
                self.topics[tc.name] = tc
                self._save()

    def discard(self, name: str) -> None:
        if name.startswith(LMQ_PREFIX):
            self._lmqs.pop(name, None)
            return
        with self._lock:
            if self.topics.pop(name, None) is not None:
                self._save()

    def _save(self) -> None:
        # Blocking write on purpose: topic changes are rare admin events, and a created
        # topic must be durable before the caller is told it exists.
        write_json_atomic(self.path, {n: t.to_json() for n, t in self.topics.items()})
