"""adapters.mqtt.routing: subscriptions -> dispatch plans, cached until the subscriptions change."""

from __future__ import annotations

import pytest

from adapters.mqtt.acl import AccessControl
from adapters.mqtt.routing import LMQ_PREFIX, Routing
from adapters.mqtt.session import Session, Subscription
from gateway.context import RequestContext
from gateway.topic_acl import READ, AclRules, TopicAclAuthorizer
from mqtt_fixtures import in_process_processor

pytestmark = pytest.mark.timeout(60)


def routing(processor=None) -> tuple[Routing, list[str]]:
    made: list[str] = []

    async def ensure_lmq(name: str) -> None:  # what the door asks the processor for
        made.append(name)

    return Routing(AccessControl(processor, enforced=processor is not None), ensure_lmq), made


def sub(r: Routing, s: Session, flt: str, qos: int, **kw) -> Subscription:
    x = Subscription(flt, qos, s, **kw)
    if qos and not x.group:
        x.lmq = r.new_lmq(s)
    s.subs[x.key()] = x
    r.index(x)
    return x


async def test_plan_dispatches_qos1_to_lmqs_and_qos0_direct():
    r, made = routing()
    a, b = Session("a"), Session("b")
    sa = sub(r, a, "t/#", 1)
    sb = sub(r, b, "t/+", 0)
    plan = await r.plan("t/x", 1, "pub")
    assert plan.ut == "t" and plan.tb == b"t/x" and plan.matched
    assert [t.topic for t in plan.targets] == [sa.lmq] and plan.lmq_subs == (sa,)
    assert plan.direct == (sb,)
    assert made == [sa.lmq] and sa.lmq.startswith(LMQ_PREFIX)
    # a QoS 0 publish goes direct to both
    assert set((await r.plan("t/x", 0, "pub")).direct) == {sa, sb}


async def test_plans_are_cached_until_subscriptions_change():
    r, _ = routing()
    a = Session("a")
    sub(r, a, "t/#", 1)
    p1 = await r.plan("t/x", 1, "pub")
    assert r.plans[("t/x", 1)] is p1
    b = Session("b")
    sub(r, b, "t/x", 1)
    assert not r.plans  # stale
    assert len((await r.plan("t/x", 1, "pub")).targets) == 2


async def test_one_subscription_per_session_the_highest_qos():
    r, _ = routing()
    a = Session("a")
    sub(r, a, "t/#", 0)
    best = sub(r, a, "t/x", 1)
    subs, groups = r.match("t/x")
    assert subs == [best] and groups == []


async def test_no_local_and_shared_groups_are_not_cached():
    r, _ = routing()
    a, b = Session("a"), Session("b")
    sub(r, a, "n/#", 1, no_local=True)
    plan = await r.plan("n/x", 1, "a")  # a's own publish does not come back to it
    assert not plan.targets and ("n/x", 1) not in r.plans
    g = Subscription("s/#", 1, b, group="g1")
    b.subs[g.key()] = g
    r.index(g)
    plan = await r.plan("s/x", 1, "pub")
    assert [t.topic for t in plan.targets] == [r.groups[("g1", "s/#")].lmq] and plan.lmq_subs == (None,)
    assert ("s/x", 1) not in r.plans
    assert r.unindex(b, g) == plan.targets[0].topic  # the last member leaves: the group's LMQ goes


async def test_read_rights_are_decided_when_the_plan_is_built(tmp_path):
    acl = AclRules()
    acl.anonymous.append((READ, "open/#"))
    p = await in_process_processor(tmp_path)
    p.set_authorizer(TopicAclAuthorizer(acl))
    try:
        r, _ = routing(p)
        a = Session("a")
        a.ctx = RequestContext(protocol="mqtt", client_id="a")
        sub(r, a, "#", 1)
        assert (await r.plan("open/x", 1, "p")).targets
        assert not (await r.plan("closed/x", 1, "p")).targets
    finally:
        await p.stop()


def test_subscription_identifiers_of_every_matching_subscription():
    r, _ = routing()
    a = Session("a")
    x = sub(r, a, "t/#", 1, sub_id=42)
    sub(r, a, "t/+/x", 0, sub_id=7)
    assert sorted(Routing.sub_ids(a, "t/y/x", x)) == [7, 42]
    assert Routing.sub_ids(Session("b"), "t/y/x", x) is None


@pytest.mark.parametrize("topic,ut", [("a/b", "a"), ("/a", "mqtt-other")])
def test_unified_topic_cached(topic: str, ut: str):
    r, _ = routing()
    assert r.unified(topic) == ut == r.unified(topic)
