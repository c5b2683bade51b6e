"""Authentication and a 1,000-rule ACL cost next to nothing: three doors, with and without, one run.

    python -m bench --only auth

Issue 19 asks that logging in and the permission check (one authorizer in the processor, for
every door) leave the hot paths alone: with users and an ACL of 1,000 rules, MQTT QoS 1 fan-in,
AMQP persistent publishing with confirms and HTTP batch ingest must reach at least 0.95x what
the same load reaches with no users, measured in the same run.

This section does not have load generators of its own: it runs the scenarios of the mqtt, amqp
and http sections (``mqtt_bench.fan_in``, ``amqp_bench.measure``, ``http_bench.measure``)
against ``unimq up``, once as it starts (no users: anonymous clients on loopback) and once with
users and 1,000 rules (put in through the HTTP admin API, as ``unimq user`` / ``unimq acl``
would) and every client logging in as the user ``bench``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from . import Context, Row
from . import amqp_bench, http_bench, mqtt_bench
from .procs import UnimqChild

NAME = "auth"
TITLE = "authentication + 1,000-rule ACL vs none (MQTT, AMQP, HTTP)"

USER, PASSWORD = "bench", "bench-pw-4f1c"
ADMIN, ADMIN_PASSWORD = "root", "root-pw-9a2e"
RULES = 1000
FLOOR = 0.95

# Small segments and no free-space guards (the disk is shared), as the other sections.
CONFIG = ("mqtt_ws_port = -1\n[store]\ncommitlog_segment_size = 67108864\n"
          "disk_min_free_ratio = 0.0\ndisk_refuse_free_ratio = 0.0\n")

TIMED = """\
What is timed in section auth (each row: 6 windows of 2 s per server; the figures are the
medians, the ratio the median of the windows' paired ratios):

- Two `unimq up` side by side, one without users and one with them, and the loads alternate
  between them window by window (the order flipping each window), so that both see the same
  machine load; first a pair with `--flush async` for MQTT and HTTP (as in sections mqtt and
  http), then a pair with `--flush sync` for AMQP (as section amqp's persistent scenario).
  "with auth": before the
  load, an admin user `root` and the user `bench` are added and 1,000 permissions granted through
  the HTTP admin API: the few `bench` needs (topic `bench/#` publish, subscribe, create; vhost `/`
  configure/write/read `.*`), the rest spread over 40 other users, 10 roles (one of them
  `bench`'s) and `bench` itself on other topics; every client then logs in as `bench` (MQTT
  CONNECT user name and password, AMQP PLAIN, HTTP `Authorization: Basic` on every request).
  "without": no users, anonymous clients on loopback.
- MQTT: section mqtt's QoS 1 fan-in (4 publishers, 100 B, 1 subscriber of `bench/#`), PUBACKed
  msgs/s. AMQP: section amqp's persistent 1 KiB scenario with confirms, published msgs/s. HTTP:
  section http's batch load (100 CloudEvents a request, 16 connections), events/s.
"""


def _rules(needed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``needed`` plus other rules up to :data:`RULES`: other users', roles' (one of them the
    bench user's), and the bench user's own on topics it never touches."""
    out = list(needed)
    i = 0
    while len(out) < RULES:
        k = i % 4
        if k == 0:
            out.append({"subject": f"user{i % 40}", "resource": "topic", "pattern": f"plant{i}/+/line{i}/#",
                        "actions": ["publish"]})
        elif k == 1:
            out.append({"subject": f"role:team{i % 10}", "resource": "topic", "pattern": f"team{i}/#",
                        "actions": ["publish", "subscribe"]})
        elif k == 2:
            out.append({"subject": USER, "resource": "topic", "pattern": f"other{i}/+/x",
                        "actions": ["subscribe"]})
        else:
            out.append({"subject": f"user{i % 40}", "resource": "group", "pattern": f"g{i}-*",
                        "actions": ["subscribe"]})
        i += 1
    return out


async def _add_users(http_port: int) -> int:
    base = f"http://127.0.0.1:{http_port}/v1/admin"
    async with httpx.AsyncClient(timeout=30) as anon:  # the first user, while there are none
        (await anon.post(f"{base}/users", json={"name": ADMIN, "password": ADMIN_PASSWORD, "admin": True})
         ).raise_for_status()
    async with httpx.AsyncClient(timeout=30, auth=(ADMIN, ADMIN_PASSWORD)) as c:
        (await c.post(f"{base}/users", json={"name": USER, "password": PASSWORD, "roles": ["team3"]})
         ).raise_for_status()
        needed = [
            {"subject": USER, "resource": "topic", "pattern": "bench/#", "actions": ["publish", "subscribe", "create"]},
            {"subject": USER, "resource": "vhost", "pattern": "/", "configure": ".*", "write": ".*", "read": ".*"},
        ]
        todo = _rules(needed)[:RULES - 1]  # root's "admin *" is the 1,000th

        async def worker() -> None:
            while todo:
                (await c.post(f"{base}/acl", json=todo.pop())).raise_for_status()

        await asyncio.gather(*(worker() for _ in range(8)))
        listed = await c.get(f"{base}/acl")
        listed.raise_for_status()
        return len(listed.json())


def add_users(http_port: int) -> int:
    """Users root and bench and :data:`RULES` permissions; the number of rules the store lists."""
    return asyncio.run(_add_users(http_port))


def _run_async(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


def _server(base: Path, flush: str, auth: bool) -> tuple[UnimqChild, int]:
    base.mkdir(parents=True, exist_ok=True)
    srv = UnimqChild(base, "mqtt", flush, config=CONFIG)
    n = 0
    if auth:
        try:
            n = add_users(srv.ports["http"])
        except Exception:
            srv.stop()
            raise
    return srv, n


def _basic(load: http_bench.Load) -> http_bench.Load:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return dataclasses.replace(load, headers={**load.headers, "Authorization": f"Basic {token}"})


class _Pair:
    """Two fresh servers side by side, one without users and one with them (and the rules)."""

    def __init__(self, base: Path, flush: str) -> None:
        self.servers: dict[bool, UnimqChild] = {}
        try:
            self.servers[False], _ = _server(base / f"{flush}-without", flush, False)
            self.servers[True], self.rules = _server(base / f"{flush}-with", flush, True)
        except BaseException:
            self.stop()
            raise
        time.sleep(1.0)  # let the with-users server settle after the 1,000 writes

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()


def measure(base: Path, windows: int, seconds: float) -> tuple[dict[tuple[str, bool], list[float]], int]:
    """Every load ``windows`` times on each server of a pair, with and without alternating
    window by window (the order flipping each time), so both see the same machine load."""
    got: dict[tuple[str, bool], list[float]] = {}
    orders = [(False, True), (True, False)]
    pair = _Pair(base, "async")
    try:
        scratch = base / "http"
        scratch.mkdir()
        for auth, srv in pair.servers.items():  # warm-up and the topic's creation
            url = f"http://127.0.0.1:{srv.ports['http']}/v1/topics/bench/events"
            http_bench.measure(url, _basic(http_bench.LOADS["batch"]) if auth else http_bench.LOADS["batch"], 1.0,
                               scratch)
        for w in range(windows):
            for auth in orders[w % 2]:
                srv = pair.servers[auth]
                print(f"bench: auth: window {w + 1}, MQTT and HTTP {'with' if auth else 'without'} users...",
                      file=sys.stderr)
                r = _run_async(mqtt_bench.fan_in(srv.ports["mqtt"], 1, seconds, (USER, PASSWORD) if auth else None))
                got.setdefault(("mqtt", auth), []).append(r.acked_s)
                load = _basic(http_bench.LOADS["batch"]) if auth else http_bench.LOADS["batch"]
                url = f"http://127.0.0.1:{srv.ports['http']}/v1/topics/bench/events"
                rps, bad, cpu_us, _ = http_bench.measure(url, load, seconds, scratch, srv.proc.pid)
                if bad:
                    raise RuntimeError(f"HTTP batch ingest: {bad} requests refused (with users: {auth})")
                got.setdefault(("http", auth), []).append(rps * load.events)
                got.setdefault(("http_cpu_us", auth), []).append(cpu_us)
    finally:
        pair.stop()
    rules = pair.rules
    pair = _Pair(base, "sync")
    try:
        sc = amqp_bench.SCENARIOS[0]
        for w in range(windows):
            for auth in orders[w % 2]:
                srv = pair.servers[auth]
                print(f"bench: auth: window {w + 1}, AMQP {'with' if auth else 'without'} users...", file=sys.stderr)
                creds = (USER, PASSWORD) if auth else ("guest", "guest")
                got.setdefault(("amqp", auth), []).append(
                    amqp_bench.measure(srv.ports["amqp"], sc, seconds, srv.pids, *creds, queue=f"bench-auth-{w}").publish_s)
    finally:
        pair.stop()
    return got, rules


ROWS: list[tuple[str, str, float]] = [
    ("mqtt", "MQTT QoS 1 fan-in (4 publishers -> 1 subscriber, 100 B): PUBACKed msgs/s", mqtt_bench.PAYLOAD),
    ("amqp", "AMQP persistent 1 KiB with confirms: published msgs/s (--flush sync)", amqp_bench.SCENARIOS[0].size),
    ("http", "HTTP batch ingest (100 CloudEvents a request): events/s",
     len(http_bench.DATA)),
]


def run(ctx: Context) -> list[Row]:
    seconds = 1.5 if ctx.quick else 2.0
    windows = 2 if ctx.quick else 6
    got, rules = measure(ctx.scratch("auth"), windows, seconds)
    # Medians, and the ratio as the median of each window's paired ratio (the two servers of a
    # window ran back to back): one lucky or unlucky window on a shared machine (a flush that
    # hit a quiet disk) moves neither, where the best of the windows took it as the answer.
    best = {k: (min(v) if k[0].endswith("_us") else statistics.median(v)) for k, v in got.items()}
    rows = []
    for key, title, size in ROWS:
        on, off = best.get((key, True), 0.0), best.get((key, False), 0.0)
        pairs = [a / b for a, b in zip(got.get((key, True), []), got.get((key, False), [])) if b]
        ratio = statistics.median(pairs) if pairs else 0.0
        rows.append(Row(NAME, f"{title}, logged in, {rules:,} rules", on, on * size / 1e6,
                        peer=f"without users {off:,.0f} msgs/s", ratio=f"{ratio:.2f}x",
                        floor=f">= {FLOOR:.2f}x without", meets=ratio >= FLOOR))
    cpu_on, cpu_off = best.get(("http_cpu_us", True), 0.0), best.get(("http_cpu_us", False), 0.0)
    ctx.notes.append(f"auth: HTTP batch ingest, server CPU per request (the least of the windows): {cpu_on:,.0f} µs "
                     f"logged in, {cpu_off:,.0f} µs without users")
    for key, _, _ in ROWS:
        ctx.notes.append(f"auth: {key} windows, msgs/s: without users "
                         + " / ".join(f"{x:,.0f}" for x in got.get((key, False), []))
                         + "; with " + " / ".join(f"{x:,.0f}" for x in got.get((key, True), [])))
    ctx.notes.append(f"auth: {windows} windows of {seconds:g} s per load and server, with and without alternating; "
                     f"the ACL listed {rules:,} rules")
    return rows


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent) as d:
        for r in run(Context(Path(d), quick="--quick" in sys.argv)):
            print(r)


if __name__ == "__main__":
    main()
