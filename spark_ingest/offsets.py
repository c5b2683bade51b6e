"""Offsets of the `unimq` source: JSON per topic and queue, planning and rate limiting.

Pure functions over plain dicts, so they are unit-tested without Spark. An
offset document is ``{"<topic>": {"<queue id>": <next offset>}}`` -- the shape
Spark's Kafka source uses for partitions (string keys, integer values, which
is what Spark's checkpoint stores as JSON). Queue ids are per topic in unimq
and a topic's queues live on one broker, so no broker name is needed.
In a JSON ``startingOffsets``/``endingOffsets``, -2 means earliest and -1
latest, as with Kafka.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping

Offsets = dict[str, dict[str, int]]
Bounds = dict[str, dict[str, tuple[int, int]]]  # topic -> queue -> (min, max); max = next to be written


class DataLossError(RuntimeError):
    """Messages the query should read are gone (retention, a deleted or recreated topic)."""


@dataclass(frozen=True)
class QueueRange:
    topic: str
    queue_id: int
    start: int  # inclusive
    end: int  # exclusive


def parse_offsets(text: str, where: str) -> Offsets:
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"{where} must be earliest, latest or a JSON offsets document, got {text!r}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise ValueError(f'{where} JSON must look like {{"topic": {{"0": 12, "1": 40}}}}, got {text!r}')
    out: Offsets = {}
    for t, qs in doc.items():
        out[t] = {}
        for q, o in qs.items():
            if isinstance(o, bool) or not isinstance(o, int) or o < -2 or not str(q).isdigit():
                raise ValueError(f"{where}: topic {t!r} queue {q!r}: offset must be an integer >= -2, got {o!r}")
            out[t][str(int(q))] = o
    return out


def dumps(offsets: Offsets) -> str:
    """Canonical JSON (sorted, queues numerically): equal offsets give equal text."""
    return json.dumps({t: {q: offsets[t][q] for q in sorted(offsets[t], key=int)} for t in sorted(offsets)},
                      separators=(",", ":"))


def select_topics(all_topics: list[str], topics: tuple[str, ...], pattern: str | None) -> list[str]:
    if topics:
        return list(topics)
    rx = re.compile(pattern or "")
    return sorted(t for t in all_topics if rx.fullmatch(t) and not t.startswith("%"))


def to_bounds(raw: Mapping[str, Mapping[int, tuple[int, int]] | None]) -> Bounds:
    return {t: {str(q): (int(b[0]), int(b[1])) for q, b in (qs or {}).items()} for t, qs in raw.items()}


def earliest(bounds: Bounds) -> Offsets:
    return {t: {q: lo for q, (lo, _) in qs.items()} for t, qs in bounds.items()}


def latest(bounds: Bounds) -> Offsets:
    return {t: {q: hi for q, (_, hi) in qs.items()} for t, qs in bounds.items()}


def resolve(spec: str, bounds: Bounds, where: str, default_latest: bool) -> Offsets:
    """earliest / latest / JSON for every queue in ``bounds``.

    A queue missing from the JSON gets earliest (start) or latest (end,
    ``default_latest``); -2 / -1 stand for earliest / latest.
    """
    s = spec.strip().lower()
    if s == "earliest":
        return earliest(bounds)
    if s == "latest":
        return latest(bounds)
    given = parse_offsets(spec, where)
    unknown = sorted(set(given) - set(bounds))
    if unknown:
        raise ValueError(f"{where} names topics that are not read: {', '.join(unknown)}")
    out: Offsets = {}
    for t, qs in bounds.items():
        out[t] = {}
        for q, (lo, hi) in qs.items():
            v = given.get(t, {}).get(q)
            if v is None:
                v = hi if default_latest else lo
            elif v == -2:
                v = lo
            elif v == -1:
                v = hi
            out[t][q] = v
    return out


def merge_new_queues(start: Offsets, bounds: Bounds) -> Offsets:
    """A topic or queue that appeared since ``start`` starts at its earliest offset."""
    out = {t: dict(qs) for t, qs in start.items()}
    for t, qs in bounds.items():
        cur = out.setdefault(t, {})
        for q, (lo, _) in qs.items():
            cur.setdefault(q, lo)
    return out


def check_data_loss(start: Offsets, bounds: Bounds, fail: bool) -> Offsets:
    """Validate start offsets against what the broker retains.

    Below the queue's minimum (retention deleted messages), above its maximum
    (the topic was deleted and recreated) or a queue that vanished: raise
    :class:`DataLossError`, or with ``fail=False`` move to the earliest
    retained offset (a vanished queue keeps its offset and yields nothing).
    """
    out: Offsets = {}
    for t, qs in start.items():
        out[t] = {}
        for q, off in qs.items():
            b = bounds.get(t, {}).get(q)
            if b is None:
                if fail:
                    raise DataLossError(
                        f"topic {t!r} queue {q} is gone (topic deleted?) with messages from offset {off} "
                        "possibly unread. Set failOnDataLoss=false to ignore."
                    )
                out[t][q] = off
                continue
            lo, hi = b
            if off < lo or off > hi:
                if fail:
                    why = (f"offset {off} is no longer retained (the earliest is {lo}): retention deleted messages"
                           if off < lo else
                           f"offset {off} is past the queue's end {hi}: the topic was deleted and recreated")
                    raise DataLossError(
                        f"topic {t!r} queue {q}: {why}. Set failOnDataLoss=false to continue from offset {lo}."
                    )
                off = lo
            out[t][q] = off
    return out


def cap(start: Offsets, latest_: Offsets, max_rows: int | None) -> Offsets:
    """End offsets of the next batch: all of ``latest_``, or ``max_rows`` split by backlog.

    The budget is shared in proportion to each queue's backlog, the remainder
    going to the largest fractional parts, so a batch holds exactly
    ``min(max_rows, total backlog)`` messages and no queue is read past its end.
    """
    keys = [(t, q) for t in latest_ for q in latest_[t]]
    backlog = {k: max(0, latest_[k[0]][k[1]] - start.get(k[0], {}).get(k[1], latest_[k[0]][k[1]])) for k in keys}
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        take = backlog
    else:
        exact = {k: max_rows * b / total for k, b in backlog.items()}
        take = {k: int(v) for k, v in exact.items()}
        rest = max_rows - sum(take.values())
        for k in sorted(keys, key=lambda k: (exact[k] - take[k], backlog[k]), reverse=True)[:rest]:
            take[k] += 1
    end: Offsets = {}
    for t, q in keys:
        s = start.get(t, {}).get(q, latest_[t][q])
        end.setdefault(t, {})[q] = s + min(take[(t, q)], backlog[(t, q)])
    return end


def clamp(end: Offsets, target: Offsets | None, start: Offsets) -> Offsets:
    """Never go past the availableNow target; a queue the target lacks (new) stays at its start."""
    if target is None:
        return end
    out: Offsets = {}
    for t, qs in end.items():
        out[t] = {}
        for q, o in qs.items():
            s = start.get(t, {}).get(q, o)
            out[t][q] = max(s, min(o, target.get(t, {}).get(q, s)))
    return out


def plan(start: Offsets, end: Offsets, max_per_partition: int) -> list[QueueRange]:
    """One range per queue with data, split into pieces of at most ``max_per_partition``."""
    out: list[QueueRange] = []
    for t in sorted(end):
        for q in sorted(end[t], key=int):
            s, e = start.get(t, {}).get(q, end[t][q]), end[t][q]
            while s < e:
                nxt = min(e, s + max_per_partition)
                out.append(QueueRange(t, int(q), s, nxt))
                s = nxt
    return out


def pack(ranges: list[QueueRange], max_groups: int | None) -> list[tuple[QueueRange, ...]]:
    """The ranges as at most ``max_groups`` tasks, each a few ranges read one after the other.

    Why: every task of a Python data source pays a fixed price (a worker hand-off, ~0.075 s of
    Spark's machinery), and more tasks than task slots run in waves with a gap between them,
    where a file source packs its splits to the slots. Greedy by size (largest range to the
    lightest task) so the tasks end together; deterministic, so a replayed micro-batch plans
    the same tasks. ``max_groups`` None or >= the number of ranges: one range per task."""
    if max_groups is None or len(ranges) <= max_groups:
        return [(r,) for r in ranges]
    groups: list[list[QueueRange]] = [[] for _ in range(max_groups)]
    load = [0] * max_groups
    for r in sorted(ranges, key=lambda r: r.end - r.start, reverse=True):
        i = min(range(max_groups), key=lambda g: (load[g], g))
        groups[i].append(r)
        load[i] += r.end - r.start
    order = {r: i for i, r in enumerate(ranges)}
    return [tuple(sorted(g, key=order.__getitem__)) for g in groups if g]


def total(start: Offsets, end: Offsets) -> int:
    return sum(max(0, o - start.get(t, {}).get(q, o)) for t, qs in end.items() for q, o in qs.items())
