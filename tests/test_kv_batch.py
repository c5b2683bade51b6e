"""Group commit of door state (gateway/kv_batch.py) against a real processor and store.

What must hold: writes asked together go in fewer calls than writes and every one is
stored; a record written again before its batch left is written once, in its newest
form; a render saying SKIP writes nothing; a read sees this gateway's own queued write;
a failed call fails exactly its callers; the values survive a restart of the store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.auth import Action, Resource, forbidden
from gateway.context import RequestContext
from gateway.kv_batch import SKIP, KvBatcher
from mqtt_fixtures import in_process_processor, processor  # noqa: F401 - the fixture

NS = "test.batch"
CTX = RequestContext(protocol="test", client_id="batch", trusted=True)


async def test_a_storm_of_writes_goes_in_few_calls_and_all_are_stored(processor: Any) -> None:  # noqa: F811
    b = KvBatcher(processor, CTX, NS)
    n = 3000
    await asyncio.gather(*(asyncio.shield(b.write(f"k{i}", lambda i=i: f"v{i}".encode())) for i in range(n)))
    assert b.keys_written == n
    assert b.batches < n / 10, b.batches  # asked together: grouped
    got = await processor.kv_get_many(CTX, NS, [f"k{i}" for i in range(n)])
    assert got == {f"k{i}": f"v{i}".encode() for i in range(n)}
    assert await processor.kv_get(CTX, NS, "k7") == b"v7"


async def test_the_newest_render_wins_and_skip_writes_nothing(processor: Any) -> None:  # noqa: F811
    b = KvBatcher(processor, CTX, NS)
    await processor.kv_put(CTX, NS, "kept", b"before")
    first = b.write("a", lambda: b"old")
    second = b.write("a", lambda: b"new")
    skipped = b.write("kept", lambda: SKIP)
    deleted = b.write("gone", lambda: None)
    await asyncio.gather(first, second, skipped, deleted)  # one write of "a" answers both its callers
    assert await processor.kv_get(CTX, NS, "a") == b"new"
    assert await processor.kv_get(CTX, NS, "kept") == b"before"
    assert await processor.kv_get(CTX, NS, "gone") is None
    assert b.keys_written == 2


async def test_a_read_sees_the_gateways_own_queued_write(processor: Any) -> None:  # noqa: F811
    b = KvBatcher(processor, CTX, NS)
    await processor.kv_put(CTX, NS, "r", b"stored")
    b.write("r", lambda: b"mine")
    reads = await asyncio.gather(*(b.read(k) for k in ("r", "r", "nothing")))
    assert reads == [b"mine", b"mine", None]


async def test_a_failed_call_fails_its_callers_and_the_next_batch_goes_on(processor: Any) -> None:  # noqa: F811
    class DenyOne:
        deny = True

        def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
            if self.deny and resource == Resource.DOOR_STATE and not ctx.trusted:
                raise forbidden(ctx, action, resource, name)

    auth = DenyOne()
    processor.set_authorizer(auth)
    b = KvBatcher(processor, RequestContext(protocol="test", client_id="untrusted"), NS)
    with pytest.raises(Exception) as e:
        await asyncio.shield(b.write("x", lambda: b"1"))
    assert getattr(e.value, "code", "") == "FORBIDDEN"
    with pytest.raises(Exception):
        await b.read("x")
    auth.deny = False
    await asyncio.shield(b.write("x", lambda: b"2"))
    assert await b.read("x") == b"2"


async def test_batched_writes_survive_a_restart(tmp_path: Any) -> None:
    p = await in_process_processor(tmp_path)
    b = KvBatcher(p, CTX, NS)
    await asyncio.gather(*(asyncio.shield(b.write(f"d{i}", lambda i=i: bytes([i % 256]) * 3)) for i in range(500)))
    await p.stop()
    p = await in_process_processor(tmp_path)
    try:
        items = await p.kv_items(CTX, NS)
        assert items == {f"d{i}": bytes([i % 256]) * 3 for i in range(500)}
    finally:
        await p.stop()


async def test_a_cancelled_caller_stops_only_its_own_wait(processor: Any) -> None:  # noqa: F811
    b = KvBatcher(processor, CTX, NS)
    gone = asyncio.ensure_future(b.write("shared", lambda: b"v1"))
    kept = b.write("shared", lambda: b"v2")  # the same write, asked again before it left
    reader_gone = asyncio.ensure_future(b.read("shared"))
    reader_kept = asyncio.ensure_future(b.read("shared"))
    gone.cancel()
    reader_gone.cancel()
    await asyncio.wait_for(kept, 10)  # not cancelled with the other caller's wait
    assert await asyncio.wait_for(reader_kept, 10) == b"v2"
    assert reader_gone.cancelled() and b.keys_written == 1
