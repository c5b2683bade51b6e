"""The MessagingProcessor's cost over the bare store, and the separated deployment's throughput.

Rows (issue 3): send and pop+ack through the processor API (merged mode, one
process) beside the store-only figure for the same work, so the processor's
overhead is visible (target: the processor costs under 30% of store-only
throughput). Rows (issue 4): send and pop+ack through one gateway of a
separated deployment (nameserver + 2 brokers + gateways as processes) beside
merged mode, and through two gateway processes in parallel.

What is timed: wall clock around N operations on one asyncio loop (uvloop when
installed). Send rows send batches of 32 x 100 B messages unless marked
single; messages are built before the clock starts on both sides (building
them is a door's work, not the processor's). The merged send rows and their
store-only peers run in 3 interleaved rounds and keep each side's best round:
one round of a tenth of a second per side, the store side always first, let a
burst of load on the shared machine fall on one side only. Pop+ack rows pop 32 at a time and
ack each popped message (``ack``), or settle the popped batch with one
``ack_batch``; in the separated rows a client process acks the 32 concurrently.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

from . import Context, Row

NAME = "processor"
TITLE = "MessagingProcessor and deployment shapes"
BATCH = 32
BODY = b"x" * 100
ROUNDS = 3  # interleaved store-only / processor rounds of the merged rows (best of each kept)


def _loop_run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


class _Timed:
    """One timed round: keeps the best messages/s of ``key`` in ``out`` and, for that round, the
    calling thread's messages per CPU-second in ``out[key + "_cpu"]`` (less sensitive to load)."""

    def __init__(self, out: dict[str, float], key: str, n: int) -> None:
        self.out, self.key, self.n = out, key, n

    def __enter__(self) -> None:
        gc.collect()
        self.cpu = time.thread_time()
        self.t = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        rate = self.n / (time.perf_counter() - self.t)
        cpu = time.thread_time() - self.cpu
        if rate > self.out.get(self.key, 0.0):
            self.out[self.key] = rate
            self.out[self.key + "_cpu"] = self.n / cpu if cpu > 0 else 0.0


async def _merged(root: Path, n_single: int, n_batch: int) -> dict[str, float]:
    from core_broker.config import BrokerConfig, StoreConfig
    from core_broker.model import Message
    from gateway.context import RequestContext
    from gateway.deployment import merged_processor

    sc = StoreConfig(data_dir=root, commitlog_segment_size=256 << 20)
    p = merged_processor(sc, BrokerConfig())
    await p.start()
    store = p.broker.broker.store  # type: ignore[attr-defined]
    ctx = RequestContext("bench")
    await p.create_topic(ctx, "pb", queues=8)
    out: dict[str, float] = {}

    # Store only and processor, the same messages (built before the clock on both sides:
    # building them is the door's work), in ROUNDS interleaved rounds; each side's best round
    # is kept, so a burst of load on the shared machine does not fall on one side only.
    for _ in range(ROUNDS):
        msgs = [Message("pb", BODY, queue_id=i & 7) for i in range(n_single)]
        with _Timed(out, "store_single", n_single):
            for m in msgs:
                store.put_nowait(m)

        msgs = [Message("pb", BODY) for _ in range(n_single)]
        with _Timed(out, "proc_single", n_single):
            for m in msgs:
                await p.send(ctx, [m])

        batches = [[Message("pb", BODY, queue_id=i & 7) for _ in range(BATCH)] for i in range(n_batch // BATCH)]
        with _Timed(out, "store_batch", n_batch):
            for b in batches:
                store.put_batch_nowait(b)

        batches = [[Message("pb", BODY) for _ in range(BATCH)] for _ in range(n_batch // BATCH)]
        with _Timed(out, "proc_batch", n_batch):
            for b in batches:
                await p.send(ctx, b)
        del msgs, batches

    # store only read: get 32 at a time through every queue
    t = time.perf_counter()
    got = 0
    for q in range(8):
        off = 0
        while True:
            r = store.get("pb", q, off, BATCH)
            if not r.messages:
                break
            got += len(r.messages)
            off = r.next_offset
    out["store_get"] = got / (time.perf_counter() - t)

    async def pop_all(group: str, settle: Callable[[list], Awaitable[None]]) -> float:
        """Pop the whole backlog for ``group``, settling each popped batch; messages/s."""
        t = time.perf_counter()
        done = 0
        while done < got:
            popped = await p.pop(ctx, group, "pb", BATCH, 60_000)
            if not popped:
                break
            await settle(popped)
            done += len(popped)
        return done / (time.perf_counter() - t)

    async def ack_each(popped: list) -> None:
        for m in popped:
            await p.ack(ctx, "bench-g", "pb", m.receipt_handle)

    async def ack_batch(popped: list) -> None:
        await p.ack_batch(ctx, "bench-g2", "pb", [m.receipt_handle for m in popped])

    # pop + ack through the processor over the same backlog; then the same backlog for a
    # second group, each popped batch settled with one ack_batch
    out["proc_popack"] = await pop_all("bench-g", ack_each)
    out["proc_popack_batch"] = await pop_all("bench-g2", ack_batch)
    await p.stop()
    return out


def _remote_worker(gateway: tuple[str, int], topic: str, n: int, mode: str, q: multiprocessing.Queue) -> None:
    """One client process driving one gateway (the load generator must not be the bottleneck)."""

    async def main() -> float:
        from core_broker.model import Message
        from gateway.context import RequestContext
        from gateway.processor_rpc import RemoteProcessor

        rp = RemoteProcessor([gateway])
        ctx = RequestContext("bench")
        done = 0
        t = time.perf_counter()

        async def sender(k: int) -> None:
            nonlocal done
            while done < n:
                done += BATCH
                await rp.send(ctx, [Message(topic, BODY) for _ in range(BATCH)])

        async def consumer(k: int) -> None:
            nonlocal done
            idle = 0
            while done < n and idle < 3:
                popped = await rp.pop(ctx, "bench-g", topic, BATCH, 60_000, wait_ms=200)
                idle = 0 if popped else idle + 1
                done += len(popped)
                await asyncio.gather(*(rp.ack(ctx, "bench-g", topic, m.receipt_handle) for m in popped))

        await asyncio.gather(*((sender if mode == "send" else consumer)(k) for k in range(8)))
        dt = time.perf_counter() - t
        await rp.stop()
        return done / dt

    q.put(_loop_run(main()))


def _parallel(gateways: list[tuple[str, int]], topic: str, n_each: int, mode: str) -> float:
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_remote_worker, args=(g, topic, n_each, mode, q)) for g in gateways]
    for p in procs:
        p.start()
    rates = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return sum(rates)


def run(ctx: Context) -> list[Row]:
    n_single = 5_000 if ctx.quick else 20_000
    n_batch = 32_000 if ctx.quick else 160_000
    m = _loop_run(_merged(ctx.scratch("merged"), n_single, n_batch))
    rows: list[Row] = []

    def overhead_row(name: str, proc: float, store: float, floor: bool, note: str = "") -> Row:
        ratio = proc / store
        return Row(NAME, name, proc, proc * 100 / 1e6, f"store only {store:,.0f}/s", f"{ratio:.0%} of store",
                   ">= 70% of store only" if floor else "—", (ratio >= 0.7) if floor else None, note=note)

    def cpu_note(proc: str, store: str) -> str:
        pc, sc = m[proc + "_cpu"], m[store + "_cpu"]
        return (f"best of {ROUNDS} interleaved rounds each; calling thread: processor {pc:,.0f}, store only {sc:,.0f} "
                f"msgs per CPU-second ({pc / sc:.0%})" if pc and sc else "")

    rows.append(overhead_row("send, 1 x 100 B per call, merged", m["proc_single"], m["store_single"], True,
                             cpu_note("proc_single", "store_single")))
    rows.append(overhead_row(f"send, {BATCH} x 100 B per call, merged", m["proc_batch"], m["store_batch"], True,
                             cpu_note("proc_batch", "store_batch")))
    rows.append(overhead_row(f"pop({BATCH}) + ack each, merged", m["proc_popack"], m["store_get"], False))
    rows.append(overhead_row(f"pop({BATCH}) + ack_batch, merged", m["proc_popack_batch"], m["store_get"], False))

    # separated: nameserver + 2 brokers + 2 gateways as processes
    from unimq.local_cluster import Cluster

    root = Path(tempfile.mkdtemp(dir=ctx.data_dir, prefix="cluster-"))
    cluster = Cluster(root, brokers=2, gateways=2).start()
    try:
        gws = cluster.gateway_rpc()
        n = 16_000 if ctx.quick else 64_000

        async def create() -> None:
            from gateway.context import RequestContext
            from gateway.processor_rpc import RemoteProcessor

            rp = RemoteProcessor(gws)
            for t in ("s1", "s2"):
                await rp.create_topic(RequestContext("bench"), t, queues=8)
            await rp.stop()

        _loop_run(create())
        one_send = _parallel(gws[:1], "s1", n, "send")
        one_pop = _parallel(gws[:1], "s1", n, "pop")
        two_send = _parallel(gws, "s2", n // 2, "send")
        two_pop = _parallel(gws, "s2", n // 2, "pop")
    finally:
        cluster.stop()

    def scaling_row(name: str, rate: float, mb_s: bool, base_name: str, base: float) -> Row:
        return Row(NAME, name, rate, rate * 100 / 1e6 if mb_s else None, f"{base_name} {base:,.0f}/s",
                   f"{rate / base:.2f}x of {base_name}")

    send, popack = f"send, {BATCH} x 100 B per call, separated", f"pop({BATCH}) + ack each, separated"
    rows.append(scaling_row(f"{send}, 1 gateway", one_send, True, "merged", m["proc_batch"]))
    rows.append(scaling_row(f"{send}, 2 gateways in parallel", two_send, True, "1 gateway", one_send))
    rows.append(scaling_row(f"{popack}, 1 gateway", one_pop, False, "merged", m["proc_popack"]))
    rows.append(scaling_row(f"{popack}, 2 gateways in parallel", two_pop, False, "1 gateway", one_pop))
    return rows
