"""Consumer groups as numbers: each group's backlog per topic (``/metrics``' lag) and each of
its queues with offsets and in-flight counts (the admin API's groups).

Why apart from the broker controller: both are reads over the pop service's cursors and the
offset store that nothing in the broker's semantics needs; kept beside each other because they
must agree on which queues count (pop groups by their cursors, retry topics included; pull
groups by their committed offsets; LMQs and other system queues left out, dead letters in).
"""

from __future__ import annotations

from .message_store import MessageStore
from .pop_service import PopService
from .system_topics import DLQ_PREFIX, RETRY_PREFIX, is_system_topic

__all__ = ["consumer_lag", "group_queues"]


def consumer_lag(pops: PopService, store: MessageStore) -> list[tuple[str, str, int]]:
    """(group, topic, backlog): pop groups by their cursors (retry topics folded into
    their topic), pull groups by their committed offsets."""
    lag: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str, int]] = set()
    for (g, t, q), c in list(pops.cursors.items()):
        seen.add((g, t, q))
        if t.startswith(RETRY_PREFIX):
            origin = t[len(RETRY_PREFIX) + len(g) + 1 :]
        elif is_system_topic(t) and not t.startswith(DLQ_PREFIX):
            continue
        else:
            origin = t
        n = max(store.max_offset(t, q) - c.floor(), 0)
        lag[(g, origin)] = lag.get((g, origin), 0) + n
    for g in store.offsets.groups():
        for (t, q), off in store.offsets.of_group(g).items():
            if (g, t, q) in seen or (is_system_topic(t) and not t.startswith(DLQ_PREFIX)):
                continue
            n = max(store.max_offset(t, q) - off, 0)
            lag[(g, t)] = lag.get((g, t), 0) + n
    return [(g, t, n) for (g, t), n in sorted(lag.items())]


def group_queues(pops: PopService, store: MessageStore, broker: str) -> list[tuple[str, str, int, str, int, int, int]]:
    """(group, topic, queue, broker, consumer offset, max offset, in flight) for every queue a
    pop group holds a cursor on (retry topics included) and every pull group's committed queue."""
    rows, seen = [], set()
    for (g, t, q), c in list(pops.cursors.items()):
        seen.add((g, t, q))
        if not is_system_topic(t) or t.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            rows.append((g, t, q, broker, c.floor(), store.max_offset(t, q), len(c.inflight)))
    for g in store.offsets.groups():
        for (t, q), off in store.offsets.of_group(g).items():
            if (g, t, q) not in seen and (not is_system_topic(t) or t.startswith(DLQ_PREFIX)):
                rows.append((g, t, q, broker, off, store.max_offset(t, q), 0))
    return sorted(rows)
