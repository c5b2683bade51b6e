"""The processor RPC and namespaces, imported and driven directly.

``gateway/namespace.py``: the name rules (RocketMQ's NamespaceUtil shapes) as
functions. ``gateway/processor_rpc.py``: a real merged processor served by a
real RPC server on a free port, called through ``RemoteProcessor``: the calls
of the API go through, namespaced callers see only their own names, a denial
keeps its type and code across the wire, and anything outside the API is
refused by the server.
"""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from core_broker.errors import UnimqError
from core_broker.remoting.server import RpcServer
from gateway.auth import Action, ForbiddenError, Resource, forbidden
from gateway.context import RequestContext
from gateway.namespace import in_namespace, namespace_of, unwrap, wrap
from gateway.processor import MessagingProcessor
from gateway.processor_rpc import PROCESSOR_METHODS, ProcessorRpcFacade, RemoteProcessor

from processor_fixtures import merged_processor, msg  # noqa: F401  (merged_processor is a fixture)

CTX = RequestContext(protocol="test", client_id="rpc-suite", principal="bob")


# ----------------------------------------------------------------------------- name rules


@pytest.mark.parametrize(
    "name, wrapped, shown",
    [
        ("orders", "ns%orders", "orders"),
        ("ns%orders", "ns%orders", "orders"),  # already wrapped
        ("%RETRY%g", "%RETRY%ns%g", "%RETRY%g"),
        ("%DLQ%g", "%DLQ%ns%g", "%DLQ%g"),
        ("%DLQ%ns%g", "%DLQ%ns%g", "%DLQ%g"),
        ("%LMQ%x", "%LMQ%x", "%LMQ%x"),  # other system topics are shared
        ("", "", ""),
    ],
)
def test_wrap_and_unwrap(name: str, wrapped: str, shown: str) -> None:
    assert wrap("ns", name) == wrapped
    assert unwrap("ns", wrapped) == shown
    assert wrap("", name) == name and unwrap("", name) == name


def test_retry_topics_unwrap_both_parts() -> None:
    assert unwrap("ns", "%RETRY%ns%g+ns%t") == "%RETRY%g+t"


def test_namespace_membership() -> None:
    assert in_namespace("ns", "ns%orders") and in_namespace("ns", "%DLQ%ns%g")
    assert not in_namespace("ns", "orders") and not in_namespace("ns", "other%orders")
    assert namespace_of("ns%orders") == "ns" and namespace_of("%DLQ%ns%g") == "ns"
    assert namespace_of("orders") == "" and namespace_of("%LMQ%x") == ""


# ----------------------------------------------------------------------------- the processor, namespaced


@pytest.fixture
def proc(merged_processor: MessagingProcessor) -> MessagingProcessor:
    return merged_processor


async def test_a_namespaced_context_sees_only_its_names(proc: MessagingProcessor) -> None:
    a = RequestContext(protocol="test", namespace="a")
    b = RequestContext(protocol="test", namespace="b")
    [ra] = await proc.send(a, [msg("orders", b"for a")])
    await proc.send(b, [msg("orders", b"for b")])
    assert ra.topic == "orders"
    [m] = await proc.pop(a, "g", "orders", 32, 30_000)
    assert m.message.body == b"for a" and m.message.topic == "orders"
    assert [t.name for t in await proc.list_topics(a)] == ["orders"]
    # without a namespace the brokers' names show
    assert {"a%orders", "b%orders"} <= {t.name for t in await proc.list_topics(CTX)}
    assert (await proc.query_route(a, "orders")).config.name == "orders"


# ----------------------------------------------------------------------------- over the RPC


@pytest.fixture
async def served(proc: MessagingProcessor) -> AsyncIterator[tuple[MessagingProcessor, tuple[str, int]]]:
    facade = ProcessorRpcFacade(proc)
    server = RpcServer(facade, PROCESSOR_METHODS, "processor")
    addr = await server.start("127.0.0.1", 0)
    try:
        yield proc, addr
    finally:
        facade.close()
        await server.stop()


async def test_remote_calls_are_the_processors(served: tuple[MessagingProcessor, tuple[str, int]]) -> None:
    proc, addr = served
    rp = RemoteProcessor([addr], namespace="tenant")
    try:
        [r] = await rp.send(CTX, [msg("t", b"1", keys=["k"])])
        assert r.topic == "t"
        [m] = await rp.pop(CTX, "g", "t", 32, 30_000)
        assert m.message.body == b"1" and m.message.topic == "t"
        await rp.ack(CTX, "g", "t", m.receipt_handle)
        assert [t.name for t in await rp.list_topics(CTX)] == ["t"]
        assert [x.body for x in await rp.query_messages_by_key(CTX, "t", "k")] == [b"1"]
        assert await rp.consumer_lag(CTX) is not None  # served now that it is part of the API
        assert (await rp.store_stats(CTX))["commitlog_bytes"] > 0
        # the processor saw the namespaced names
        assert "tenant%t" in {t.name for t in await proc.list_topics(CTX)}
    finally:
        await rp.stop()


async def test_a_denial_keeps_its_type_and_code_over_the_wire(
    served: tuple[MessagingProcessor, tuple[str, int]],
) -> None:
    proc, addr = served

    class NoDeletes:
        def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
            if action is Action.DELETE:
                raise forbidden(ctx, action, resource, name)

    proc.set_authorizer(NoDeletes())
    rp = RemoteProcessor([addr])
    try:
        await rp.create_topic(CTX, "keep", queues=1)
        with pytest.raises(ForbiddenError) as e:
            await rp.delete_topic(CTX, "keep")
        assert e.value.code == "FORBIDDEN" and "bob" in str(e.value)
        assert "keep" in {t.name for t in await rp.list_topics(CTX)}
    finally:
        await rp.stop()


async def test_the_server_refuses_what_is_not_in_the_api(served: tuple[MessagingProcessor, tuple[str, int]]) -> None:
    _, addr = served
    rp = RemoteProcessor([addr])
    try:
        with pytest.raises(UnimqError, match="no remote method 'set_authorizer'"):
            await rp.clients[0].call("set_authorizer", None)
        with pytest.raises(AttributeError):
            rp.set_authorizer  # noqa: B018  (not an API call: the client has no such attribute)
    finally:
        await rp.stop()
