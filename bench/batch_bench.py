"""Batch topics: 100 B messages sent one per request vs in batches of 100 and 1,000, through the
HTTP door and the gRPC door, into a batch topic (``batch=true``) of one `unimq up`.

What is timed: a few concurrent senders (asyncio, one connection each: httpx for HTTP, raw
grpc.aio stubs for gRPC, what the tests use) for a fixed time per mode; msgs/s is messages the
server acknowledged as stored (async flush) per wall-clock second. Floors (issue 18): batches of
100 >= 5x single sends of the same door in the same run; >= 1,000,000 msgs/s stored through at
least one door; the Spark source reading a batch topic >= 0.8x ``spark.read.parquet`` of the same
rows (``local[2]``, each read is a ``noop`` write; 2 untimed warm-up reads per side, then 5 rounds
in alternating order, a JVM GC before each, each side's rate at the median of its rounds, CPU per
process group beside it: ``bench/spark_rounds.py``; the topic loaded with
packed batches of 1,000 small JSON bodies without properties, the parquet written from it by
Spark, neither timed). "Packed" rows: the producer packs a batch once (``gateway/batch_codec.py``)
and posts it as ``application/vnd.unimq.batch``, which the server checks and stores as it came.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import time

import httpx

from . import Context, Row, fmt_int
from .http_bench import UNIMQ_CONFIG, REPO, _wait_line, stop
from .procs import free_port
from .spark_rounds import timed_reads

NAME = "batch"
TITLE = "Batch topics (100 B messages one per request vs batches, HTTP and gRPC)"
TIMED = __doc__

SECONDS = 3.0
SENDERS = 4
ROUNDS = 5  # timed Spark reads per side (median), after WARMUP untimed ones: see bench/spark_rounds.py
WARMUP = 2
BODY = b"x" * 100
BATCH_JSON = "application/vnd.unimq.batch+json"
BATCH_PACKED = "application/vnd.unimq.batch"


async def _http(port: int, n: int, seconds: float) -> float:
    done = [0]
    payload = json.dumps([{"body_base64": base64.b64encode(BODY).decode()}] * n).encode()

    async def sender() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                if n == 1:
                    r = await c.post("/v1/topics/bb/messages", content=BODY)
                else:
                    r = await c.post("/v1/topics/bb/messages", content=payload, headers={"content-type": BATCH_JSON})
                r.raise_for_status()
                done[0] += n

    t0 = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return done[0] / (time.perf_counter() - t0)


async def _packed(port: int, n: int, seconds: float) -> float:
    """Batches packed by the producer once (100 random bytes each): the server checks and stores the bytes."""
    from core_broker.model import Message
    from gateway.batch_codec import pack

    payload = pack([Message("bb", os.urandom(100)) for _ in range(n)])
    done = [0]

    async def sender() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                r = await c.post("/v1/topics/bb/messages", content=payload, headers={"content-type": BATCH_PACKED})
                r.raise_for_status()
                done[0] += n

    t0 = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return done[0] / (time.perf_counter() - t0)


async def _grpc(port: int, n: int, seconds: float) -> float:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

    def msg(i: int) -> pb.Message:
        m = pb.Message(topic=pb.Resource(name="bb"), body=BODY)
        m.system_properties.message_id = f"{os.getpid():08X}{i:024X}"
        m.system_properties.message_type = pb.MessageType.NORMAL
        m.system_properties.body_encoding = pb.Encoding.IDENTITY
        return m

    req = spb.SendMessageRequest(messages=[msg(i) for i in range(n)])
    done = [0]

    async def sender() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = sgrpc.MessagingServiceStub(ch)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                a = await stub.SendMessage(req, timeout=30)
                if a.status.code != pb.Code.OK:
                    raise RuntimeError(a.status.message)
                done[0] += n

    t0 = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return done[0] / (time.perf_counter() - t0)


def _spark(ctx: Context, http_port: int, server_pid: int) -> list[Row]:
    """The Spark source reading a batch topic beside spark.read.parquet of the same rows."""
    from core_broker.model import Message
    from gateway.batch_codec import pack
    from spark_ingest.session import get_spark, java_available

    if not java_available():
        return [Row("batch", "Spark source on a batch topic (skipped: no Java runtime)")]
    n = 200_000 if ctx.quick else 1_000_000
    rounds, warmup = (1, 1) if ctx.quick else (ROUNDS, WARMUP)
    base = f"http://127.0.0.1:{http_port}"
    with httpx.Client(base_url=base, timeout=120) as c:
        c.post("/v1/topics", json={"name": "bsp", "queues": 4, "attributes": {"batch": "true"}}).raise_for_status()
        for s in range(0, n, 1000):
            body = pack([Message("bsp", b'{"id":%d,"device":"dev-%d","temp":%.1f,"ok":%s}'
                                 % (i, i % 100, 15 + (i % 200) / 10, b"true" if i % 7 else b"false"))
                         for i in range(s, min(n, s + 1000))])
            c.post("/v1/topics/bsp/messages", content=body, headers={"content-type": BATCH_PACKED}).raise_for_status()
    scratch = ctx.scratch("batch-spark")
    spark = get_spark("unimq-batch-bench", conf={"spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false"})
    try:
        src = spark.read.format("unimq").option("endpoint", base).option("topics", "bsp")
        src.load().write.mode("overwrite").parquet(str(scratch / "parquet"))
        paths = {"unimq": lambda: src.load(), "parquet": lambda: spark.read.parquet(str(scratch / "parquet"))}
        counts = {k: f().count() for k, f in paths.items()}
        if set(counts.values()) != {n}:
            raise RuntimeError(f"row counts differ: {counts} (expected {n})")
        res = timed_reads(spark, paths, n, rounds, warmup, server_pid)
    finally:
        spark.stop()
    rate = {k: res.rate(k) for k in paths}
    ratio = rate["unimq"] / rate["parquet"]
    return [
        Row("batch", f"Spark source, batch topic, {n:,} rows in records of 1,000 (rows/s)", rate["unimq"],
            peer=f"parquet {fmt_int(rate['parquet'])} rows/s", ratio=f"{ratio:.2f}x", floor=">= 0.8x parquet",
            meets=ratio >= 0.8,
            note=f"runs {res.runs('unimq')} rows/s (round by round {res.round_ratios('unimq', 'parquet')} of "
                 f"parquet); CPU per read (median): {res.cpu_note('unimq')}"),
        Row("batch", "spark.read.parquet of the same rows (peer)", rate["parquet"],
            note=f"runs {res.runs('parquet')} rows/s; CPU per read (median): {res.cpu_note('parquet')}"),
    ]


def _start(data_dir) -> tuple[subprocess.Popen[str], int, int]:
    data_dir.mkdir(parents=True, exist_ok=True)
    cfg = data_dir.parent / "unimq-batch-bench.toml"
    cfg.write_text(UNIMQ_CONFIG)
    http_port, grpc_port = free_port(), free_port()
    args = [sys.executable, "-m", "unimq", "up", "--data-dir", str(data_dir), "--log-level", "warning",
            "--config", str(cfg), "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    for flag in ("--mqtt-port", "--amqp-port", "--namesrv-port"):
        args += [flag, "0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    _wait_line(proc, re.compile(r"^unimq: ready"), None, 120)
    return proc, http_port, grpc_port


def run(ctx: Context) -> list[Row]:
    proc, http_port, grpc_port = _start(ctx.scratch("batch"))
    rows: list[Row] = []
    try:
        httpx.post(f"http://127.0.0.1:{http_port}/v1/topics",
                   json={"name": "bb", "queues": 4, "attributes": {"batch": "true"}}).raise_for_status()
        seconds = 1.5 if ctx.quick else SECONDS
        best = 0.0
        for door, fn, port in (("HTTP", _http, http_port), ("gRPC", _grpc, grpc_port)):
            single = asyncio.run(fn(port, 1, seconds))
            rows.append(Row("batch", f"{door}: 100 B, one per request", single))
            for n in (100, 1000):
                rate = asyncio.run(fn(port, n, seconds))
                best = max(best, rate)
                floor = n == 100
                rows.append(Row("batch", f"{door}: 100 B, batches of {n:,}", rate, peer=f"single {fmt_int(single)}/s",
                                ratio=f"{rate / single:.1f}x", floor=">= 5x single" if floor else "—",
                                meets=(rate >= 5 * single) if floor else None))
        for n in (1000, 10000, 30000):
            rate = asyncio.run(_packed(http_port, n, seconds))
            best = max(best, rate)
            rows.append(Row("batch", f"HTTP: 100 B, packed batches of {n:,}", rate))
        rows.append(Row("batch", "best door, stored msgs/s", best, floor=">= 1,000,000 msgs/s", meets=best >= 1e6))
        rows += _spark(ctx, http_port, proc.pid)
    finally:
        stop(proc)
    return rows
