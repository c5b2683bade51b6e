"""A bounded, thread-safe LRU of fixed-size blocks of tier objects.

Why blocks: a pull reads the records of one queue, which lie in order but
interleaved with other queues' records; one ranged GET of a block (1 MiB by
default) serves the next thousand 1 KiB records instead of one GET each. Why
bounded: cold reads of months of data must not grow memory, and must not evict
anything of the hot path either (the page cache holds the local log; this holds
only tier bytes). Several read workers may ask for the same block: the cache
is a dict under a lock; two workers missing the same block both fetch it (the
second store is harmless), which is simpler than per-block futures.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable


class BlockCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, capacity_bytes)
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._blocks: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, fetch: Callable[[], bytes]) -> bytes:
        """The block ``key``, from the cache or from ``fetch()`` (called without the lock)."""
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
                self.hits += 1
                return data
            self.misses += 1
        data = fetch()
        with self._lock:
            if key not in self._blocks and len(data) <= self.capacity:
                self._blocks[key] = data
                self.size += len(data)
                while self.size > self.capacity:
                    _, old = self._blocks.popitem(last=False)
                    self.size -= len(old)
        return data

    def discard(self, prefix: Hashable) -> None:
        """Forget every block whose key starts with ``prefix`` (a segment that left the tier)."""
        with self._lock:
            for k in [k for k in self._blocks if isinstance(k, tuple) and k[0] == prefix]:
                self.size -= len(self._blocks.pop(k))
