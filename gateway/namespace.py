"""Namespaces: RocketMQ's way of letting several tenants share one cluster.

A call whose context names a namespace sees only that namespace's topics and
groups: ``orders`` becomes ``<ns>%orders`` on the brokers (and the group's
``%RETRY%``/``%DLQ%`` topics become ``%DLQ%<ns>%group``, as RocketMQ's
NamespaceUtil does), and every name in a result is shown back without the
prefix. The gRPC door passes the client's ``x-mq-namespace`` through here.

Applied to the processor by the class decorator :func:`namespaced_calls`
where the class is defined, to exactly the calls of the processor API
(``gateway.api.CALLS``), so the processor's methods stay written for one
namespace; a call without a namespace costs one attribute test (the wrapper
returns the method's coroutine; callers await it as before).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, TypeVar, overload

from core_broker.broker_controller import TopicStats
from core_broker.model import GetResult, Message
from core_broker.pop_service import PoppedMessage
from core_broker.topic_config import TopicConfig

from .api import CALLS, SendResult
from .broker_client import TopicRoute

T = TypeVar("T", bound=type)

SEP = "%"
_SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%")
_TOPIC_PARAMS = ("topic", "name")
_GROUP_PARAMS = ("group", "producer_group")


def wrap(ns: str, name: str) -> str:
    if not ns or not name:
        return name
    for p in _SYSTEM_PREFIXES:
        if name.startswith(p):
            rest = name[len(p):]
            return name if rest.startswith(ns + SEP) else p + ns + SEP + rest
    if name.startswith("%") or name.startswith(ns + SEP):
        return name  # other system topics are shared; already wrapped stays as is
    return ns + SEP + name


@overload
def unwrap(ns: str, name: str) -> str: ...
@overload
def unwrap(ns: str, name: None) -> None: ...
def unwrap(ns: str, name: str | None) -> str | None:
    if not ns or not name:
        return name
    if name.startswith("%RETRY%" + ns + SEP):  # %RETRY%<group>+<topic>: both parts carry it
        group, plus, topic = name[len("%RETRY%"):].partition("+")
        return "%RETRY%" + (unwrap(ns, group) or "") + plus + (unwrap(ns, topic) or "")
    for p in _SYSTEM_PREFIXES:
        if name.startswith(p + ns + SEP):
            return p + name[len(p) + len(ns) + 1:]
    if name.startswith(ns + SEP):
        return name[len(ns) + 1:]
    return name


def in_namespace(ns: str, name: str) -> bool:
    if name.startswith(ns + SEP):
        return True
    return any(name.startswith(p + ns + SEP) for p in _SYSTEM_PREFIXES)


def unwrap_result(ns: str, obj: Any) -> Any:
    """Show a result's names without the namespace (in place where the object allows)."""
    if obj is None:
        return None
    if isinstance(obj, list):
        return [unwrap_result(ns, o) for o in obj]
    if isinstance(obj, SendResult):
        return obj._replace(topic=unwrap(ns, obj.topic))
    if isinstance(obj, PoppedMessage):
        unwrap_result(ns, obj.message)
        return obj
    if isinstance(obj, GetResult):
        for m in obj.messages:
            unwrap_result(ns, m)
        return obj
    if isinstance(obj, Message):
        obj.topic = unwrap(ns, obj.topic)  # type: ignore[assignment]
        return obj
    if isinstance(obj, TopicConfig):
        return dataclasses.replace(obj, name=unwrap(ns, obj.name))
    if isinstance(obj, TopicStats):
        return TopicStats(unwrap_result(ns, obj.config), obj.queues)
    if isinstance(obj, TopicRoute):
        return TopicRoute(unwrap_result(ns, obj.config), obj.queues)
    return obj


def namespaced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a processor coroutine method whose first argument after self is the context."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def call(self: Any, ctx: Any, *args: Any, **kwargs: Any) -> Any:
        # A plain function returning the coroutine: without a namespace the call costs
        # no coroutine frame of its own (the processor's hot paths go through here).
        if not getattr(ctx, "namespace", ""):
            return fn(self, ctx, *args, **kwargs)
        return in_ns(self, ctx, *args, **kwargs)

    async def in_ns(self: Any, ctx: Any, *args: Any, **kwargs: Any) -> Any:
        ns = ctx.namespace
        bound = sig.bind(self, ctx, *args, **kwargs)
        a = bound.arguments
        for p in _TOPIC_PARAMS + _GROUP_PARAMS:
            if isinstance(a.get(p), str):
                a[p] = wrap(ns, a[p])
        if "messages" in a:
            for m in a["messages"]:
                m.topic = wrap(ns, m.topic)
        result = await fn(*bound.args, **bound.kwargs)
        if fn.__name__ == "list_topics":
            result = [t for t in result if in_namespace(ns, t.name)]
        return unwrap_result(ns, result)

    return call


def namespaced_calls(cls: T) -> T:
    """Class decorator: every call of the processor API (``gateway.api.CALLS``) that ``cls``
    defines sees the caller's namespace only. A class lacking one of the calls is a
    programming error, reported when the class is defined."""
    missing = [name for name in CALLS if not callable(getattr(cls, name, None))]
    if missing:
        raise TypeError(f"{cls.__name__} lacks the processor API calls {missing}")
    for name in CALLS:
        setattr(cls, name, namespaced(getattr(cls, name)))
    return cls


def namespace_of(name: str) -> str:
    """The namespace a broker-side topic or group name belongs to ("" for none)."""
    for p in _SYSTEM_PREFIXES:
        if name.startswith(p):
            name = name[len(p):]
            break
    if name.startswith("%") or SEP not in name:
        return ""
    return name.split(SEP, 1)[0]
