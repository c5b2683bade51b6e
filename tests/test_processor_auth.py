"""Authorization in the processor (gateway/auth.py): every call asks the installed authorizer.

A real merged processor (store in a temp directory) with an authorizer that
records every question and refuses what its rules deny. What is checked: the
question each call asks (action, resource, name), that a denial is the typed
``ForbiddenError`` with its code and details and that nothing happened, that a
send asks once per topic of a call, the either-right calls (routes,
descriptions), the listing filtered to what the caller may use, and the door's
own checks (``authorize``/``allowed``).
"""

from __future__ import annotations


import pytest

from core_broker.errors import UnimqError
from gateway.auth import Action, AllOf, AllowAll, ForbiddenError, Resource, UnauthorizedError, forbidden
from gateway.context import RequestContext
from gateway.processor import MessagingProcessor

from processor_fixtures import merged_processor, msg  # noqa: F401  (merged_processor is a fixture)

ALICE = RequestContext(protocol="test", client_id="c1", remote_address="127.0.0.1:9", principal="alice")
DOOR = RequestContext(protocol="test", client_id="door")

Question = tuple[str, Action, Resource, str]


class Rules:
    """Records every question; denies (principal, action, resource, name) in ``deny``
    (``"*"`` as a name: every name of that resource)."""

    def __init__(self, *deny: Question) -> None:
        self.deny = set(deny)
        self.asked: list[Question] = []

    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        q = (ctx.principal or "", action, resource, name)
        self.asked.append(q)
        if q in self.deny or (q[0], action, resource, "*") in self.deny:
            raise forbidden(ctx, action, resource, name)


@pytest.fixture
def proc(merged_processor: MessagingProcessor) -> MessagingProcessor:
    return merged_processor


async def test_default_allows_everything(proc: MessagingProcessor) -> None:
    assert isinstance(proc.authorizer, AllowAll)
    [r] = await proc.send(ALICE, [msg("t", b"x")])
    assert r.topic == "t"
    assert proc.allowed(ALICE, Action.ADMIN, Resource.CLUSTER, "")


async def test_each_call_asks_what_the_table_says(proc: MessagingProcessor) -> None:
    rules = Rules()
    proc.set_authorizer(rules)
    a = "alice"
    P, S, C, D, AD = Action.PUBLISH, Action.SUBSCRIBE, Action.CREATE, Action.DELETE, Action.ADMIN
    T, G = Resource.TOPIC, Resource.GROUP

    async def asks(call, *expected: Question) -> object:
        rules.asked.clear()
        result = await call
        assert rules.asked == list(expected)
        return result

    await asks(proc.create_topic(ALICE, "t", queues=1), (a, C, T, "t"))
    [r] = await asks(proc.send(ALICE, [msg("t", b"x", keys=["k1"])]), (a, P, T, "t"))
    [m] = await asks(proc.pop(ALICE, "g", "t", 1, 30_000), (a, S, T, "t"), (a, S, G, "g"))
    h = await asks(proc.change_invisible(ALICE, "g", "t", m.receipt_handle, 30_000), (a, S, T, "t"), (a, S, G, "g"))
    await asks(proc.ack(ALICE, "g", "t", h[0]), (a, S, T, "t"), (a, S, G, "g"))
    await asks(proc.ack_batch(ALICE, "g", "t", []), (a, S, T, "t"), (a, S, G, "g"))
    await asks(proc.pull(ALICE, "t", 0, 0), (a, S, T, "t"))
    await asks(proc.pull_raw(ALICE, "t", 0, 0, 1), (a, S, T, "t"))
    await asks(proc.commit_offset(ALICE, "g2", "t", 0, 1), (a, S, T, "t"), (a, S, G, "g2"))
    await asks(proc.get_offset(ALICE, "g2", "t", 0), (a, S, T, "t"), (a, S, G, "g2"))
    await asks(proc.query_offset(ALICE, "t", 0), (a, S, T, "t"))
    await asks(proc.query_route(ALICE, "t"), (a, P, T, "t"))
    await asks(proc.describe_topic(ALICE, "t"), (a, P, T, "t"))
    await asks(proc.query_message_by_id(ALICE, r.message_id), (a, S, T, "t"))
    await asks(proc.query_messages_by_key(ALICE, "t", "k1"), (a, S, T, "t"))
    await asks(proc.update_topic(ALICE, "t", queues=2), (a, AD, T, "t"))
    await asks(proc.kv_put(ALICE, "door.x", "k", b"v"), (a, AD, Resource.DOOR_STATE, "door.x"))
    await asks(proc.kv_get(ALICE, "door.x", "k"), (a, AD, Resource.DOOR_STATE, "door.x"))
    await asks(proc.kv_items(ALICE, "door.x"), (a, AD, Resource.DOOR_STATE, "door.x"))
    await asks(proc.consumer_lag(ALICE), (a, AD, Resource.CLUSTER, ""))
    await asks(proc.store_stats(ALICE), (a, AD, Resource.CLUSTER, ""))
    await asks(proc.host_lmq(ALICE, "%LMQ%q", "broker-a"), (a, C, T, "%LMQ%q"))
    await asks(proc.delete_topic(ALICE, "t"), (a, D, T, "t"))


async def test_a_denied_send_is_typed_and_stores_nothing(proc: MessagingProcessor) -> None:
    proc.set_authorizer(Rules(("alice", Action.PUBLISH, Resource.TOPIC, "secret")))
    await proc.create_topic(DOOR, "secret", queues=1)
    with pytest.raises(ForbiddenError) as e:
        await proc.send(ALICE, [msg("open", b"1"), msg("secret", b"2")])
    assert e.value.code == "FORBIDDEN"
    assert e.value.details == {"action": "publish", "resource": "topic", "name": "secret", "principal": "alice"}
    assert "alice" in str(e.value) and "secret" in str(e.value)
    # the whole call was refused: nothing of it was stored, on either topic
    for topic in ("open", "secret"):
        assert await proc.pop(DOOR, "g", topic, 32, 30_000) == []
    # other identities are not affected
    [r] = await proc.send(DOOR, [msg("secret", b"3")])
    assert r.topic == "secret"


async def test_a_send_asks_once_per_topic_of_a_call(proc: MessagingProcessor) -> None:
    rules = Rules()
    proc.set_authorizer(rules)
    await proc.send(ALICE, [msg("a", b"1"), msg("b", b"2"), msg("a", b"3")] + [msg("b", b"x")] * 50)
    pub = [q for q in rules.asked if q[1] is Action.PUBLISH]
    assert sorted(q[3] for q in pub) == ["a", "b"]


async def test_consuming_needs_both_the_topic_and_the_group(proc: MessagingProcessor) -> None:
    await proc.send(DOOR, [msg("t", b"1")])
    proc.set_authorizer(Rules(("alice", Action.SUBSCRIBE, Resource.GROUP, "theirs")))
    with pytest.raises(ForbiddenError) as e:
        await proc.pop(ALICE, "theirs", "t", 1, 30_000)
    assert e.value.details["resource"] == "group"
    [m] = await proc.pop(ALICE, "mine", "t", 1, 30_000)
    with pytest.raises(ForbiddenError):
        await proc.ack(ALICE, "theirs", "t", m.receipt_handle)
    await proc.ack(ALICE, "mine", "t", m.receipt_handle)


async def test_routes_and_descriptions_need_either_right(proc: MessagingProcessor) -> None:
    await proc.create_topic(DOOR, "t", queues=1)
    # a consumer without the right to publish still gets the route
    proc.set_authorizer(Rules(("alice", Action.PUBLISH, Resource.TOPIC, "t")))
    assert (await proc.query_route(ALICE, "t")).config.name == "t"
    assert (await proc.describe_topic(ALICE, "t")).config.name == "t"
    # neither right: refused
    proc.set_authorizer(Rules(("alice", Action.PUBLISH, Resource.TOPIC, "t"), ("alice", Action.SUBSCRIBE, Resource.TOPIC, "t")))
    with pytest.raises(ForbiddenError):
        await proc.query_route(ALICE, "t")


async def test_listing_shows_only_usable_topics(proc: MessagingProcessor) -> None:
    for t in ("pub-only", "sub-only", "hidden"):
        await proc.create_topic(DOOR, t, queues=1)
    proc.set_authorizer(Rules(
        ("alice", Action.SUBSCRIBE, Resource.TOPIC, "pub-only"),
        ("alice", Action.PUBLISH, Resource.TOPIC, "sub-only"),
        ("alice", Action.PUBLISH, Resource.TOPIC, "hidden"),
        ("alice", Action.SUBSCRIBE, Resource.TOPIC, "hidden"),
    ))
    assert {t.name for t in await proc.list_topics(ALICE)} == {"pub-only", "sub-only"}
    assert {t.name for t in await proc.list_topics(DOOR)} >= {"pub-only", "sub-only", "hidden"}


async def test_a_message_looked_up_by_id_is_checked_on_its_topic(proc: MessagingProcessor) -> None:
    [r] = await proc.send(DOOR, [msg("private", b"1")])
    proc.set_authorizer(Rules(("alice", Action.SUBSCRIBE, Resource.TOPIC, "private")))
    with pytest.raises(ForbiddenError):
        await proc.query_message_by_id(ALICE, r.message_id)
    assert (await proc.query_message_by_id(DOOR, r.message_id)).body == b"1"  # type: ignore[union-attr]


async def test_admin_calls_are_refused_without_the_right(proc: MessagingProcessor) -> None:
    await proc.create_topic(DOOR, "t", queues=1)
    proc.set_authorizer(Rules(
        ("alice", Action.CREATE, Resource.TOPIC, "*"), ("alice", Action.DELETE, Resource.TOPIC, "*"),
        ("alice", Action.ADMIN, Resource.TOPIC, "*"), ("alice", Action.ADMIN, Resource.CLUSTER, "*"),
        ("alice", Action.ADMIN, Resource.CLUSTER, ""), ("alice", Action.ADMIN, Resource.DOOR_STATE, "*"),
    ))
    calls = [
        proc.create_topic(ALICE, "new"), proc.delete_topic(ALICE, "t"), proc.update_topic(ALICE, "t", queues=3),
        proc.consumer_lag(ALICE), proc.store_stats(ALICE), proc.kv_put(ALICE, "ns", "k", b"v"),
        proc.kv_items(ALICE, "ns"),
    ]
    for c in calls:
        with pytest.raises(ForbiddenError):
            await c
    # nothing changed
    names = {t.name for t in await proc.list_topics(DOOR)}
    assert "t" in names and "new" not in names
    assert (await proc.query_route(DOOR, "t")).config.queues == 1
    assert await proc.kv_items(DOOR, "ns") == {}


async def test_doors_ask_for_what_they_decide_themselves(proc: MessagingProcessor) -> None:
    rules = Rules(("alice", Action.SUBSCRIBE, Resource.MQTT_TOPIC, "a/#"))
    proc.set_authorizer(rules)
    assert proc.allowed(ALICE, Action.SUBSCRIBE, Resource.MQTT_TOPIC, "a/b")
    assert not proc.allowed(ALICE, Action.SUBSCRIBE, Resource.MQTT_TOPIC, "a/#")
    with pytest.raises(ForbiddenError):
        proc.authorize(ALICE, Action.SUBSCRIBE, Resource.MQTT_TOPIC, "a/#")
    proc.authorize(ALICE, Action.PUBLISH, Resource.MQTT_TOPIC, "a/#")


class NeedsLogin:
    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        if ctx.principal is None:
            raise UnauthorizedError("log in first")


async def test_authorizers_combine_and_unauthorized_is_its_own_code(proc: MessagingProcessor) -> None:
    proc.set_authorizer(AllOf(NeedsLogin(), Rules(("alice", Action.PUBLISH, Resource.TOPIC, "x"))))
    with pytest.raises(UnauthorizedError) as e:
        await proc.send(DOOR, [msg("y", b"1")])
    assert e.value.code == "UNAUTHORIZED" and isinstance(e.value, UnimqError)
    with pytest.raises(ForbiddenError):
        await proc.send(ALICE, [msg("x", b"1")])
    assert not proc.allowed(DOOR, Action.PUBLISH, Resource.TOPIC, "y")
    [r] = await proc.send(ALICE, [msg("y", b"1")])
    assert r.topic == "y"


async def test_a_namespaced_caller_is_asked_about_the_stored_names(proc: MessagingProcessor) -> None:
    rules = Rules()
    proc.set_authorizer(rules)
    ns = RequestContext(protocol="grpc", client_id="c", principal="alice", namespace="tenant")
    [r] = await proc.send(ns, [msg("orders", b"1")])
    assert r.topic == "orders"  # the caller sees its own names
    assert ("alice", Action.PUBLISH, Resource.TOPIC, "tenant%orders") in rules.asked
