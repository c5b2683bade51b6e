"""Tier retention: a segment leaves the tier once every topic with messages in it has expired there.

Why apart from local retention: the tier exists so that data outlives the local
disk, so its horizon is its own: ``tier_retention_hours`` globally (0 keeps
everything), or per topic the topic attribute of the same name. Segments mix
topics, so a segment object may be deleted only when every topic with entries
in it has a positive tier retention and its newest message (the manifest's
``last_ts``) is older than the longest of them: one topic kept for ever keeps
every segment it has a message in, and the other topics' messages in those
segments stay readable with it. Segments expire in any order (a segment of
short-lived topics only may go before an older one a long-lived topic keeps);
readers skip the holes (``reader.get`` answers OFFSET_MOVED past one).
The manifest is deleted before the data objects, so a reader never finds a
manifest whose segment is gone; a crash in between leaves only unreferenced
objects, which the segment's re-upload (if still local) overwrites or nothing
reads (a known leak until a sweep of unreferenced objects exists).
"""

from __future__ import annotations

import logging
import math
from typing import Callable

from . import layout
from .object_store import ObjectStore
from .uploader import Uploader

log = logging.getLogger("unimq.tier")

ATTRIBUTE = "tier_retention_hours"  # the topic attribute that overrides the global setting


def topic_hours(attributes: dict[str, str] | None, default: float, local_hours: float) -> float:
    """A topic's tier retention in hours (0: for ever): its attribute when it holds a number
    >= 0, else ``default``; a positive value under local retention counts as ``local_hours``
    (the tier keeps at least what the local disk let go)."""
    raw = (attributes or {}).get(ATTRIBUTE)
    if raw is None:
        return default
    try:
        hours = float(raw)
    except (TypeError, ValueError):
        return default
    if not math.isfinite(hours) or hours < 0:
        return default
    return 0.0 if hours == 0 else max(hours, local_hours)


def expire(objects: ObjectStore, uploader: Uploader, store_id: str, now_ms: int, hours_of: Callable[[str], float]) -> int:
    """Delete the tier's segments every topic of which expired by ``now_ms`` (``hours_of(topic)``
    gives a topic's retention, 0 for ever; a segment without queue entries counts as topic "");
    return how many."""
    n = 0
    for m in uploader.manifests():
        hours = [hours_of(t) for t in {q[0] for q in m.queues} or {""}]
        if min(hours) <= 0 or m.last_ts + max(hours) * 3_600_000 > now_ms:
            continue
        base = m.base
        objects.delete([layout.manifest_key(store_id, base)])
        uploader.forget(base)
        objects.delete([layout.segment_key(store_id, base), layout.index_key(store_id, base),
                        layout.keys_key(store_id, base)])
        n += 1
    if n:
        log.info("tier retention removed %d segment(s)", n)
    return n
