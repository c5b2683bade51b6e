"""The HTTP door's routers, in process (httpx over ASGI) with a recording fake processor.

- ``create_app`` composes the routers into the documented operations, no more, no less;
- the order of composition holds: a queue read, a topic read and a topic description
  each reach their own route although their paths are suffixes of each other;
- ``format=arrow`` serves the processor's Arrow page with its bounds, and a server
  without pyarrow answers 406 in the door's error shape;
- a router module works on its own app (here: pop before the process is ready is 503).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from adapters.cloudevents import http_pop
from adapters.cloudevents.http_app import create_app
from adapters.cloudevents.http_errors import install_error_handlers
from adapters.cloudevents.http_request import Deps
from core_broker.broker_controller import QueueStats, TopicStats
from core_broker.model import FilterType, GetResult, GetStatus, MessageType
from core_broker.topic_config import TopicConfig
from gateway.api import ArrowPage, ArrowUnavailableError
from gateway.door import ServerState
from gateway.trace import Tracer
from unimq.settings import UnimqSettings

OPERATIONS = {
    ("GET", "/healthz"), ("GET", "/metrics"),
    ("GET", "/v1/topics"), ("POST", "/v1/topics"),
    ("POST", "/v1/topics/{topic}/events"), ("GET", "/v1/topics/{topic}/events"),
    ("POST", "/v1/topics/{topic}/messages"), ("GET", "/v1/topics/{topic}/messages"),
    ("POST", "/v1/topics/{topic}/groups/{group}/pop"), ("POST", "/v1/topics/{topic}/groups/{group}/ack"),
    ("POST", "/v1/topics/{topic}/groups/{group}/invisible"),
    ("GET", "/v1/topics/{topic}/queues/{queue}/messages"),
    ("GET", "/v1/topics/{topic}/table"), ("POST", "/v1/topics/{topic}/compact"),
    ("POST", "/v1/topics/{topic}/remap"), ("POST", "/v1/topics/{topic}/release"),
    ("GET", "/v1/messages/{message_id}/trace"),
    ("GET", "/v1/topics/{topic}"), ("PATCH", "/v1/topics/{topic}"), ("DELETE", "/v1/topics/{topic}"),
    ("POST", "/v1/subscriptions"), ("GET", "/v1/subscriptions"),
    ("GET", "/v1/subscriptions/{sid}"), ("DELETE", "/v1/subscriptions/{sid}"),
}


class FakeProcessor:
    """Records the calls the routes make; answers an empty two-queue topic."""

    def __init__(self, arrow: ArrowPage | Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.arrow = arrow
        self.tracer = Tracer.off()

    async def describe_topic(self, ctx: Any, name: str) -> Any:
        self.calls.append(("describe_topic", name))
        queues = [QueueStats(queue_id=q, min_offset=0, max_offset=1) for q in (0, 1)]
        return TopicStats(config=TopicConfig(name=name, message_type=MessageType.NORMAL), queues=queues)

    async def pull(self, ctx: Any, topic: str, queue_id: int, offset: int, max_count: int = 32,
                   filter_expression: Any = None, wait_ms: int = 0) -> GetResult:
        self.calls.append(("pull", topic, queue_id, offset))
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], offset, 0, 1)

    async def pull_arrow(self, ctx: Any, topic: str, queue_id: int, offset: int, max_count: int = 32,
                         filter_expression: Any = None, wait_ms: int = 0) -> ArrowPage:
        self.calls.append(("pull_arrow", topic, queue_id, offset, max_count, filter_expression, wait_ms))
        if isinstance(self.arrow, Exception):
            raise self.arrow
        assert self.arrow is not None
        return self.arrow


def _client(processor: Any, phase: str = "ready") -> httpx.AsyncClient:
    state = ServerState(settings=UnimqSettings(), processor=processor, phase=phase)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://unimq")


def test_the_app_documents_exactly_the_operations() -> None:
    doc = create_app(ServerState(settings=UnimqSettings())).openapi()
    got = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert got == OPERATIONS


async def test_suffix_paths_reach_their_own_routes() -> None:
    p = FakeProcessor()
    async with _client(p) as c:
        r = await c.get("/v1/topics/a/b/queues/1/messages", params={"offset": 5})
        assert r.status_code == 200 and r.json()["next_offset"] == 5
        assert p.calls == [("pull", "a/b", 1, 5)]
        p.calls.clear()
        r = await c.get("/v1/topics/a/b/messages")
        assert r.status_code == 200 and set(r.json()) == {"messages", "cursor", "remaining"}
        assert p.calls == [("describe_topic", "a/b"), ("pull", "a/b", 0, 0), ("pull", "a/b", 1, 0)]
        p.calls.clear()
        r = await c.get("/v1/topics/a/b")
        assert r.status_code == 200 and r.json()["name"] == "a/b" and p.calls == [("describe_topic", "a/b")]


async def test_arrow_pages_are_the_processors_with_their_bounds() -> None:
    page = ArrowPage(b"arrow-bytes", "application/vnd.apache.arrow.stream", 12, 3, 40)
    p = FakeProcessor(page)
    async with _client(p) as c:
        r = await c.get("/v1/topics/t/queues/2/messages",
                        params={"offset": 7, "max": 100, "format": "arrow", "tag": "x", "wait_s": 0.5})
    assert r.status_code == 200 and r.content == b"arrow-bytes"
    assert r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    assert (r.headers["unimq-next-offset"], r.headers["unimq-min-offset"], r.headers["unimq-max-offset"]) == (
        "12", "3", "40")
    [(name, topic, queue, offset, max_count, filt, wait_ms)] = p.calls
    assert (name, topic, queue, offset, max_count, wait_ms) == ("pull_arrow", "t", 2, 7, 100, 500)
    assert (filt.expression, filt.type) == ("x", FilterType.TAG)


async def test_arrow_pages_without_pyarrow_are_406() -> None:
    p = FakeProcessor(ArrowUnavailableError("format=arrow needs pyarrow and numpy on the server"))
    async with _client(p) as c:
        r = await c.get("/v1/topics/t/queues/0/messages", params={"format": "arrow"})
    assert r.status_code == 406
    assert r.json() == {"error": "NOT_ACCEPTABLE", "message": "format=arrow needs pyarrow and numpy on the server"}


@pytest.mark.parametrize("phase", ["starting", "stopping"])
async def test_a_router_on_its_own_app_refuses_until_ready(phase: str) -> None:
    state = ServerState(settings=UnimqSettings(), processor=FakeProcessor(), phase=phase)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(http_pop.router(Deps.of(state)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://unimq") as c:
        r = await c.post("/v1/topics/t/groups/g/pop")
    assert (r.status_code, r.json()) == (503, {"error": "SERVICE_UNAVAILABLE", "message": f"unimq is {phase}"})
