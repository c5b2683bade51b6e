"""One progress line per micro-batch of a streaming query: rows, rate, and lag behind unimq.

Why polling ``recentProgress`` instead of a ``StreamingQueryListener``: a Python
listener needs py4j's callback server and runs on its thread; polling from the
job's main thread works the same in every deployment and lets the job print
Spark's own progress bar and these lines without interleaving surprises.

Lag is what the source reported as the broker's latest offsets
(``reportLatestOffset``) minus the batch's end offsets, summed over queues:
the number of messages stored in unimq and not yet processed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, TextIO


def _doc(v: Any) -> dict:
    if v is None:
        return {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return {}
    return v if isinstance(v, dict) else {}


def as_dict(progress: Any) -> dict:
    """A StreamingQueryProgress (object, dict or JSON text) as a plain dict."""
    if isinstance(progress, dict):
        return progress
    j = getattr(progress, "json", None)
    if isinstance(j, str):
        return json.loads(j)
    return json.loads(str(progress))


def lag_of(progress: dict) -> int | None:
    """Messages in unimq past the batch's end offset (None when the source reported no latest)."""
    total = 0
    seen = False
    for src in progress.get("sources") or []:
        latest, end = _doc(src.get("latestOffset")), _doc(src.get("endOffset"))
        for t, qs in latest.items():
            if not isinstance(qs, dict):
                continue
            for q, hi in qs.items():
                e = end.get(t, {}).get(q, hi) if isinstance(end.get(t), dict) else hi
                try:
                    total += max(0, int(hi) - int(e))
                    seen = True
                except (TypeError, ValueError):
                    continue
    return total if seen else None


def format_progress(name: str, p: dict) -> str:
    rows = int(p.get("numInputRows") or 0)
    dur = (p.get("durationMs") or {}).get("triggerExecution")
    secs = f" in {dur / 1000:.1f}s" if dur else ""
    rate = p.get("processedRowsPerSecond")
    rate_s = f" ({rate:,.0f} rows/s)" if rate else ""
    lag = lag_of(p)
    lag_s = "?" if lag is None else f"{lag:,}"
    return f"[{name}] batch {p.get('batchId')}: {rows:,} rows{secs}{rate_s}, lag {lag_s} messages"


def follow(query: Any, name: str, out: TextIO = sys.stdout, poll_s: float = 1.0,
           on_progress: Callable[[dict], None] | None = None, timeout_s: float | None = None) -> None:
    """Print a line per finished micro-batch until the query ends (or ``timeout_s``); re-raise its error."""
    seen = -1
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def drain() -> None:
        nonlocal seen
        for raw in query.recentProgress:
            p = as_dict(raw)
            bid = p.get("batchId", -1)
            if bid > seen:
                seen = bid
                print(format_progress(name, p), file=out, flush=True)
                if on_progress is not None:
                    on_progress(p)

    try:
        while query.isActive:
            query.awaitTermination(poll_s)
            drain()
            if deadline is not None and time.monotonic() > deadline:
                print(f"[{name}] stopping after {timeout_s:.0f}s", file=out, flush=True)
                query.stop()
                break
    except KeyboardInterrupt:
        print(f"[{name}] interrupted: stopping the query (the checkpoint keeps its progress)", file=out, flush=True)
        query.stop()
    drain()
    err = query.exception()
    if err is not None:
        raise RuntimeError(f"[{name}] query failed: {err}")
