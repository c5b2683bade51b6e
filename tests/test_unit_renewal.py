"""The gRPC door's auto-renewal of invisibility (push consumers), on its own.

Most tests give the Renewer a broker stand-in that issues a new receipt handle per
renewal and refuses stale handles, the way the broker's pop service does, so the
handle chain and every stop condition are visible. The last test renews a message
popped from a real in-process broker and acks it with the handle the Renewer kept.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from core_broker.errors import BadRequestError
from core_broker.model import Message
from gateway.context import RequestContext
from gateway.grpc.renewal import Renewer

pytestmark = pytest.mark.timeout(30)

CTX = RequestContext(protocol="grpc", client_id="push-1")
OTHER = RequestContext(protocol="grpc", client_id="push-2")


def now_ms() -> int:
    return int(time.time() * 1000)


class Receipts:
    """What the Renewer calls: change_invisible, issuing handle ``h.1``, ``h.2``... and refusing old ones."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str, int]] = []
        self.current: dict[str, str] = {}  # first handle -> the newest one
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def change_invisible(self, ctx: RequestContext, group: str, topic: str, handle: str,
                               invisible_ms: int) -> tuple[str, int]:
        self.calls.append((ctx.client_id, group, topic, handle, invisible_ms))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        root = handle.split(".")[0]
        if self.current.get(root, root) != handle:
            raise BadRequestError(f"receipt handle {handle} is stale")
        n = int(handle.split(".")[1]) + 1 if "." in handle else 1
        new = f"{root}.{n}"
        self.current[root] = new
        return new, now_ms() + invisible_ms


class Clients:
    def __init__(self, *alive: str) -> None:
        self.alive = set(alive)

    def __call__(self, client_id: str) -> bool:
        return client_id in self.alive


def renewer(broker: Receipts, clients: Clients | None = None, **kw) -> Renewer:
    kw.setdefault("invisible_ms", 60_000)
    kw.setdefault("renew_ahead_ms", 10_000)
    return Renewer(broker, clients or Clients("push-1", "push-2"), **kw)  # type: ignore[arg-type]


async def test_a_message_about_to_become_visible_is_renewed_with_the_newest_handle() -> None:
    b = Receipts()
    r = renewer(b, invisible_ms=45_000)
    r.hold(CTX, "g", "t", "h", visible_at_ms=now_ms() + 5_000)  # within renew_ahead
    await r.renew_due()
    assert b.calls == [("push-1", "g", "t", "h", 45_000)]
    assert r.held["h"].handle == "h.1"
    assert r.held["h"].visible_at_ms > now_ms() + 30_000
    assert await r.release("h") == "h.1"  # the client acks with "h": the broker needs "h.1"
    assert r.held == {}
    await r.renew_due()
    assert len(b.calls) == 1  # released: no more renewals


async def test_a_message_not_yet_near_its_visibility_is_left_alone() -> None:
    b = Receipts()
    r = renewer(b)
    r.hold(CTX, "g", "t", "h", visible_at_ms=now_ms() + 50_000)
    await r.renew_due()
    assert b.calls == [] and r.held["h"].handle == "h"


async def test_each_renewal_uses_the_handle_the_last_one_returned() -> None:
    b = Receipts()
    r = renewer(b, invisible_ms=1_000)  # shorter than renew_ahead: due again at once
    r.hold(CTX, "g", "t", "h", visible_at_ms=now_ms())
    for _ in range(3):
        await r.renew_due()
    assert [c[3] for c in b.calls] == ["h", "h.1", "h.2"]
    assert await r.release("h") == "h.3"


async def test_renewal_stops_when_the_client_is_gone() -> None:
    b = Receipts()
    clients = Clients("push-1", "push-2")
    r = renewer(b, clients)
    r.hold(CTX, "g", "t", "h1", visible_at_ms=now_ms())
    r.hold(OTHER, "g", "t", "h2", visible_at_ms=now_ms())
    clients.alive.discard("push-1")
    await r.renew_due()
    assert [c[3] for c in b.calls] == ["h2"]
    assert set(r.held) == {"h2"}  # h1 becomes visible again and is redelivered


async def test_renewal_stops_after_max_renew() -> None:
    b = Receipts()
    r = renewer(b, max_renew_ms=0)
    r.hold(CTX, "g", "t", "h", visible_at_ms=now_ms())
    await r.renew_due()
    assert b.calls == [] and r.held == {}


async def test_a_handle_the_broker_refuses_is_no_longer_renewed_and_others_go_on() -> None:
    b = Receipts()
    b.current["h1"] = "h1.5"  # acked or redelivered through another path meanwhile
    r = renewer(b)
    r.hold(CTX, "g", "t", "h1", visible_at_ms=now_ms())
    r.hold(CTX, "g", "t", "h2", visible_at_ms=now_ms())
    await r.renew_due()
    assert set(r.held) == {"h2"} and r.held["h2"].handle == "h2.1"
    assert await r.release("h1") == "h1"  # not held: the client's own handle


async def test_release_of_a_handle_never_held_returns_it() -> None:
    assert await renewer(Receipts()).release("unknown") == "unknown"


async def test_release_waits_for_a_renewal_in_flight_and_returns_its_handle() -> None:
    b = Receipts()
    b.gate = asyncio.Event()
    r = renewer(b)
    r.hold(CTX, "g", "t", "h", visible_at_ms=now_ms())
    renewing = asyncio.create_task(r.renew_due())
    await asyncio.wait_for(b.entered.wait(), 5)
    releasing = asyncio.create_task(r.release("h"))  # the client acks while the broker renews
    for _ in range(5):
        await asyncio.sleep(0)
    assert not releasing.done(), "release must not hand out a handle a renewal is replacing"
    b.gate.set()
    assert await asyncio.wait_for(releasing, 5) == "h.1"
    await asyncio.wait_for(renewing, 5)


async def test_the_started_renewer_renews_by_itself_and_stop_forgets_everything() -> None:
    b = Receipts()
    r = renewer(b, interval_s=0.02)
    r.start()
    try:
        r.hold(CTX, "g", "t", "h", visible_at_ms=now_ms())
        await asyncio.wait_for(b.entered.wait(), 10)
        assert b.calls[0][3] == "h"
    finally:
        await r.stop()
    assert r.held == {}


# --------------------------------------------------------------------------- against a real broker


async def test_a_renewed_message_is_acked_with_the_handle_the_renewer_kept(tmp_path: Path) -> None:
    from gateway.deployment import merged_processor
    from processor_fixtures import broker_config, processor_config, store_config

    sc = store_config(tmp_path / "data")
    p = merged_processor(sc, broker_config(), processor_config(sc))
    await p.start()
    try:
        ctx = RequestContext(protocol="grpc", client_id="push-real")
        await p.send(ctx, [Message("renew-topic", b"slow work", queue_id=0)])
        popped = await p.pop(ctx, "g", "renew-topic", max_count=1, invisible_ms=60_000)
        assert len(popped) == 1
        first = popped[0].receipt_handle
        r = Renewer(p, lambda cid: True, invisible_ms=60_000, renew_ahead_ms=10 * 60_000)
        r.hold(ctx, "g", "renew-topic", first, popped[0].invisible_until_ms)
        await r.renew_due()
        newest = r.held[first].handle
        assert newest != first  # the broker issued a new handle
        assert await r.release(first) == newest
        await p.ack(ctx, "g", "renew-topic", newest)
        assert await p.pop(ctx, "g", "renew-topic", max_count=1, invisible_ms=1_000) == []
    finally:
        await p.stop()
