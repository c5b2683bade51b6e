"""Child process of the crash test (tests/test_store_crash.py): write, acknowledge, get killed.

Usage::

    python tests/crash_writer.py --data-dir DIR --flush sync|async --seed N --first-seq S
                                 [--count N]

It opens the store (recovering from whatever the last SIGKILL left), prints one
``READY {...}`` line and then writes messages whose every field is a pure
function of ``(seed, seq)`` (:func:`expected`), from several sync-put threads,
a put_batch thread and an asyncio loop running concurrent ``put_async`` /
``put_batch_async`` calls, so that group commit sees real concurrency. Only
*after* a put has returned ``PUT_OK`` (in sync flush mode: after fdatasync
covered it) it writes one ``ACK {...}`` line to stdout with a single
``os.write`` (a line shorter than PIPE_BUF reaches the pipe whole or not at
all), so every ACK line the parent reads names an acknowledged message. The
parent kills this process with SIGKILL at a random moment; with ``--count``
it instead stops after that many acknowledgements and shuts the store down
cleanly. It never verifies anything itself.

The parent imports this file for :func:`expected`, :func:`make_config` and
:func:`targets`, so the content rules live in one place.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import sys
import threading
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from core_broker.config import FlushMode, StoreConfig  # noqa: E402
from core_broker.model import DispatchTarget, Message, PutStatus  # noqa: E402

# Topics include characters that need escaping in directory names (MQTT/AMQP style).
TOPICS = ("CrashA", "CrashB", "mqtt/home/+/temp", "amqp.ex%q")
FANOUT = (("CrashFan", 0), ("CrashFan", 1), ("wild/#", 0), ("CrashB", 3))
QUEUES = 3
TAGS = (None, "TagA", "TagB", "tag with spaces", "ünï")
MAX_BODY = 3000


def make_config(data_dir: str | Path, flush: str) -> StoreConfig:
    """Small geometry so segments, consume-queue files and index files roll often."""
    return StoreConfig(
        data_dir=Path(data_dir),
        flush=FlushMode(flush),
        commitlog_segment_size=256 * 1024,
        cq_entries_per_file=64,
        index_slots=257,
        index_entries_per_file=1500,
        flush_interval_ms=20,
        checkpoint_interval_ms=30,
        retention_hours=1e6,
        disk_min_free_ratio=0.0,
        disk_refuse_free_ratio=0.0,
        retention_check_interval_s=3600.0,
        consumer_offset_persist_interval_s=3600.0,
    )


def _digest(seed: int, seq: int) -> bytes:
    return hashlib.sha256(f"{seed}:{seq}".encode()).digest()


PLAIN_TOPIC = "CrashPlain"
PLAIN_BLOCK = 16  # seqs [16k, 16k+16) with k % 4 == 3 are bare messages, written as one batch


def is_plain(seq: int) -> bool:
    return (seq // PLAIN_BLOCK) % 4 == 3


def seq_of(m) -> int:
    """The sequence number a stored message was written for (bare ones carry it in the body)."""
    if "seq" in m.properties:
        return int(m.properties["seq"])
    head = bytes(m.body[: m.body.index(b";")])
    assert head.startswith(b"seq="), head
    return int(head[4:])


def expected(seed: int, seq: int) -> dict:
    """Every field of message ``seq`` (deterministic; the parent checks reads against it)."""
    d = _digest(seed, seq)
    if is_plain(seq):  # bare and uniform per block: batches and put_async groups of only bare messages
        r = int.from_bytes(d[:8], "little")
        head = f"seq={seq};".encode()
        body = (head + d) * (r % 40 + 1)
        return {
            "topic": PLAIN_TOPIC, "queue_id": 0, "body": body[: len(head) + r % (len(body) - len(head) + 1)],
            "tag": None, "keys": (), "properties": {}, "extra": (), "message_id": "", "message_group": None,
            "born_host": "", "born_timestamp_ms": 1_700_000_000_000 + seq if r & 1 else 0,
            "delivery_time_ms": 0, "protocol": "internal", "reconsume_times": 0,
        }
    r = int.from_bytes(d[:8], "little")
    topic = TOPICS[r % len(TOPICS)]
    queue_id = (r >> 4) % QUEUES
    # Sizes 0..MAX_BODY, biased to include empty and tiny bodies.
    kind = (r >> 8) % 8
    if kind == 0:
        size = 0
    elif kind == 1:
        size = (r >> 12) % 16
    else:
        size = (r >> 12) % (MAX_BODY + 1)
    head = f"seq={seq};".encode()
    pattern = (head + d) * (size // (len(head) + len(d)) + 1)
    body = pattern[:size]
    tag = TAGS[(r >> 24) % len(TAGS)]
    nkeys = (r >> 28) % 4
    keys = tuple([f"k{seq}", f"shared-{seq % 7}", f"kk-{seq}-ß"][:nkeys])
    props = {"seq": str(seq)}
    if (r >> 30) & 1:
        props["uni"] = "värde-" + d[8:12].hex() + "-\u2603"
    if (r >> 31) & 1:
        props["empty"] = ""
    if (r >> 32) % 5 == 0:
        props["long"] = d.hex() * ((r >> 35) % 20 + 1)
    nextra = (r >> 40) % 6
    extra: list[tuple[str, int]] = []
    if nextra >= 4:  # about a third of the messages are multi-dispatched
        for t in FANOUT[: nextra - 2]:
            if t != (topic, queue_id):
                extra.append(t)
    message_id = f"cid-{seed}-{seq}" if (r >> 44) % 5 == 0 else ""
    group = f"g{seq % 3}" if (r >> 47) % 4 == 0 else None
    return {
        "topic": topic,
        "queue_id": queue_id,
        "body": body,
        "tag": tag,
        "keys": keys,
        "properties": props,
        "extra": tuple(extra),
        "message_id": message_id,
        "message_group": group,
        "born_host": "10.0.0.%d:%d" % (seq % 250, 1000 + seq % 50000) if (r >> 50) & 1 else "",
        "born_timestamp_ms": 1_700_000_000_000 + seq,
        "delivery_time_ms": 0 if (r >> 51) % 4 else 1_800_000_000_000 + seq,
        "protocol": ("internal", "mqtt", "amqp", "grpc", "cloudevents")[(r >> 53) % 5],
        "reconsume_times": (r >> 56) % 3,
    }


def targets(e: dict) -> set[tuple[str, int]]:
    return {(e["topic"], e["queue_id"]), *e["extra"]}


def make_message(seed: int, seq: int) -> Message:
    e = expected(seed, seq)
    return Message(
        e["topic"],
        e["body"],
        tag=e["tag"],
        keys=e["keys"],
        properties=dict(e["properties"]),
        message_group=e["message_group"],
        delivery_time_ms=e["delivery_time_ms"],
        born_timestamp_ms=e["born_timestamp_ms"],
        born_host=e["born_host"],
        protocol=e["protocol"],
        message_id=e["message_id"],
        queue_id=e["queue_id"],
        extra_dispatch=[DispatchTarget(t, q) for t, q in e["extra"]],
        reconsume_times=e["reconsume_times"],
    )


class Acker:
    """Writes one ACK line per acknowledged put, whole, straight to fd 1."""

    def __init__(self, limit: int | None) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.limit = limit
        self.done = threading.Event()

    def ack(self, seq: int, r) -> None:
        if r.status != PutStatus.PUT_OK:
            line = json.dumps({"s": seq, "status": r.status.value})
            with self.lock:
                os.write(1, b"NACK " + line.encode() + b"\n")
            return
        line = json.dumps({"s": seq, "q": r.queue_id, "o": r.queue_offset, "id": r.message_id,
                           "p": r.commitlog_offset, "x": list(r.extra_offsets)})
        with self.lock:
            if self.done.is_set():
                return
            os.write(1, b"ACK " + line.encode() + b"\n")
            self.count += 1
            if self.limit is not None and self.count >= self.limit:
                self.done.set()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--flush", default="sync")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--first-seq", type=int, required=True)
    ap.add_argument("--count", type=int, default=None, help="stop cleanly after this many acks")
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--async-tasks", type=int, default=12)
    args = ap.parse_args()
    seed = args.seed

    from core_broker.message_store import MessageStore

    store = MessageStore(make_config(args.data_dir, args.flush))
    store.start()
    info = {"recovered_abnormally": store.recovered_abnormally, "pid": os.getpid()}
    os.write(1, b"READY " + json.dumps(info).encode() + b"\n")

    seqs = itertools.count(args.first_seq)
    seq_lock = threading.Lock()

    blocks = itertools.count(args.first_seq // PLAIN_BLOCK + 1)

    def next_seqs(n: int) -> list[int]:
        with seq_lock:
            out = []
            while len(out) < n:
                s = next(seqs)
                if not is_plain(s):
                    out.append(s)
            return out

    def next_plain_block() -> list[int]:
        with seq_lock:
            b = next(blocks)
            while not is_plain(b * PLAIN_BLOCK):
                b = next(blocks)
            return list(range(b * PLAIN_BLOCK, (b + 1) * PLAIN_BLOCK))

    acker = Acker(args.count)
    errors: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        """A writer thread's target: a failure is kept (printed on stderr, the parent sees the
        exit code) and stops every writer."""

        def run() -> None:
            try:
                body()
            except BaseException as e:
                errors.append(e)
                acker.done.set()

        return run

    def put_acked(batch: list[int]) -> None:
        results = store.put_batch([make_message(seed, s) for s in batch])
        for s, r in zip(batch, results):
            acker.ack(s, r)

    def single_writer() -> None:
        while not acker.done.is_set():
            (seq,) = next_seqs(1)
            acker.ack(seq, store.put(make_message(seed, seq)))

    def batch_writer() -> None:
        n = 0
        while not acker.done.is_set():
            n += 1
            put_acked(next_seqs(2 + n % 7))

    def plain_writer() -> None:
        while not acker.done.is_set():
            put_acked(next_plain_block())

    async def async_task(i: int) -> None:
        n = 0
        while not acker.done.is_set():
            n += 1
            if (i + n) % 13 == 0:  # bare: put_async of a whole block at once (one drain group)
                batch = next_plain_block()
                results = await asyncio.gather(*(store.put_async(make_message(seed, s)) for s in batch))
                for s, r in zip(batch, results):
                    acker.ack(s, r)
            elif (i + n) % 9 == 0:
                batch = next_seqs(1 + n % 4)
                results = await store.put_batch_async([make_message(seed, s) for s in batch])
                for s, r in zip(batch, results):
                    acker.ack(s, r)
            else:
                (seq,) = next_seqs(1)
                acker.ack(seq, await store.put_async(make_message(seed, seq)))

    def async_writer() -> None:
        async def run() -> None:
            await asyncio.gather(*(async_task(i) for i in range(args.async_tasks)))

        asyncio.run(run())

    bodies = [single_writer] * args.threads + [batch_writer, plain_writer, async_writer]
    workers = [threading.Thread(target=guarded(b), daemon=True) for b in bodies]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        import traceback

        for e in errors:
            traceback.print_exception(e)
        os._exit(3)
    store.shutdown()
    os.write(1, b"CLEAN\n")


if __name__ == "__main__":
    main()
