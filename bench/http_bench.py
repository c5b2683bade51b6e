"""The http section: CloudEvents ingest through `unimq up`'s HTTP door beside a bare FastAPI endpoint.

    python -m bench --only http          # this section (plus the disk peer every run measures)
    python -m bench.http_bench           # this section alone, table on stdout

What runs, all on 127.0.0.1, in one run:

- **the ceiling**: a bare FastAPI app on uvicorn (uvloop, httptools, access log off, one process,
  the same server stack and settings as the HTTP door) whose ``POST /v1/topics/{topic}/events``
  reads the body and answers a fixed small JSON object: HTTP parsing, routing and the framework,
  nothing else;
- **unimq**: a real ``unimq up`` (async flush, a fresh data dir, 64 MiB commitlog segments, every
  door started) with the same
  requests to its HTTP door, which parses the CloudEvent with the SDK, stores it through the
  MessagingProcessor and answers the message id.

The load generator is ``wrk`` (Debian package; one thread, 16 keep-alive connections, fixed
request from a Lua script) when installed, else a raw HTTP/1.1 keep-alive generator on
asyncio/uvloop in this process (16 connections, one request in flight each). Requests answered
with anything but 2xx are counted and invalidate the row. Each target is warmed up for 1 s, then
measured; bare and unimq are measured alternately for several rounds and each keeps its best
round, so a burst of load from elsewhere on the machine hits both alike rather than one. Beside
requests/s, the server processes' CPU time (user + system, all threads, from /proc) per request is
recorded (the best round): on a busy machine wall-clock rates swing with what else runs, while
CPU per request shows what the door itself costs ("CPU-normalised" = bare's CPU per request over
unimq's, the ratio the two would reach with a core each).

Rows: bare requests/s; one CloudEvent per request in binary mode (``ce-*`` headers, 75 B JSON
data) and in structured mode; a batch of 100 structured events per request
(``application/cloudevents-batch+json``, 26 KB), in events/s. Floors (issue 8): single events
>= 60% of the bare endpoint's requests/s; batches of 100 >= 50,000 events/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import Context, Row
from .procs import cpu_seconds

NAME = "http"
TITLE = "HTTP/CloudEvents door ingest vs bare FastAPI/uvicorn"
REPO = Path(__file__).resolve().parent.parent
CONNECTIONS = 16
BATCH = 100

DATA = b'{"temperature": 21.5, "humidity": 40, "device": "sensor-0042", "ok": true}'
BINARY_HEADERS = {
    "ce-specversion": "1.0",
    "ce-id": "a234-1234-1234",
    "ce-source": "/mycontext/subcontext",
    "ce-type": "com.example.someevent",
    "ce-time": "2018-04-05T03:56:24Z",
    "Content-Type": "application/json",
}


def _event(i: int) -> dict:
    return {
        "specversion": "1.0", "id": f"id-{i}", "source": "/mycontext/subcontext", "type": "com.example.someevent",
        "time": "2018-04-05T03:56:24Z", "datacontenttype": "application/json",
        "data": {"temperature": 21.5, "humidity": 40, "device": "sensor-0042", "seq": i},
    }


STRUCTURED = json.dumps(_event(0)).encode()
BATCH_BODY = json.dumps([_event(i) for i in range(BATCH)]).encode()


@dataclass
class Load:
    name: str
    headers: dict[str, str]
    body: bytes
    events: int  # CloudEvents per request


LOADS = {
    "binary": Load("binary", BINARY_HEADERS, DATA, 1),
    "structured": Load("structured", {"Content-Type": "application/cloudevents+json"}, STRUCTURED, 1),
    "batch": Load("batch", {"Content-Type": "application/cloudevents-batch+json"}, BATCH_BODY, BATCH),
}

# ------------------------------------------------------------------------------ the servers

BARE_APP = '''
import sys, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

app = FastAPI()


@app.post("/v1/topics/{topic}/events")
async def events(topic: str, request: Request) -> Response:
    await request.body()
    return Response(b'{"ok":true}', media_type="application/json")


config = uvicorn.Config(app, host="127.0.0.1", port=0, loop="uvloop", http="httptools", log_level="warning",
                        access_log=False, lifespan="off")
server = uvicorn.Server(config)
import socket
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(1024)
print(f"bare listening on 127.0.0.1:{sock.getsockname()[1]}", flush=True)
server.run(sockets=[sock])
'''


def _wait_line(proc: subprocess.Popen[str], pattern: re.Pattern[str], until: str | None, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    found = None
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited early (code {proc.poll()})")
        m = pattern.search(line)
        if m and found is None:
            found = m
            if until is None:
                return m
        if until is not None and line.strip() == until and found is not None:
            return found
    raise RuntimeError("server did not start in time")


def start_bare() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", BARE_APP], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=REPO)
    m = _wait_line(proc, re.compile(r"bare listening on 127\.0\.0\.1:(\d+)"), None, 60)
    return proc, int(m.group(1))


# 64 MiB segments instead of 1 GiB (less to preallocate; ingest does not depend on it), and no
# disk-space guards, so a nearly full shared disk cannot turn the run into 507 answers.
UNIMQ_CONFIG = """
[store]
commitlog_segment_size = 67108864
disk_min_free_ratio = 0.0
disk_refuse_free_ratio = 0.0
"""


def start_unimq(data_dir: Path) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, "-m", "unimq"]
    data_dir.mkdir(parents=True, exist_ok=True)
    cfg = data_dir.parent / "unimq-http-bench.toml"
    cfg.write_text(UNIMQ_CONFIG)
    args = cmd + ["up", "--data-dir", str(data_dir), "--host", "127.0.0.1", "--log-level", "warning",
                  "--config", str(cfg)]
    for flag in ("--mqtt-port", "--amqp-port", "--http-port", "--grpc-port", "--namesrv-port"):
        args += [flag, "0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    m = _wait_line(proc, re.compile(r"^unimq: http listening on 127\.0\.0\.1:(\d+)"), "unimq: ready", 120)
    return proc, int(m.group(1))


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


# ------------------------------------------------------------------------------ load generators


def _lua(load: Load) -> str:
    lines = ['wrk.method = "POST"']
    for k, v in load.headers.items():
        lines.append(f'wrk.headers["{k}"] = "{v}"')
    lines.append(f"wrk.body = [==[{load.body.decode()}]==]")
    return "\n".join(lines) + "\n"


def run_wrk(url: str, load: Load, seconds: float, scratch: Path) -> tuple[float, int, int]:
    """(requests/s, non-2xx answers, requests) from one wrk run.

    ``--timeout`` is raised from wrk's 2 s because on a shared, loaded machine a batch
    request now and then waits longer than that for a CPU, and wrk would count it as
    an error; a request still unanswered after 10 s is one.
    """
    script = scratch / f"{load.name}.lua"
    script.write_text(_lua(load))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url],
        capture_output=True, text=True, timeout=seconds + 60,
    ).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    n = re.search(r"(\d+) requests in", out)
    return (float(m.group(1)), (int(bad.group(1)) if bad else 0) + (1 if errors and "timeout" in errors.group(0) else 0),
            int(n.group(1)) if n else 0)


async def _raw_conn(host: str, port: int, request: bytes, deadline: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            if m:
                await reader.readexactly(int(m.group(1)))
            counts[0 if 200 <= status < 300 else 1] += 1
    finally:
        writer.close()


def run_raw(url: str, load: Load, seconds: float) -> tuple[float, int, int]:
    """The fallback generator: raw HTTP/1.1 keep-alive requests on asyncio (uvloop when installed)."""
    m = re.match(r"http://([^:/]+):(\d+)(/.*)", url)
    assert m
    host, port, path = m.group(1), int(m.group(2)), m.group(3)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(load.body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in load.headers.items())
    request = head.encode() + b"\r\n" + load.body

    async def main() -> tuple[float, int, int]:
        counts = [0, 0]
        t0 = time.monotonic()
        deadline = t0 + seconds
        await asyncio.gather(*(_raw_conn(host, port, request, deadline, counts) for _ in range(CONNECTIONS)))
        return counts[0] / (time.monotonic() - t0), counts[1], counts[0] + counts[1]

    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:  # pragma: no cover
        return asyncio.run(main())


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(url: str, load: Load, seconds: float, scratch: Path, pid: int = 0) -> tuple[float, int, float, float]:
    """(requests/s, non-2xx answers, server CPU µs per request, load generator CPU µs per request).

    The generator's CPU shows whether the client, not the server, limits a row: wrk's is
    what the finished child used (RUSAGE_CHILDREN; the servers are not reaped until the
    end), the fallback generator's is this process's own.
    """
    c0 = cpu_seconds(pid) if pid else float("nan")
    if shutil.which("wrk"):
        g0 = _children_cpu()
        rps, bad, n = run_wrk(url, load, seconds, scratch)
        g1 = _children_cpu()
    else:
        g0 = time.process_time()
        rps, bad, n = run_raw(url, load, seconds)
        g1 = time.process_time()
    c1 = cpu_seconds(pid) if pid else float("nan")
    if not n:
        return rps, bad, float("nan"), float("nan")
    return rps, bad, (c1 - c0) / n * 1e6, (g1 - g0) / n * 1e6


# ------------------------------------------------------------------------------ the section


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run(ctx: Context) -> list[Row]:
    seconds = 3.0 if ctx.quick else 6.0
    rounds = 2 if ctx.quick else 3
    scratch = ctx.scratch("http")
    generator = "wrk (1 thread, 16 connections)" if shutil.which("wrk") else "asyncio raw HTTP/1.1 (16 connections)"
    bare, bare_port = start_bare()
    unimq, port = start_unimq(scratch / "data")
    best: dict[tuple[str, str], float] = {}
    cpu: dict[tuple[str, str], float] = {}  # server CPU microseconds per request (all its threads)
    errors: dict[tuple[str, str], int] = {}
    gen: dict[tuple[str, str], float] = {}  # load generator CPU microseconds per request
    load_before = _load_average()
    try:
        targets = {
            "bare": (f"http://127.0.0.1:{bare_port}/v1/topics/bench/events", bare.pid),
            "unimq": (f"http://127.0.0.1:{port}/v1/topics/bench/events", unimq.pid),
        }
        for name, (url, _) in targets.items():  # warm-up (and the topic's auto-creation)
            for load in LOADS.values():
                measure(url, load, 1.0, scratch)
        for _ in range(rounds):
            for load in LOADS.values():
                for name, (url, pid) in targets.items():
                    rps, bad, cpu_us, gen_us = measure(url, load, seconds, scratch, pid)
                    key = (name, load.name)
                    best[key] = max(best.get(key, 0.0), rps)
                    cpu[key] = min(cpu.get(key, float("inf")), cpu_us)
                    gen[key] = min(gen.get(key, float("inf")), gen_us)
                    errors[key] = errors.get(key, 0) + bad
    finally:
        stop(unimq)
        stop(bare)
    load_after = _load_average()

    rows: list[Row] = []
    bare_rps = best[("bare", "binary")]
    rows.append(Row(NAME, "bare FastAPI/uvicorn POST: read body, fixed JSON answer (the ceiling)", bare_rps,
                    bare_rps * len(DATA) / 1e6,
                    note=f"server CPU per request {cpu[('bare', 'binary')]:,.0f} µs"))
    for lname, label in (("binary", "1 CloudEvent per request, binary mode"),
                         ("structured", "1 CloudEvent per request, structured mode")):
        rps = best[("unimq", lname)]
        peer = best[("bare", lname)]
        ratio = rps / peer if peer else 0.0
        floor = ">= 60% of bare" if lname == "binary" else "—"
        meets = (ratio >= 0.60) if lname == "binary" else None
        cu, cb = cpu[("unimq", lname)], cpu[("bare", lname)]
        note = (f"server CPU per request {cu:,.0f} µs vs bare {cb:,.0f} µs: CPU-normalised "
                f"{cb / cu:.0%} of bare; load generator CPU per request {gen[('unimq', lname)]:,.0f} µs")
        if errors[("unimq", lname)]:
            meets, note = False, f"{errors[('unimq', lname)]} non-2xx answers"
        rows.append(Row(NAME, f"unimq: {label}", rps, rps * len(LOADS[lname].body) / 1e6,
                        peer=f"bare {peer:,.0f} req/s", ratio=f"{ratio:.0%}", floor=floor, meets=meets, note=note))
    ev = best[("unimq", "batch")] * BATCH
    peer = best[("bare", "batch")]
    cu = cpu[("unimq", "batch")]
    note = (f"server CPU per batch {cu:,.0f} µs = {cu / BATCH:,.1f} µs per event: "
            f"{BATCH * 1e6 / cu:,.0f} events/s per core of server CPU; load generator CPU per batch "
            f"{gen[('unimq', 'batch')]:,.0f} µs")
    if errors[("unimq", "batch")]:
        note = f"{errors[('unimq', 'batch')]} non-2xx answers"
    rows.append(Row(NAME, f"unimq: batches of {BATCH} CloudEvents (events/s)", ev,
                    best[("unimq", "batch")] * len(BATCH_BODY) / 1e6,
                    peer=f"bare {peer:,.0f} req/s of the same body", ratio=f"{best[('unimq', 'batch')] / peer:.0%}",
                    floor=">= 50,000 events/s", meets=ev >= 50_000 and not errors[("unimq", "batch")], note=note))
    ctx.notes.append(
        f"http: load generator {generator}; {rounds} alternating rounds of {seconds:.0f} s per target, best round kept; "
        f"load average before/after: {load_before} / {load_after}"
    )
    return rows


def main() -> int:
    from . import fmt_int

    with tempfile.TemporaryDirectory(dir=REPO) as d:
        ctx = Context(data_dir=Path(d), quick="--quick" in sys.argv)
        rows = run(ctx)
    print("| row | msgs/s | peer | vs peer | floor | meets |")
    print("| --- | ---: | --- | ---: | --- | :---: |")
    for r in rows:
        meets = "—" if r.meets is None else ("yes" if r.meets else "**no**")
        print(f"| {r.name} | {fmt_int(r.msgs_s)} | {r.peer} | {r.ratio} | {r.floor} | {meets} |")
    for n in [f"{r.name}: {r.note}" for r in rows if r.note] + ctx.notes:
        print(f"- {n}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
