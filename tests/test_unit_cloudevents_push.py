"""Unit tests of adapters.cloudevents.push: subscription validation, filters and the delivery state machine.

Why: push delivery promises at-least-once (ack only after a 2xx), retries with
backoff under ``change_invisible`` and dead-lettering after ``max_attempts``
(module docstring). The module under test runs for real, POSTing to a real
webhook on 127.0.0.1; only the messaging processor it calls is a small
recording stand-in, so each decision (ack / change_invisible / forward_to_dlq)
is observable.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.cloudevents import push
from core_broker.errors import TopicNotFoundError
from core_broker.model import StoredMessage
from core_broker.pop_service import PoppedMessage
from gateway.trace import Tracer

pytestmark = pytest.mark.timeout(30)


# ------------------------------------------------------------------------------ pure rules


def test_normalize_fills_defaults() -> None:
    sub = push.normalize({"topic": "t", "sink": "http://127.0.0.1:1/hook"}, [])
    assert sub["topic"] == "t" and sub["protocol"] == "HTTP" and sub["group"] is None
    assert sub["filters"] == [] and sub["mode"] == "binary" and sub["start"] == "latest"
    for k in push.LIMITS:
        assert sub[k] == push.DEFAULTS[k]
    assert isinstance(sub["timeout_s"], float)


@pytest.mark.parametrize(
    "spec",
    [
        {"sink": "http://h/x"},
        {"topic": "", "sink": "http://h/x"},
        {"topic": "t"},
        {"topic": "t", "sink": "ftp://h/x"},
        {"topic": "t", "sink": "/relative"},
        {"topic": "t", "sink": "http://h:notaport/x"},
        {"topic": "t", "sink": "http://h/x", "protocol": "MQTT"},
        {"topic": "t", "sink": "http://h/x", "group": "%sys"},
        {"topic": "t", "sink": "http://h/x", "group": ""},
        {"topic": "t", "sink": "http://h/x", "group": "a\x01b"},
        {"topic": "t", "sink": "http://h/x", "group": "g" * 201},
        {"topic": "t", "sink": "http://h/x", "filters": {"exact": {"a": "b"}}},
        {"topic": "t", "sink": "http://h/x", "mode": "batch"},
        {"topic": "t", "sink": "http://h/x", "start": "middle"},
        {"topic": "t", "sink": "http://h/x", "max_attempts": 0},
        {"topic": "t", "sink": "http://h/x", "max_attempts": 101},
        {"topic": "t", "sink": "http://h/x", "max_attempts": True},
        {"topic": "t", "sink": "http://h/x", "timeout_s": "5"},
        {"topic": "t", "sink": "http://h/x", "initial_backoff_ms": 1000, "max_backoff_ms": 999},
    ],
)
def test_normalize_rejects(spec: dict) -> None:
    with pytest.raises(push.SubscriptionError):
        push.normalize(spec, [])


def test_allowed_hosts() -> None:
    spec = {"topic": "t", "sink": "http://evil.example/x"}
    with pytest.raises(push.SubscriptionError, match="not allowed"):
        push.normalize(spec, ["127.0.0.1"])
    assert push.normalize(spec, ["*"])["sink"] == spec["sink"]
    assert push.normalize({"topic": "t", "sink": "http://127.0.0.1:9/x"}, ["127.0.0.1"])


def test_subscription_error_is_a_bad_request() -> None:
    from core_broker.errors import BadRequestError

    assert issubclass(push.SubscriptionError, BadRequestError)
    assert push.SubscriptionError.code == "INVALID_SUBSCRIPTION"


@pytest.mark.parametrize(
    "f",
    [
        {},
        {"exact": {"a": "b"}, "prefix": {"a": "b"}},
        {"exact": {}},
        {"exact": {"a": 1}},
        {"prefix": ["a"]},
        {"all": []},
        {"any": {"exact": {"a": "b"}}},
        {"all": [{"bogus": {}}]},
        {"not": {"sql": "a = 'b'"}},
        {"sql": "type = 'x'"},
        {"regex": {"a": ".*"}},
        "exact",
    ],
)
def test_validate_filter_rejects(f: Any) -> None:
    with pytest.raises(push.SubscriptionError):
        push.validate_filter(f)


def test_matches_dialects() -> None:
    attrs = {"type": "com.example.order.created", "source": "/shop/eu", "subject": "o-1"}
    assert push.matches({"exact": {"type": "com.example.order.created"}}, attrs)
    assert not push.matches({"exact": {"type": "com.example.order"}}, attrs)
    assert not push.matches({"exact": {"missing": ""}}, attrs)
    assert push.matches({"prefix": {"type": "com.example."}}, attrs)
    assert not push.matches({"prefix": {"nope": ""}}, attrs)  # absent attribute never matches
    assert push.matches({"suffix": {"source": "/eu"}}, attrs)
    assert not push.matches({"suffix": {"source": "/us"}}, attrs)
    assert push.matches({"prefix": {"type": "com.", "source": "/shop"}}, attrs)
    assert not push.matches({"prefix": {"type": "com.", "source": "/x"}}, attrs)  # all keys must hold
    both = {"all": [{"prefix": {"type": "com."}}, {"exact": {"subject": "o-1"}}]}
    assert push.matches(both, attrs)
    assert not push.matches({"all": [{"prefix": {"type": "com."}}, {"exact": {"subject": "o-2"}}]}, attrs)
    assert push.matches({"any": [{"exact": {"subject": "o-2"}}, {"exact": {"subject": "o-1"}}]}, attrs)
    assert not push.matches({"any": [{"exact": {"subject": "o-2"}}]}, attrs)
    assert push.matches({"not": {"exact": {"subject": "o-2"}}}, attrs)
    assert not push.matches({"not": both}, attrs)
    push.validate_filter({"not": {"any": [both, {"suffix": {"x": "y"}}]}})


# ------------------------------------------------------------------------------ a real webhook


class Webhook:
    """A minimal HTTP/1.1 server on 127.0.0.1: answers each request with the next status in ``statuses``."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.got = asyncio.Event()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def __aenter__(self) -> "Webhook":
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await r.readline()
                if not line:
                    return
                headers: dict[str, str] = {}
                while True:
                    h = await r.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await r.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((line.decode("latin-1").strip(), headers, body))
                status = self.statuses.pop(0) if self.statuses else 200
                w.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
                await w.drain()
                self.got.set()
                return
        finally:
            w.close()


class Processor:
    """Records what the push runner decides; pops each given message once, then blocks like a long poll."""

    def __init__(self, popped: list[PoppedMessage] | None = None, topic_exists: bool = True) -> None:
        self.popped = list(popped or [])
        self.calls: list[tuple[Any, ...]] = []
        self.done = asyncio.Event()
        self.kv: dict[str, bytes] = {}
        self.topic_exists = topic_exists
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.tracer = Tracer.off()

    async def pop(self, ctx: Any, group: str, topic: str, n: int, lease_ms: int, **kw: Any) -> list[PoppedMessage]:
        self.calls.append(("pop", group, topic, n, kw.get("from_latest")))
        if self.popped:
            out, self.popped = self.popped[:n], self.popped[n:]
            return out
        await asyncio.sleep(3600)
        return []

    async def ack(self, ctx: Any, group: str, topic: str, handle: str) -> None:
        self.calls.append(("ack", group, topic, handle))
        self.done.set()

    async def forward_to_dlq(self, ctx: Any, group: str, topic: str, handle: str) -> None:
        self.calls.append(("dlq", group, topic, handle))
        self.done.set()

    async def change_invisible(self, ctx: Any, group: str, topic: str, handle: str, ms: int) -> tuple[str, int]:
        self.calls.append(("invisible", handle, ms))
        return handle + "'", 0

    async def kv_items(self, ctx: Any, ns: str) -> dict[str, bytes]:
        assert ns == push.KV_NAMESPACE
        return dict(self.kv)

    async def kv_put(self, ctx: Any, ns: str, key: str, value: bytes | None) -> None:
        assert ns == push.KV_NAMESPACE
        if value is None:
            self.kv.pop(key, None)
        else:
            self.kv[key] = value

    async def describe_topic(self, ctx: Any, topic: str) -> Any:
        if not self.topic_exists:
            raise TopicNotFoundError(topic)
        return SimpleNamespace(queues=[SimpleNamespace(queue_id=0, max_offset=7), SimpleNamespace(queue_id=1, max_offset=3)])

    async def create_topic(self, ctx: Any, topic: str, exist_ok: bool = False) -> None:
        self.calls.append(("create_topic", topic))
        self.topic_exists = True

    async def get_offset(self, ctx: Any, group: str, topic: str, qid: int) -> int | None:
        return self.offsets.get((group, topic, qid))

    async def commit_offset(self, ctx: Any, group: str, topic: str, qid: int, off: int) -> None:
        self.offsets[(group, topic, qid)] = off

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls if c[0] != "pop"]


def _popped(attempt: int = 1, **props: str) -> PoppedMessage:
    m = StoredMessage("orders", b'{"n":1}', properties=dict(props), protocol="http", message_id="MID1",
                      born_timestamp_ms=1_700_000_000_000)
    return PoppedMessage(m, "RH", attempt, 0)


async def _run(proc: Processor, spec: dict[str, Any]) -> push.PushManager:
    mgr = push.PushManager(proc)  # type: ignore[arg-type]
    await mgr.start()
    await mgr.create(spec)
    await asyncio.wait_for(proc.done.wait(), 20)
    await mgr.stop()
    return mgr


def _spec(url: str, **kw: Any) -> dict[str, Any]:
    return {"topic": "orders", "sink": url, "group": "g", "initial_backoff_ms": 1, "max_backoff_ms": 4, **kw}


async def test_2xx_is_acked_once_binary_mode() -> None:
    async with Webhook([204]) as hook:
        proc = Processor([_popped(color="red")])
        mgr = await _run(proc, _spec(hook.url))
    assert proc.kinds() == ["ack"]
    assert proc.calls[-1] == ("ack", "g", "orders", "RH")
    assert len(hook.requests) == 1
    line, headers, body = hook.requests[0]
    assert line.startswith("POST /hook")
    assert body == b'{"n":1}'  # binary mode: the stored bytes
    assert headers["ce-id"] == "MID1" and headers["ce-specversion"] == "1.0"
    sid = next(iter(mgr.subs))
    assert mgr.stats[(sid, "delivered")] == 1 and mgr.stats[(sid, "failed_attempt")] == 0


async def test_structured_mode_sends_a_cloudevent_json() -> None:
    async with Webhook([200]) as hook:
        proc = Processor([_popped()])
        await _run(proc, _spec(hook.url, mode="structured"))
    _, headers, body = hook.requests[0]
    assert headers["content-type"].startswith("application/cloudevents+json")
    ev = json.loads(body)
    assert ev["id"] == "MID1" and ev["specversion"] == "1.0"


async def test_failures_are_retried_with_growing_backoff_then_acked() -> None:
    async with Webhook([500, 404, 302, 200]) as hook:
        proc = Processor([_popped()])
        mgr = await _run(proc, _spec(hook.url, initial_backoff_ms=2, max_backoff_ms=5, max_attempts=10))
    assert proc.kinds() == ["invisible", "invisible", "invisible", "ack"]
    assert len(hook.requests) == 4
    lease = int(push.DEFAULTS["timeout_s"] * 1000) + 10_000
    delays = [c[2] - lease for c in proc.calls if c[0] == "invisible"]
    # 2, 4, 5 (capped) ms, each within the +-10 % jitter (rounded down)
    assert 1 <= delays[0] <= 2 and 3 <= delays[1] <= 4 and 4 <= delays[2] <= 5
    handles = [c[1] for c in proc.calls if c[0] == "invisible"]
    assert handles == ["RH", "RH'", "RH''"]  # each retry uses the renewed receipt handle
    assert proc.calls[-1] == ("ack", "g", "orders", "RH'''")
    sid = next(iter(mgr.subs))
    assert mgr.stats[(sid, "failed_attempt")] == 3 and mgr.stats[(sid, "delivered")] == 1


async def test_dead_lettered_after_max_attempts() -> None:
    async with Webhook([500] * 10) as hook:
        proc = Processor([_popped()])
        mgr = await _run(proc, _spec(hook.url, max_attempts=3))
    assert proc.kinds() == ["invisible", "invisible", "dlq"]
    assert len(hook.requests) == 3
    sid = next(iter(mgr.subs))
    assert mgr.stats[(sid, "dead_lettered")] == 1
    assert "ack" not in proc.kinds()


async def test_attempts_count_from_the_delivery_attempt_of_the_pop() -> None:
    async with Webhook([500] * 10) as hook:
        proc = Processor([_popped(attempt=3)])
        await _run(proc, _spec(hook.url, max_attempts=3))
    assert proc.kinds() == ["dlq"]  # already the third attempt: no further retry
    assert len(hook.requests) == 1


async def test_connection_error_counts_as_failure() -> None:
    async with Webhook([]) as hook:
        url = hook.url
    # the server is closed: nothing listens on the port any more
    proc = Processor([_popped()])
    await _run(proc, _spec(url, max_attempts=2))
    assert proc.kinds() == ["invisible", "dlq"]


async def test_filtered_out_message_is_acked_without_delivery() -> None:
    async with Webhook([200]) as hook:
        proc = Processor([_popped()])
        mgr = await _run(proc, _spec(hook.url, filters=[{"exact": {"type": "never"}}]))
    assert proc.kinds() == ["ack"]
    assert hook.requests == []
    sid = next(iter(mgr.subs))
    assert mgr.stats[(sid, "filtered")] == 1


async def test_create_persists_places_latest_cursors_and_delete_removes() -> None:
    proc = Processor(topic_exists=False)
    mgr = push.PushManager(proc, ["127.0.0.1"])  # type: ignore[arg-type]
    sub = await mgr.create({"topic": "orders", "sink": "http://127.0.0.1:9/x"})
    assert ("create_topic", "orders") in proc.calls  # a missing topic is created
    assert sub["group"] == f"push-{sub['id']}"
    assert json.loads(proc.kv[sub["id"]]) == sub
    assert proc.offsets == {(sub["group"], "orders", 0): 7, (sub["group"], "orders", 1): 3}
    assert mgr.get(sub["id"]) is sub and mgr.list() == [sub]
    assert mgr.runners == {}  # not started: nothing delivers yet
    await mgr.delete(sub["id"])
    assert proc.kv == {} and mgr.list() == []
    with pytest.raises(push.SubscriptionNotFoundError):
        mgr.get(sub["id"])
    with pytest.raises(push.SubscriptionNotFoundError):
        await mgr.delete(sub["id"])


async def test_earliest_leaves_cursors_alone_and_existing_offsets_are_kept() -> None:
    proc = Processor()
    proc.offsets[("g", "orders", 0)] = 2
    mgr = push.PushManager(proc)  # type: ignore[arg-type]
    await mgr.create({"topic": "orders", "sink": "http://h/x", "group": "g2", "start": "earliest"})
    assert proc.offsets == {("g", "orders", 0): 2}
    await mgr.create({"topic": "orders", "sink": "http://h/x", "group": "g"})
    assert proc.offsets == {("g", "orders", 0): 2, ("g", "orders", 1): 3}


async def test_start_resumes_stored_subscriptions_and_skips_unreadable() -> None:
    async with Webhook([200]) as hook:
        proc = Processor([_popped()])
        sub = push.normalize(_spec(hook.url), [])
        sub["id"] = "s1"
        proc.kv = {"s1": json.dumps(sub).encode(), "bad": b"{not json"}
        mgr = push.PushManager(proc)  # type: ignore[arg-type]
        await mgr.start()
        assert set(mgr.subs) == {"s1"}
        await asyncio.wait_for(proc.done.wait(), 20)
        await mgr.stop()
    assert proc.kinds() == ["ack"]
    pops = [c for c in proc.calls if c[0] == "pop"]
    assert pops[0][1:3] == ("g", "orders") and pops[0][4] is True  # from_latest for start=latest


async def test_a_webhook_that_never_answers_times_out_and_counts_as_failure() -> None:
    hung: list[asyncio.StreamWriter] = []

    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hung.append(w)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proc = Processor([_popped()])
        await _run(proc, _spec(f"http://127.0.0.1:{port}/hook", timeout_s=0.2, max_attempts=2))
    finally:
        for w in hung:
            w.close()
        server.close()
        await server.wait_closed()
    assert proc.kinds() == ["invisible", "dlq"]
    assert len(hung) == 2  # each attempt reached the webhook
