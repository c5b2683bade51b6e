"""What message traces cost: MQTT QoS 1 fan-in and AMQP persistent confirms with tracing off and
with every message traced (sample rate 1.0), measured side by side in one run.

    python -m bench --only trace

Issue 20 asks that tracing off cost nothing measurable and that the cost of tracing on be
stated. Off, every hook is one attribute read (``tracer.on``), so the "off" server here is
what the mqtt and amqp sections measure; on, each message gets its trace events (stored,
delivered, acked: three per message) buffered and written in batches to the trace topic by a
background task, in the same store the messages go to.

No load generators of its own: the scenarios of the mqtt and amqp sections
(``mqtt_bench.fan_in``, ``amqp_bench.measure``) against two ``unimq up``, one as it starts
(``trace_sample_rate = 0``, no topic traced) and one with ``trace_sample_rate = 1.0``.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import httpx

from . import Context, Row
from . import amqp_bench, mqtt_bench
from .procs import UnimqChild

NAME = "trace"
TITLE = "message traces: off vs every message traced (MQTT, AMQP)"

CONFIG = ("mqtt_ws_port = -1\n{trace}[store]\ncommitlog_segment_size = 67108864\n"
          "disk_min_free_ratio = 0.0\ndisk_refuse_free_ratio = 0.0\n")

TIMED = """\
What is timed in section trace (each row: the best of the windows of 2 s per server):

- Two `unimq up` side by side, one with tracing off (the default) and one with
  `trace_sample_rate = 1.0` (every message of every topic traced), and the loads alternate
  between them window by window (the order flipping each window), so that both see the same
  machine load; a pair with `--flush async` for MQTT, then a pair with `--flush sync` for AMQP.
- MQTT: section mqtt's QoS 1 fan-in (4 publishers, 100 B, 1 subscriber of `bench/#`), PUBACKed
  msgs/s; traced, each message has three events (stored by MQTT, delivered to the subscriber,
  acked by its PUBACK). AMQP: section amqp's persistent 1 KiB scenario with confirms and a
  consumer, published msgs/s; traced: stored, delivered, acked.
- "vs peer" divides the best windows; the notes give each pair of windows back to back too (on a
  busy machine their median says more than the best of either).
- Trace events written and dropped (a full buffer drops rather than slowing messages) are read
  from the traced server's /metrics after its windows.
"""


def _run_async(coro: object) -> object:
    try:
        import uvloop

        return uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)  # type: ignore[arg-type]


def _trace_counts(http_port: int) -> tuple[int, int]:
    """(events written, events dropped) from a server's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10).text
    out = []
    for name in ("written", "dropped"):
        m = re.search(rf"^unimq_trace_events_{name}_total\{{[^}}]*\}} (\d+)", text, re.M)
        out.append(int(m.group(1)) if m else 0)
    return out[0], out[1]


class _Pair:
    """Two fresh servers side by side: tracing off, and every message traced."""

    def __init__(self, base: Path, flush: str) -> None:
        self.servers: dict[bool, UnimqChild] = {}
        try:
            for on in (False, True):
                d = base / f"{flush}-{'on' if on else 'off'}"
                d.mkdir(parents=True, exist_ok=True)
                trace = "trace_sample_rate = 1.0\n" if on else ""
                self.servers[on] = UnimqChild(d, "mqtt", flush, config=CONFIG.format(trace=trace))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()


def measure(base: Path, windows: int, seconds: float) -> tuple[dict[tuple[str, bool], list[float]], dict[str, tuple[int, int]]]:
    got: dict[tuple[str, bool], list[float]] = {}
    counts: dict[str, tuple[int, int]] = {}
    orders = [(False, True), (True, False)]
    pair = _Pair(base, "async")
    try:
        for w in range(windows):
            for on in orders[w % 2]:
                srv = pair.servers[on]
                print(f"bench: trace: window {w + 1}, MQTT tracing {'on' if on else 'off'}...", file=sys.stderr)
                r = _run_async(mqtt_bench.fan_in(srv.ports["mqtt"], 1, seconds))
                got.setdefault(("mqtt", on), []).append(r.acked_s)  # type: ignore[attr-defined]
        time.sleep(0.5)  # the last batch of events written
        counts["mqtt"] = _trace_counts(pair.servers[True].ports["http"])
    finally:
        pair.stop()
    pair = _Pair(base, "sync")
    try:
        sc = amqp_bench.SCENARIOS[0]
        for w in range(windows):
            for on in orders[w % 2]:
                srv = pair.servers[on]
                print(f"bench: trace: window {w + 1}, AMQP tracing {'on' if on else 'off'}...", file=sys.stderr)
                got.setdefault(("amqp", on), []).append(
                    amqp_bench.measure(srv.ports["amqp"], sc, seconds, srv.pids, queue=f"bench-trace-{w}").publish_s)
        time.sleep(0.5)
        counts["amqp"] = _trace_counts(pair.servers[True].ports["http"])
    finally:
        pair.stop()
    return got, counts


ROWS: list[tuple[str, str, float]] = [
    ("mqtt", "MQTT QoS 1 fan-in (4 publishers -> 1 subscriber, 100 B): PUBACKed msgs/s", mqtt_bench.PAYLOAD),
    ("amqp", "AMQP persistent 1 KiB with confirms: published msgs/s (--flush sync)", amqp_bench.SCENARIOS[0].size),
]


def run(ctx: Context) -> list[Row]:
    seconds = 1.5 if ctx.quick else 2.0
    windows = 2 if ctx.quick else 4
    got, counts = measure(ctx.scratch("trace"), windows, seconds)
    best = {k: max(v) for k, v in got.items()}
    rows = []
    for key, title, size in ROWS:
        on, off = best.get((key, True), 0.0), best.get((key, False), 0.0)
        ratio = on / off if off else 0.0
        rows.append(Row(NAME, f"{title}, every message traced", on, on * size / 1e6,
                        peer=f"tracing off {off:,.0f} msgs/s", ratio=f"{ratio:.2f}x"))
        pairs = sorted(a / b for a, b in zip(got.get((key, True), []), got.get((key, False), [])) if b)
        median = pairs[len(pairs) // 2] if pairs else 0.0
        ctx.notes.append(f"trace: {key}: on/off per window pair (the two servers back to back) "
                         + " / ".join(f"{x:.2f}" for x in pairs) + f", median {median:.2f}x")
        written, dropped = counts.get(key, (0, 0))
        ctx.notes.append(f"trace: {key} windows, msgs/s: off " + " / ".join(f"{x:,.0f}" for x in got.get((key, False), []))
                         + "; on " + " / ".join(f"{x:,.0f}" for x in got.get((key, True), []))
                         + f"; trace events written {written:,}, dropped {dropped:,}")
    ctx.notes.append(f"trace: {windows} windows of {seconds:g} s per load and server, off and on alternating")
    return rows


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent) as d:
        for r in run(Context(Path(d), quick="--quick" in sys.argv)):
            print(r)


if __name__ == "__main__":
    main()
