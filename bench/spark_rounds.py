"""Timed Spark reads for the bench's Spark rows: one rule for every side of a comparison.

Why a module of its own: the rounds of a Spark read swing 2x within one run (the JVM's JIT keeps
compiling through the first full reads: 5-15 s of compiler time in the first round, still 2-5 s in
the third), so a side that always runs first, or in the first rounds, pays the warm-up for both.
Every side here gets the same treatment:

- ``warmup`` untimed full reads per side (``noop`` writes, as timed), alternating sides;
- a full GC in the JVM before every timed read, so no read pays for the previous one's garbage;
- rounds alternate the order of the sides (A B, B A, ...), so neither always runs first;
- the reported rate of every side is rows / the median of its own rounds' wall clock, and the
  per-round ratios are kept for the note;
- CPU seconds per process group for every read (the JVM, its Python workers, the unimq server),
  read from ``/proc``: on a shared 2-core machine this is the figure that survives the load.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (not ``pid`` itself)."""
    todo, seen = _children(pid), []
    while todo:
        c = todo.pop()
        seen.append(c)
        todo += _children(c)
    return seen


def cpu_seconds(pid: int, reaped: bool = True) -> float:
    """User + system CPU of ``pid``; with ``reaped`` also of its children that exited and were waited for."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICK


@dataclass
class Groups:
    """Process groups whose CPU is counted per read: name -> a function giving their CPU seconds now."""

    probes: dict[str, Callable[[], float]] = field(default_factory=dict)

    def now(self) -> dict[str, float]:
        return {k: f() for k, f in self.probes.items()}


def spark_groups(spark: Any, server_pid: int | None) -> Groups:
    """The JVM (its own threads), Spark's Python workers (every process under the JVM), the unimq server."""
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    g = Groups({
        "JVM": lambda: cpu_seconds(jvm, reaped=False),
        "Python workers": lambda: sum(cpu_seconds(p) for p in descendants(jvm)),
    })
    if server_pid is not None:
        g.probes["unimq server"] = lambda: cpu_seconds(server_pid)
    return g


@dataclass
class Rounds:
    """Wall clock and CPU per process group of every timed read, per side."""

    rows: int
    times: dict[str, list[float]]
    cpu: dict[str, list[dict[str, float]]]

    def rate(self, side: str) -> float:
        """Rows per second at the median wall clock of ``side``'s rounds (the same rule for every side)."""
        return self.rows / statistics.median(self.times[side])

    def runs(self, side: str) -> str:
        return " / ".join(f"{self.rows / t:,.0f}" for t in self.times[side])

    def round_ratios(self, side: str, peer: str) -> str:
        return " / ".join(f"{p / s:.2f}x" for s, p in zip(self.times[side], self.times[peer]))

    def cpu_note(self, side: str) -> str:
        """Median CPU seconds per process group over ``side``'s rounds, for the whole read."""
        groups = self.cpu[side][0].keys()
        parts = [f"{g} {statistics.median(r[g] for r in self.cpu[side]):.2f}" for g in groups]
        return ", ".join(parts) + " s"


def timed_reads(spark: Any, reads: dict[str, Callable[[], Any]], rows: int, rounds: int, warmup: int,
                server_pid: int | None = None) -> Rounds:
    """Run each read (a DataFrame factory) into a ``noop`` write: ``warmup`` untimed, then ``rounds`` timed.

    The factory is called inside the timed region (``load()`` / file listing are part of a read)."""
    groups = spark_groups(spark, server_pid)
    sides = list(reads)
    jvm_system = spark._jvm.java.lang.System

    def once(side: str) -> tuple[float, dict[str, float]]:
        jvm_system.gc()
        before = groups.now()
        t = time.perf_counter()
        reads[side]().write.format("noop").mode("overwrite").save()
        wall = time.perf_counter() - t
        after = groups.now()
        return wall, {k: after[k] - before[k] for k in before}

    for r in range(warmup):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            once(side)
    times: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            wall, used = once(side)
            times[side].append(wall)
            cpu[side].append(used)
    return Rounds(rows, times, cpu)
