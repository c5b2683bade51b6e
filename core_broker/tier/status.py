"""What the tier holds of a store, read from the bucket and the data directory alone.

Why offline: ``unimq tier status`` must answer whether the broker is running or
not (a broker that cannot start because its disk is full is exactly when an
operator asks), so this reads the manifests in the bucket and the names of the
local segment and consume-queue files, and nothing of a running process. A
segment counts as pending when it is sealed locally (a later segment exists) and
has no manifest; one tier retention removed and local retention not yet would
show as pending too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import StoreConfig
from ..consume_queue import ENTRY_SIZE, unsafe
from . import layout
from .object_store import ObjectStore


def _local_segments(data_dir: Path) -> list[tuple[int, int]]:
    d = data_dir / "commitlog"
    if not d.is_dir():
        return []
    names = sorted(p for p in d.iterdir() if p.name.isdigit() and len(p.name) == 20)
    return [(int(p.name), p.stat().st_size) for p in names]


def _local_queue_mins(data_dir: Path) -> dict[tuple[str, int], int]:
    """The first offset of each local queue's first file (entries below the log's start are
    skipped lazily by the store, so this may be a little older than what it serves)."""
    out: dict[tuple[str, int], int] = {}
    root = data_dir / "consumequeue"
    if not root.is_dir():
        return out
    for tdir in root.iterdir():
        for qdir in tdir.iterdir() if tdir.is_dir() else ():
            files = sorted(p.name for p in qdir.iterdir() if p.name.isdigit()) if qdir.name.isdigit() else []
            if files:
                out[(unsafe(tdir.name), int(qdir.name))] = int(files[0]) // ENTRY_SIZE
    return out


def tier_report(cfg: StoreConfig, objects: ObjectStore | None = None) -> dict[str, Any]:
    """Uploaded and pending segments, and the oldest readable offset of every queue."""
    data_dir = Path(cfg.data_dir)
    id_path = data_dir / "store_id"
    if not id_path.exists():
        raise FileNotFoundError(f"{data_dir} holds no store (no store_id file)")
    sid = id_path.read_text().strip()
    objects = objects or ObjectStore(cfg.tier_bucket, cfg.tier_prefix, cfg.tier_endpoint, cfg.tier_region)
    manifests = sorted(
        (layout.Manifest.decode(objects.get(n)) for n in objects.names(layout.manifest_dir(sid)) if layout.base_of(n) is not None),
        key=lambda m: m.base,
    )
    uploaded = {m.base for m in manifests}
    local = _local_segments(data_dir)
    pending = [(b, size) for b, size in local[:-1] if b not in uploaded]
    tier_min: dict[tuple[str, int], int] = {}
    for m in manifests:
        for t, q, first, *_ in m.queues:
            tier_min[(t, q)] = min(first, tier_min.get((t, q), first))
    local_min = _local_queue_mins(data_dir)
    queues = []
    for key in sorted(tier_min.keys() | local_min.keys()):
        tm, lm = tier_min.get(key), local_min.get(key)
        oldest = min(x for x in (tm, lm) if x is not None)
        queues.append({"topic": key[0], "queue": key[1], "oldest_readable": oldest, "oldest_in_tier": tm, "oldest_local": lm})
    return {
        "bucket": objects.bucket,
        "prefix": objects.prefix,
        "store_id": sid,
        "uploaded_segments": len(manifests),
        "uploaded_bytes": sum(m.size for m in manifests),
        "tier_first_offset": manifests[0].base if manifests else None,
        "tier_end_offset": manifests[-1].base + manifests[-1].length if manifests else None,
        "local_segments": len(local),
        "local_first_offset": local[0][0] if local else None,
        "pending_segments": len(pending),
        "pending_bytes": sum(size for _, size in pending),
        "queues": queues,
    }
