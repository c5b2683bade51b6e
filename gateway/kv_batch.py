"""Group commit of door state: many keys' writes (and reads) in one processor call.

Why: a fleet of devices reconnects at once after a network blip, and every MQTT
CONNECT with a persistent session reads its record (is it held elsewhere?) and
writes it (owner, online). One ``kv_put`` per CONNECT is one call per broker per
device, each with its own frame, task and journal wait; at thousands a second the
calls, not the bytes, are the cost. Here every write (and read) asked while one is
on its way joins the next batch, sent as one ``kv_put_many`` (``kv_get_many``): one
call per broker and one wait for durability for all of them - the store's own group
commit, one level up. No timer: a lone write goes at once; under a storm batches
grow with the load.

Rules:

- A write's value is *rendered* when its batch is sent (the newest state, not the
  state when asked), and a key written again before that is written once, in its
  newest form; every caller of it is answered when that write is durable (or gets
  its error). A render may return :data:`SKIP` (nothing to write any more: the
  record moved to another owner meanwhile).
- One batch of writes is on its way at a time, so writes of one key reach the
  brokers in the order they were asked (and their versions grow in that order).
- A read of a key with a write queued or on its way here waits for that write
  first: a gateway reads its own writes.
- A *create* (``kv_create_many``: written only where the brokers hold nothing of the
  key, older than any write) goes in batches of its own; one of a key this gateway is
  writing or creating already is refused at once (the caller reads the key instead).

Hand-written: the batching is twenty lines around the processor's two calls, and the
rules above are door-state specific.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from .api import MessagingAPI
from .context import RequestContext

__all__ = ["KvBatcher", "SKIP", "MAX_BATCH"]

_Creates = dict[str, tuple[bytes, "asyncio.Future[bool]"]]

SKIP: Any = object()  # a render's "nothing to write"
MAX_BATCH = 1024  # keys per call: bounds a frame (and one broker's pause) under any storm

Render = Callable[[], Any]  # -> bytes (the value), None (delete) or SKIP


class KvBatcher:
    """Batched ``kv_put`` / ``kv_get`` of one door-state namespace (see the module doc)."""

    __slots__ = ("processor", "ctx", "namespace", "writer", "_writes", "_sending", "_reads", "_writer", "_reader",
                 "_creates", "_creating", "_creator", "batches", "keys_written", "keys_created")

    def __init__(self, processor: MessagingAPI, ctx: RequestContext, namespace: str) -> None:
        self.processor = processor
        self.ctx = ctx
        self.namespace = namespace
        self.writer = ""  # the door's id in the door-state feed (it is not sent its own writes back)
        # each caller has a future of its own (no shared future a caller's cancel would end for all)
        self._writes: dict[str, tuple[Render, list[asyncio.Future[None]]]] = {}  # queued, in order asked
        self._sending: dict[str, list[asyncio.Future[None]]] = {}  # the batch on its way
        self._reads: dict[str, list[asyncio.Future[bytes | None]]] = {}
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._creates: _Creates = {}  # queued creates: key -> (value, its caller's future)
        self._creating: _Creates = {}  # the batch of creates on its way
        self._creator: asyncio.Task[None] | None = None
        self.batches = 0  # write calls made (tests and metrics: how well writes were grouped)
        self.keys_written = 0
        self.keys_created = 0

    def write(self, key: str, render: Render) -> asyncio.Future[None]:
        """Queue a write of ``key`` (its value from ``render()`` when sent); the future, the
        caller's own (await it directly: a cancel ends only this caller's wait), is done when
        the write is durable."""
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        w = self._writes.get(key)
        if w is not None:
            w[1].append(f)
            self._writes[key] = (render, w[1])  # written once, in its newest form
            return f
        self._writes[key] = (render, [f])
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        return f

    def create(self, key: str, value: bytes) -> asyncio.Future[bool]:
        """Queue a create of ``key`` with ``value``; the future (the caller's own) is True once
        that is durable on every broker that answered, False when refused (a broker held
        something of the key, or this gateway is writing it: read it and go on from there)."""
        loop = asyncio.get_running_loop()
        f: asyncio.Future[bool] = loop.create_future()
        if key in self._creates or key in self._creating or key in self._writes or key in self._sending:
            f.set_result(False)
            return f
        self._creates[key] = (value, f)
        if self._creator is None:
            self._creator = loop.create_task(self._create_loop())
        return f

    async def read(self, key: str) -> bytes | None:
        """``key``'s value as the brokers hold it, after this gateway's own writes of it."""
        w = self._writes.get(key)
        pending = w[1] if w is not None else self._sending.get(key)
        if pending is not None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending.append(done)
            try:
                await done
            except Exception:  # failed: the brokers hold what they hold
                pass
        f: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        waiting = self._reads.get(key)
        if waiting is None:
            self._reads[key] = [f]
            if self._reader is None:
                self._reader = asyncio.get_running_loop().create_task(self._read_loop())
        else:
            waiting.append(f)
        return await f

    async def _write_loop(self) -> None:
        try:
            while self._writes:
                keys = list(self._writes)[:MAX_BATCH]
                items: dict[str, bytes | None] = {}
                for key in keys:
                    render, fs = self._writes.pop(key)
                    try:
                        value = render()
                    except Exception as e:  # that record only
                        _fail(fs, e)
                        continue
                    if value is SKIP:
                        _done(fs, None)
                        continue
                    items[key] = value
                    self._sending[key] = fs
                if not items:
                    continue
                self.batches += 1
                self.keys_written += len(items)
                try:
                    await self.processor.kv_put_many(self.ctx, self.namespace, items, self.writer)
                except Exception as e:
                    for fs in self._sending.values():
                        _fail(fs, e)
                else:
                    for fs in self._sending.values():
                        _done(fs, None)
                finally:
                    self._sending.clear()
        finally:
            self._writer = None

    async def _create_loop(self) -> None:
        try:
            while self._creates:
                batch = self._creating
                creates = self._creates
                for key in list(creates)[:MAX_BATCH]:
                    batch[key] = creates.pop(key)
                self.keys_created += len(batch)
                try:
                    refused = await self.processor.kv_create_many(self.ctx, self.namespace,
                                                                  {k: v for k, (v, _) in batch.items()}, self.writer)
                except Exception as e:
                    _fail([f for _, f in batch.values()], e)
                else:
                    for key, (_, f) in batch.items():
                        if not f.done():
                            f.set_result(key not in refused)
                finally:
                    batch.clear()
        finally:
            self._creator = None

    async def _read_loop(self) -> None:
        try:
            while self._reads:
                keys = list(self._reads)[:MAX_BATCH]
                waiting = [self._reads.pop(k) for k in keys]
                try:
                    values = await self.processor.kv_get_many(self.ctx, self.namespace, keys)
                except Exception as e:
                    for fs in waiting:
                        _fail(fs, e)
                    continue
                for k, fs in zip(keys, waiting):
                    _done(fs, values.get(k))
        finally:
            self._reader = None


def _done(fs: list[asyncio.Future[Any]], value: Any) -> None:
    for f in fs:
        if not f.done():
            f.set_result(value)


def _fail(fs: list[asyncio.Future[Any]], e: BaseException) -> None:
    for f in fs:
        if not f.done():
            f.set_exception(e)
