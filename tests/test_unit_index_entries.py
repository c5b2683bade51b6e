"""IndexService.entries_between: what the tier's keys object copies of one segment.

Entries of a file this process filled in log order are found by binary search; a file
that was open across a restart may hold a re-indexed tail out of order and is scanned.
Both must give exactly the entries pointing into the range, each once.
"""

from __future__ import annotations

import random
from pathlib import Path

from core_broker.index_file import IndexService, key_hash


def brute(entries: list[tuple[str, int, int]], lo: int, hi: int) -> list[tuple[int, int, int]]:
    return sorted({(key_hash(k), p, ts) for k, p, ts in entries if lo <= p < hi})


def test_ranges_of_files_filled_in_order(tmp_path: Path) -> None:
    ix = IndexService(tmp_path, slots=64, entries=100)
    ix.load()
    written = []
    for i in range(350):  # several files
        e = (f"k{i % 37}", 1000 + 97 * i, 5000 + i)
        ix.reserve(1)
        ix.put(*e)
        written.append(e)
    assert len(ix.files) >= 4 and all(f.in_order for f in ix.files)
    rnd = random.Random(7)
    for lo, hi in [(0, 10**9), (1000, 1001), (1000 + 97 * 99, 1000 + 97 * 101), (999, 1000), (10**8, 10**9)] + [
        tuple(sorted(rnd.sample(range(0, 40_000), 2))) for _ in range(50)
    ]:
        assert ix.entries_between(lo, hi) == brute(written, lo, hi), (lo, hi)


def test_a_file_reopened_after_a_restart_is_scanned(tmp_path: Path) -> None:
    ix = IndexService(tmp_path, slots=64, entries=1000)
    ix.load()
    written = []
    for i in range(100):
        written.append((f"k{i}", 100 * i, i))
        ix.put(*written[-1])
    ix.close()
    again = IndexService(tmp_path, slots=64, entries=1000)
    again.load()
    assert not again.files[0].in_order
    for i in range(60, 120):  # recovery indexes the tail after the checkpoint again
        written.append((f"k{i}", 100 * i, i))
        again.put(*written[-1])
    for lo, hi in [(0, 10**6), (5000, 7000), (6000, 6001), (11_900, 12_000)]:
        assert again.entries_between(lo, hi) == brute(written, lo, hi), (lo, hi)
    again.close()
