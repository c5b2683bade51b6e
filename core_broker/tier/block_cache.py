"""A bounded, thread-safe LRU of fixed-size blocks of tier objects, with read-ahead.

Why blocks: a pull reads the records of one queue, which lie in order but
interleaved with other queues' records; one ranged GET of a block (1 MiB by
default) serves the next thousand 1 KiB records instead of one GET each. Why
bounded: cold reads of months of data must not grow memory, and must not evict
anything of the hot path either (the page cache holds the local log; this holds
only tier bytes). Why read-ahead: a sequential reader otherwise waits for each
block's GET in turn, and a GET costs about what decoding its records does;
fetching the next blocks while the current ones are decoded hides most of it.
A block being fetched is fetched once: whoever else wants it waits for it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Executor, Future
from typing import Callable, Hashable


class BlockCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, capacity_bytes)
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._blocks: OrderedDict[Hashable, bytes] = OrderedDict()
        self._pending: dict[Hashable, Future[bytes]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, fetch: Callable[[], bytes]) -> bytes:
        """The block ``key``: cached, being fetched (then waited for), or fetched now by ``fetch()``."""
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
                self.hits += 1
                return data
            fut = self._pending.get(key)
            mine = fut is None
            if mine:
                self.misses += 1
                fut = self._pending[key] = Future()
        if mine:
            self._fill(key, fetch, fut)  # type: ignore[arg-type]
        return fut.result()  # type: ignore[union-attr]

    def has(self, key: Hashable) -> bool:
        """``key`` is cached or on its way."""
        with self._lock:
            return key in self._blocks or key in self._pending

    def prefetch(self, key: Hashable, fetch: Callable[[], bytes], executor: Executor) -> None:
        """Fetch ``key`` on ``executor`` unless it is cached or on its way already."""
        with self._lock:
            if key in self._blocks or key in self._pending:
                return
            fut: Future[bytes] = Future()
            self._pending[key] = fut
        try:
            job = executor.submit(self._fill, key, fetch, fut)
        except RuntimeError:  # the executor is shut down: no read-ahead any more
            self._abandon(key, fut)
            return
        # cancelled before it ran (the executor shut down): nobody may wait for it for ever
        job.add_done_callback(lambda j: self._abandon(key, fut) if j.cancelled() else None)

    def _abandon(self, key: Hashable, fut: Future[bytes]) -> None:
        with self._lock:
            if self._pending.get(key) is fut:
                del self._pending[key]
        fut.cancel()

    def _fill(self, key: Hashable, fetch: Callable[[], bytes], fut: Future[bytes]) -> None:
        try:
            data = fetch()
        except BaseException as e:
            with self._lock:
                self._pending.pop(key, None)
            fut.set_exception(e)
            return
        with self._lock:
            self._pending.pop(key, None)
            self._insert(key, data)
        fut.set_result(data)

    def put(self, key: Hashable, data: bytes) -> None:
        """Cache ``data`` as block ``key`` (fetched along with another block), unless it is cached
        or on its way already: its fetcher's answer stands."""
        with self._lock:
            if key not in self._pending:
                self._insert(key, data)

    def _insert(self, key: Hashable, data: bytes) -> None:
        """Under the lock: keep ``data`` as ``key`` (unless there already) and evict the least
        recently used blocks past the capacity."""
        if key not in self._blocks and len(data) <= self.capacity:
            self._blocks[key] = data
            self.size += len(data)
            while self.size > self.capacity:
                _, old = self._blocks.popitem(last=False)
                self.size -= len(old)
