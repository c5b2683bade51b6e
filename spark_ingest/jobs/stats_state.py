"""The stats job's running aggregates: merged from each micro-batch's partials, closed by the
watermark, and kept as entries of a state topic (:mod:`spark_ingest.state_topic`).

Why the job merges on the driver instead of letting Spark keep the state: Spark's state
store lives in the checkpoint directory, which a restart may not have. Here each
micro-batch is aggregated by Spark without state (per window, topic, protocol and queue)
and the few resulting rows are merged into these entries, which are committed to the
state topic together with the source offsets they count. A replayed micro-batch (Spark
re-runs the one a crash interrupted) drops the rows below those offsets, so each message
is counted exactly once whatever the checkpoint holds.

An entry (key ``w|<topic>|<protocol>|<window start, unix us>``) holds ``count``,
``bytes`` and per field ``[min, sum, n, max]`` (the average is ``sum / n``: averages
cannot be merged, sums can). The watermark is the largest store time seen minus the
``--watermark`` delay; a window that ends at or before it is closed: its entry is deleted
and later messages of it are not counted (Spark's rule for windows in update mode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..state_topic import Snapshot

UNITS_US = {"microsecond": 1, "millisecond": 1000, "second": 1_000_000, "minute": 60_000_000,
            "hour": 3_600_000_000, "day": 86_400_000_000, "week": 604_800_000_000}


def col_name(field: str) -> str:
    """A field's (dotted path's) name as a column name."""
    return re.sub(r"[^0-9A-Za-z_]", "_", field)


def duration_us(text: str) -> int:
    """A Spark duration such as ``"10 minutes"`` or ``"1 hour 30 minutes"`` in microseconds."""
    parts = re.findall(r"(\d+)\s*([a-z]+?)s?\b", text.strip().lower())
    if not parts or re.sub(r"(\d+)\s*([a-z]+)", "", text.strip().lower()).strip():
        raise ValueError(f"not a duration: {text!r} (e.g. '10 minutes')")
    total = 0
    for n, unit in parts:
        if unit not in UNITS_US:
            raise ValueError(f"unknown unit {unit!r} in duration {text!r}")
        total += int(n) * UNITS_US[unit]
    return total


class OffsetGapError(RuntimeError):
    """A micro-batch starts past the offsets the state counted: messages would be missed."""


@dataclass
class RunningStats:
    """What the job needs to continue: entries, counted offsets, the largest store time seen."""

    window: str
    watermark: str
    fields: list[str]
    entries: dict[str, dict] = field(default_factory=dict)
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> queue -> next to count
    max_event_us: int | None = None

    @classmethod
    def restored(cls, snap: Snapshot, window: str, watermark: str, fields: Sequence[str]) -> "RunningStats":
        """From a committed state; a fresh one when there is none. The window must match the state's."""
        job = snap.progress.get("job")
        if not job:
            return cls(window, watermark, list(fields))
        if duration_us(job["window"]) != duration_us(window):
            raise ValueError(f"the state was computed with --window {job['window']!r}, not {window!r}: "
                             "use --reset-state to start again, or another --state-topic")
        return cls(window, watermark, list(job["fields"]), {k: dict(v) for k, v in snap.entries.items() if isinstance(v, dict)},
                   {t: dict(qs) for t, qs in snap.progress.get("offsets", {}).items()}, snap.progress.get("max_event_us"))

    def progress(self) -> dict:
        return {"job": {"window": self.window, "fields": self.fields}, "offsets": self.offsets,
                "max_event_us": self.max_event_us}

    def watermark_us(self) -> int | None:
        return None if self.max_event_us is None else self.max_event_us - duration_us(self.watermark)

    def apply(self, partials: Sequence[Mapping[str, Any]], check_gaps: bool = True) -> tuple[dict[str, dict], list[str]]:
        """Merge one micro-batch's partial rows (already without rows below :attr:`offsets`).

        A partial row: ``start_us``, ``end_us``, ``topic``, ``protocol``, ``queue_id``, ``lo``/``hi``
        (its queue offsets), ``max_ts_us``, ``count``, ``bytes``, and per field ``<col_name(f)>__min``,
        ``__sum``, ``__n``, ``__max``. Returns (the updated entries by key, the keys closed)."""
        wm = self.watermark_us()
        firsts: dict[tuple[str, str], int] = {}
        for p in partials:
            tq = (p["topic"], str(p["queue_id"]))
            firsts[tq] = min(firsts.get(tq, p["lo"]), p["lo"])
        for (t, q), lo in firsts.items():
            counted = self.offsets.get(t, {}).get(q)
            if check_gaps and counted is not None and lo > counted:
                raise OffsetGapError(f"topic {t!r} queue {q}: the batch starts at offset {lo}, the state counted up "
                                     f"to {counted}: a checkpoint ahead of the state topic? (--reset-state)")
        updated: dict[str, dict] = {}
        for p in partials:
            qs = self.offsets.setdefault(p["topic"], {})
            q = str(p["queue_id"])
            qs[q] = max(qs.get(q, 0), int(p["hi"]) + 1)
            if p["max_ts_us"] is not None:
                self.max_event_us = max(self.max_event_us or p["max_ts_us"], p["max_ts_us"])
            if wm is not None and p["end_us"] <= wm:
                continue  # its window closed before this batch: late, not counted
            key = f"w|{p['topic']}|{p['protocol']}|{p['start_us']}"
            e = self.entries.get(key)
            if e is None:
                e = {"topic": p["topic"], "protocol": p["protocol"], "start_us": p["start_us"], "end_us": p["end_us"],
                     "count": 0, "bytes": 0, "fields": {}}
            else:
                e = {**e, "fields": dict(e["fields"])}
            e["count"] += int(p["count"])
            e["bytes"] += int(p["bytes"] or 0)
            for f in self.fields:
                c = col_name(f)
                n = int(p[f"{c}__n"] or 0)
                if not n:
                    continue
                old = e["fields"].get(f)
                mn, sm, mx = float(p[f"{c}__min"]), float(p[f"{c}__sum"]), float(p[f"{c}__max"])
                e["fields"][f] = [mn, sm, n, mx] if old is None else \
                    [min(old[0], mn), old[1] + sm, old[2] + n, max(old[3], mx)]
            self.entries[key] = updated[key] = e
        closed = []
        wm = self.watermark_us()
        if wm is not None:
            closed = sorted(k for k, e in self.entries.items() if e["end_us"] <= wm)
            for k in closed:
                del self.entries[k]
        return updated, closed
