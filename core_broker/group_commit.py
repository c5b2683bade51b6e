"""Group commit for writers on an event loop under ``--flush sync``.

Many coroutines each storing one message and waiting for its fdatasync would
each take the write lock, register with the flush thread and be woken alone.
Instead, :meth:`GroupCommit.put` queues the message and a future on its loop;
one callback later (:meth:`GroupCommit._drain`) everything queued meanwhile is
written through the appender's batch loop under one lock acquisition, and the
flush thread settles the whole group with one callback on the loop
(``FlushService.notify``) once its fdatasync covers the group's last record.
Each writer still gets its own result or error; a put cancelled before its
group is written is not stored.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable

from .model import Message, PutResult

if TYPE_CHECKING:
    from .appender import Appender
    from .commitlog import CommitLog
    from .flush_service import FlushService

_time = time.time
_get_running_loop = asyncio.get_running_loop
_future_done = asyncio.Future.done  # the C methods: map() calls them without a bound method per future
_future_set_result = asyncio.Future.set_result
_is_done = operator.methodcaller("done")  # any other loop's futures


def _any_done(futs: list[asyncio.Future]) -> bool:
    try:
        return any(map(_future_done, futs))
    except TypeError:  # a loop whose futures are not asyncio.Future
        return any(map(_is_done, futs))


class _PutGroup:
    """The puts queued on one loop since its last drain."""

    __slots__ = ("msgs", "futs")

    def __init__(self) -> None:
        self.msgs: list[Message] = []
        self.futs: list[asyncio.Future] = []


class GroupCommit:
    def __init__(
        self,
        lock: threading.Lock,
        appender: Appender,
        commitlog: CommitLog,
        flush: Callable[[], FlushService | None],
    ) -> None:
        self._lock = lock
        self._appender = appender
        self._commitlog = commitlog
        self._flush = flush  # the store's flush service (made at start)
        self._queues: dict[asyncio.AbstractEventLoop, _PutGroup] = {}

    async def put(self, msg: Message) -> PutResult:
        """Store ``msg`` with the next group of this loop; return once it is flushed."""
        loop = _get_running_loop()
        fut = loop.create_future()
        q = self._queues.get(loop)
        if q is None:
            q = self._queues[loop] = _PutGroup()
            loop.call_soon(self._drain, loop)
        q.msgs.append(msg)
        q.futs.append(fut)
        return await fut

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write the group queued on ``loop``; settle it after the one flush that covers it."""
        q = self._queues.pop(loop, None)
        if q is None:
            return
        msgs, futs = q.msgs, q.futs
        if _any_done(futs):  # a writer was cancelled before its put was written: leave it out
            keep = [i for i, f in enumerate(futs) if not f.done()]
            msgs = [msgs[i] for i in keep]
            futs = [futs[i] for i in keep]
        out: list[PutResult] = []
        now = int(_time() * 1000)
        try:
            with self._lock:
                try:
                    self._appender.append_batch(msgs, now, out)
                except Exception:
                    # Keep what reached the log (below write_pos), then put the rest one by
                    # one, so an error is only the failing message's (or each, if the store's).
                    end = self._commitlog.write_pos
                    k = 0
                    while k < len(out) and out[k].commitlog_offset < end:
                        k += 1
                    del out[k:]
                    written = futs[:k]
                    for msg, fut in zip(msgs[k:], futs[k:]):
                        try:
                            out.append(self._appender.append_one(msg, now))
                            written.append(fut)
                        except Exception as e:
                            fut.set_exception(e)
                    futs = written
            if out:
                r = out[-1]  # written in order under one lock: the last one ends the group
                self._flush().notify(  # type: ignore[union-attr]
                    r.commitlog_offset + r.store_size, loop, lambda exc: self._settle_puts(futs, out, exc)
                )
        except BaseException as e:
            for fut in q.futs:
                if not fut.done():
                    fut.set_exception(e)
            raise

    @staticmethod
    def _settle_puts(futs: list[asyncio.Future], results: list[PutResult], exc: BaseException | None) -> None:
        if exc is None:
            try:  # every writer still waiting: the common case, without a done() call per future
                deque(map(_future_set_result, futs, results), 0)
                return
            except (TypeError, asyncio.InvalidStateError):  # another loop's futures; a cancelled writer
                pass
            for fut, r in zip(futs, results):
                if not fut.done():  # its writer was cancelled after the write
                    fut.set_result(r)
        else:
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
