"""Tier retention: segments whose newest message is older than ``tier_retention_hours`` leave the tier.

Why apart from local retention: the tier exists so that data outlives the local
disk, so its horizon is its own (0 keeps everything). Segments go oldest first,
stopping at the first one still wanted (store timestamps grow with the log).
The manifest is deleted before the data objects, so a reader never finds a
manifest whose segment is gone; a crash in between leaves only unreferenced
objects, which the segment's re-upload (if still local) overwrites or nothing
reads (a known leak until a sweep of unreferenced objects exists).
"""

from __future__ import annotations

import logging

from . import layout
from .object_store import ObjectStore
from .uploader import Uploader

log = logging.getLogger("unimq.tier")


def expire(objects: ObjectStore, uploader: Uploader, store_id: str, horizon_ms: int) -> int:
    """Delete the tier's segments whose newest record is older than ``horizon_ms``; return how many."""
    n = 0
    for m in uploader.manifests():
        if m.last_ts >= horizon_ms:
            break
        base = m.base
        objects.delete([layout.manifest_key(store_id, base)])
        uploader.forget(base)
        objects.delete([layout.segment_key(store_id, base), layout.index_key(store_id, base)])
        n += 1
    if n:
        log.info("tier retention removed %d segment(s)", n)
    return n
