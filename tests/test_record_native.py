"""The compiled batch encoder (core_broker/_recordc.c) against the pure-Python loop.

Two appenders over two temp folders take the same batches, one with the compiled encoder and one
without (``Appender(native=False)``): their commitlog segments, consume-queue files, results
(message ids included) and errors must be identical. The batches mix what the encoder takes (runs
of bare messages) with everything it leaves to Python (properties, keys, tags, FIFO groups, client
ids, extra queues, values the struct packs refuse), bodies of 0 B to 4 MiB, several topics and
queues, segment and queue-file ends. Its CRC32C is compared with the crc32c package's.
"""

from __future__ import annotations

import os
import random
import shutil
import sysconfig
from pathlib import Path

import pytest
from crc32c import crc32c

from core_broker import appender as appender_mod
from core_broker.model import DispatchTarget, Message
from store_helpers import make_appender

NOW = 1_700_000_000_000
FORCED_OFF = os.environ.get("UNIMQ_NO_NATIVE", "") not in ("", "0")
BUILDABLE = shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc")

pytestmark = pytest.mark.skipif(
    FORCED_OFF or (appender_mod.NATIVE_ENCODE is None and not BUILDABLE),
    reason="the compiled encoder is disabled (UNIMQ_NO_NATIVE) or no C compiler was at hand to build it",
)


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """`pip install -e .` builds it (setup.py, optional=True): a missing .so would silently
    leave every test below comparing Python with Python."""
    assert appender_mod.NATIVE_ENCODE is not None


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for sub in ("commitlog", "cq")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


def run_both(tmp_path: Path, batches: list[list[Message]], segment: int = 1 << 20,
             max_size: int = 1 << 20, cq_entries: int = 1000) -> list:
    """Each batch through both appenders; returns the native side's outcomes after checking
    that the two sides' files, results and errors are identical."""
    out = {}
    for native in (True, False):
        root = tmp_path / ("native" if native else "python")
        a = make_appender(root, segment=segment, max_size=max_size, cq_entries=cq_entries, native=native)
        outcomes = []
        for b in batches:
            results: list = []
            try:
                a.append_batch(b, NOW, results)
                outcomes.append(("ok", results))
            except Exception as e:  # the error and the results made before it must agree
                outcomes.append((type(e).__name__, str(e), results))
        out[native] = (outcomes, files(root))
        a.commitlog.close()
        a.index.close()
    assert out[True][0] == out[False][0]
    assert out[True][1].keys() == out[False][1].keys()
    for name in out[True][1]:
        assert out[True][1][name] == out[False][1][name], name
    return out[True][0]


def bare(topic: str, size: int, qid: int = 0, **kw) -> Message:
    return Message(topic, bytes(random.Random(size).randbytes(size)), queue_id=qid, **kw)


def test_uniform_bare_batches(tmp_path: Path) -> None:
    batches = [[bare("t", 1024) for _ in range(128)] for _ in range(4)]
    outcomes = run_both(tmp_path, batches)
    assert all(o[0] == "ok" and len(o[1]) == 128 for o in outcomes)
    ids = [r.message_id for o in outcomes for r in o[1]]
    assert len(set(ids)) == len(ids) and all(i.startswith("0200112233AABBCCDD") for i in ids)


def test_mixed_batches(tmp_path: Path) -> None:
    rnd = random.Random(7)
    sizes = [0, 1, 7, 255, 256, 257, 1000, 1024, 4095, 4096, 4097, 10_000, 65_536, 300_000]
    kinds = [
        lambda t, s, q: bare(t, s, q),
        lambda t, s, q: bare(t, s, q, protocol="mqtt"),
        lambda t, s, q: bare(t, s, q, born_timestamp_ms=12345, delivery_time_ms=NOW + 5, reconsume_times=3),
        lambda t, s, q: bare(t, s, q, flags=0x1 | 0x100),  # a read message re-put: the link bit dropped
        lambda t, s, q: bare(t, s, q, properties={"mqtt_topic": "a/b", "mqtt_qos": "1"}, born_host="1.2.3.4:5"),
        lambda t, s, q: bare(t, s, q, tag="TagA", keys=["k1", "k2"]),
        lambda t, s, q: bare(t, s, q, message_group="g1"),  # FIFO
        lambda t, s, q: bare(t, s, q, message_id=f"client-{rnd.random()}"),
        lambda t, s, q: bare(t, s, q, extra_dispatch=(DispatchTarget("%LMQ%x", 0),), properties={"k": "v"}),
        lambda t, s, q: bare(t, s, q, extra_dispatch=(DispatchTarget("%LMQ%x", 0), DispatchTarget("%LMQ%y", 1))),
    ]
    batches = []
    for _ in range(12):
        batch = []
        for _ in range(rnd.randrange(1, 60)):
            # runs of one queue (what the encoder takes at once) broken at random
            topic, qid = rnd.choice([("t", 0), ("t", 0), ("t", 1), ("u", 0), ("ünï", 2)])
            kind = rnd.choice(kinds[:4]) if rnd.random() < 0.6 else rnd.choice(kinds)
            batch.append(kind(topic, rnd.choice(sizes), qid))
        batches.append(batch)
    outcomes = run_both(tmp_path, batches)
    assert all(o[0] == "ok" for o in outcomes)


def test_segment_and_queue_file_ends(tmp_path: Path) -> None:
    """Runs cut by the segment's end (roll to the next one) and by queue-file ends (made first)."""
    batches = [[bare("t", 3000) for _ in range(200)], [bare("t", 100, qid=1) for _ in range(500)],
               [bare("t", 60_000) for _ in range(40)]]
    outcomes = run_both(tmp_path, batches, segment=256 * 1024, cq_entries=64)
    assert all(o[0] == "ok" for o in outcomes)
    phys = [r.commitlog_offset for o in outcomes for r in o[1]]
    assert max(phys) > 256 * 1024 * 3  # several segments


def test_bodies_up_to_4_mib(tmp_path: Path) -> None:
    mib = 1 << 20
    batches = [[bare("t", s) for s in (0, 4 * mib, 1, mib, mib + 3, 2 * mib)], [bare("big", 4 * mib, 3)]]
    outcomes = run_both(tmp_path, batches, segment=16 * mib, max_size=4 * mib)
    assert all(o[0] == "ok" for o in outcomes)


class Topic(str):
    """A str subclass: equal to the run's topic, but not the exact type the encoder takes."""


@pytest.mark.parametrize(
    "odd",
    [
        {"flags": -1},  # the struct refuses it: the same struct.error on both sides
        {"flags": 1 << 32},
        {"queue_id": True},  # a bool queue id
        {"reconsume_times": 1 << 31},
        {"born_timestamp_ms": None},  # `or now`
        {"delivery_time_ms": 1 << 63},
        {"body": bytearray(b"abc")},
        {"body": memoryview(b"abcdef")},
        {"topic": Topic("t")},
        {"protocol": "amqp"},
        {"properties": {"k": "v\udc80"}},  # a lone surrogate: str.encode() raises on both sides
        {"properties": {"k": b"bytes value"}},
        {"properties": {1: "non-str key"}},
        {"properties": {"k" * 70_000: "a key over u16"}},
        {"properties": {"ünï": "cödé ✓", "k": ""}},
        {"born_host": "hôst:1"},
        {"born_host": b"1.2.3.4:5"},
        {"born_host": "h" * 70_000},
    ],
    ids=lambda d: next(iter(d)) + "=" + type(next(iter(d.values()))).__name__,
)
def test_values_left_to_python(tmp_path: Path, odd: dict) -> None:
    """A message the encoder does not take, amid a run it does, gives the same bytes or error."""
    m = bare("t", 10)
    for k, v in odd.items():
        setattr(m, k, v)
    batches = [[bare("t", 20), bare("t", 30), m, bare("t", 40)], [bare("t", 50)]]
    run_both(tmp_path, batches)


def test_door_batches(tmp_path: Path) -> None:
    """The doors' publishes: properties (some shared, some unique per message) and born hosts."""
    rnd = random.Random(3)
    batches = [
        [Message("t", bytes(100), protocol="http", born_host=f"10.0.0.{i % 3}:1", properties={
            "ce_specversion": "1.0", "ce_type": "com.example", "ce_id": f"evt-{i:08d}"}) for i in range(100)],
        [Message(rnd.choice("tu"), rnd.randbytes(rnd.randrange(0, 9000)), protocol="mqtt",
                 properties={} if rnd.random() < 0.3 else {"mqtt_topic": "a/" * rnd.randrange(5), "q": "1"},
                 born_host="" if rnd.random() < 0.3 else "127.0.0.1:5") for _ in range(200)],
    ]
    outcomes = run_both(tmp_path, batches)
    assert all(o[0] == "ok" for o in outcomes)


def test_too_large_and_refusals(tmp_path: Path) -> None:
    """A body over the limit goes to the single path, which raises after the pending records are
    written: the same records and results on both sides."""
    batches = [[bare("t", 100), bare("t", 5000), bare("t", 100)], [bare("t", 2 * 4096)]]
    outcomes = run_both(tmp_path, batches, max_size=4096)
    assert outcomes[0][0] == "MessageTooLargeError" and len(outcomes[0][2]) == 1


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1024, 1 << 20])
def test_crc32c_matches_the_package(n: int) -> None:
    from core_broker import _recordc

    data = random.Random(n).randbytes(n + 3)
    for v in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
        for view in (data[:n], data[3:]):  # aligned and unaligned starts
            want = crc32c(view, v)
            assert _recordc.crc32c(view, v) == want
            assert _recordc.crc32c_sw(view, v) == want


class PlainMessage(Message):
    """A subclass with an instance dict and one attribute as a property: the encoder reads its
    attributes by getattr (not by slot offset), and must still take it and agree."""

    @property
    def tag(self) -> str:  # type: ignore[override]
        return ""

    @tag.setter
    def tag(self, v: str | None) -> None:
        self.seen_tag = v


def test_message_subclasses(tmp_path: Path) -> None:
    sub = [PlainMessage("t", bytes(100 + i), queue_id=0) for i in range(10)]
    batches = [[bare("t", 10), *sub[:5], bare("t", 20), *sub[5:]]]
    outcomes = run_both(tmp_path, batches)
    assert outcomes[0][0] == "ok" and len(outcomes[0][1]) == 12


class SlotMessage:
    """Not a Message: the same attributes in slots of another order (other offsets)."""

    __slots__ = tuple(reversed(Message.__slots__))

    def __init__(self, topic: str, body: bytes) -> None:
        m = Message(topic, body)
        for name in Message.__slots__:
            setattr(self, name, getattr(m, name))


def test_two_stores_in_two_threads(tmp_path: Path) -> None:
    """A 2 MiB body's CRC runs without the GIL; another store's call meanwhile, on messages of
    another slotted type, resolves other slot offsets: neither may read the other's."""
    import threading

    mib = 1 << 20
    work = {
        "a": [[bare("t", 2 * mib) for _ in range(3)] + [bare("t", 10) for _ in range(50)] for _ in range(4)],
        "b": [[SlotMessage("u", bytes(range(i % 200))) for i in range(200)] for _ in range(20)],
    }  # type: dict[str, list[list]]

    def run(name: str, native: bool, out: dict) -> None:
        a = make_appender(tmp_path / f"{name}-{native}", segment=16 * mib, max_size=4 * mib, native=native)
        out[name] = [a.append_batch(b, NOW) for b in work[name]]
        a.commitlog.close()
        a.index.close()

    got: dict = {}
    threads = [threading.Thread(target=run, args=(n, True, got)) for n in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    want: dict = {}
    for n in work:
        run(n, False, want)
    assert got == want
    for n in work:
        assert files(tmp_path / f"{n}-True") == files(tmp_path / f"{n}-False")
