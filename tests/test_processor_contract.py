"""The processor's contracts hold by construction: checked by reading the classes.

- both broker clients implement every method of the ``BrokerClient`` protocol with
  the protocol's parameters (names, order, kinds, defaults) and its sync/async shape;
- ``MessagingProcessor`` implements every member of the doors' ``MessagingAPI``;
- the processor RPC serves exactly the API's calls, and namespaces wrap exactly them;
- the processor never probes its broker client (no ``getattr``/``hasattr`` on it).
"""

from __future__ import annotations

import ast
import collections.abc
import inspect
import typing
from pathlib import Path

import pytest

from gateway import api, namespace, processor_rpc
from gateway.api import CALLS, MessagingAPI, ProcessorCalls, protocol_methods
from gateway.broker_client import BrokerClient, LocalBrokerClient
from gateway.processor import MessagingProcessor
from gateway.remote_broker_client import RemoteBrokerClient

CLIENTS = [LocalBrokerClient, RemoteBrokerClient]


def _params(fn: typing.Callable[..., object]) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _returns_awaitable(fn: typing.Callable[..., object]) -> bool:
    """``async def``, or a plain function annotated to return a coroutine (the local client's
    hot pass-throughs hand back the controller's coroutine: one frame less per call)."""
    if inspect.iscoroutinefunction(fn):
        return True
    ret = typing.get_type_hints(fn).get("return")
    return typing.get_origin(ret) in (collections.abc.Coroutine, collections.abc.Awaitable)


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", protocol_methods(BrokerClient))
def test_broker_clients_implement_the_protocol(client: type, name: str) -> None:
    declared = getattr(BrokerClient, name)
    impl = getattr(client, name, None)
    assert impl is not None, f"{client.__name__} lacks {name}"
    assert _params(impl) == _params(declared), f"{client.__name__}.{name} has another signature"
    assert _returns_awaitable(impl) == inspect.iscoroutinefunction(declared), (
        f"{client.__name__}.{name}: sync/async differs from the protocol"
    )


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
def test_broker_clients_declare_the_protocol_attributes(client: type) -> None:
    for attr in typing.get_type_hints(BrokerClient):
        assert isinstance(getattr(client, attr), bool), f"{client.__name__}.{attr}"


@pytest.mark.parametrize("name", protocol_methods(MessagingAPI))
def test_processor_implements_the_api(name: str) -> None:
    declared = getattr(MessagingAPI, name)
    impl = getattr(MessagingProcessor, name)
    # a namespaced call is a wrapper: compare with the method it wraps
    impl = getattr(impl, "__wrapped__", impl)
    assert _params(impl) == _params(declared), f"MessagingProcessor.{name} has another signature"
    assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(declared), name


def test_processor_has_the_api_attributes() -> None:
    p = MessagingProcessor(LocalBrokerClient.__new__(LocalBrokerClient))  # attributes only, not started
    for attr in typing.get_type_hints(MessagingAPI):
        assert hasattr(p, attr), attr


def test_calls_are_the_remotable_part_of_the_api() -> None:
    assert CALLS == protocol_methods(ProcessorCalls)
    assert set(CALLS) < set(protocol_methods(MessagingAPI))
    for name in CALLS:
        first = list(inspect.signature(getattr(ProcessorCalls, name)).parameters)[1]
        assert first == "ctx", f"{name}: every call takes the caller's context first"


def test_rpc_serves_exactly_the_calls() -> None:
    served = set(processor_rpc.PROCESSOR_METHODS)
    assert served - set(CALLS) == {"poll_transaction_checks", "confirm_transaction_checks"}
    assert set(CALLS) <= served
    facade = processor_rpc.ProcessorRpcFacade(MessagingProcessor(LocalBrokerClient.__new__(LocalBrokerClient)))
    for name in processor_rpc.PROCESSOR_METHODS:
        assert callable(getattr(facade, name)), name
    remote = processor_rpc.RemoteProcessor([("127.0.0.1", 1)])
    for name in CALLS:
        assert callable(getattr(remote, name)), name
    with pytest.raises(AttributeError):
        remote.pull_raw  # in-process only: not a call remote callers get
    # a door built on the RPC client routes what it sends through it, as in one process
    assert callable(remote.add_router) and callable(remote.remove_router)


def test_namespaces_wrap_exactly_the_calls() -> None:
    for name in protocol_methods(MessagingAPI):
        wrapped = hasattr(getattr(MessagingProcessor, name), "__wrapped__")
        assert wrapped == (name in CALLS), name


def test_namespacing_a_class_without_a_call_fails_at_definition() -> None:
    with pytest.raises(TypeError, match="lacks the processor API calls"):

        @namespace.namespaced_calls
        class Partial:
            async def send(self, ctx: object) -> None: ...


def test_the_processor_never_probes_its_broker_client() -> None:
    import gateway.processor as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    probes = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
    ]
    assert probes == [], f"gateway/processor.py probes an object at lines {probes}"


def test_contract_types_are_reexported_where_they_were() -> None:
    import gateway.processor as mod

    for name in ("ProcessorConfig", "SendResult", "Router", "MessageTypeMismatchError", "NoWritableQueueError",
                 "ACCEPTED_MESSAGE_TYPES"):
        assert getattr(mod, name) is getattr(api, name)
