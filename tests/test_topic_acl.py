"""gateway.topic_acl: Mosquitto ACL files as the processor's authorizer for MQTT topics."""

from __future__ import annotations

import pytest

from gateway.auth import Action, ForbiddenError, Resource
from gateway.context import RequestContext
from gateway.topic_acl import AclFileError, TopicAclAuthorizer, filter_covers, load_acl_file

ACL = """
# anonymous clients
topic read public/#

user alice
topic alice/#
topic read news/#
topic deny news/secret

pattern readwrite dev/%c/#
pattern read users/%u/#
"""


def ctx(principal=None, client="c1") -> RequestContext:
    return RequestContext(protocol="mqtt", client_id=client, principal=principal)


@pytest.fixture
def authz(tmp_path) -> TopicAclAuthorizer:
    path = tmp_path / "acl"
    path.write_text(ACL)
    return TopicAclAuthorizer.from_file(path)


def allowed(a: TopicAclAuthorizer, c: RequestContext, action: Action, name: str) -> bool:
    try:
        a.check(c, action, Resource.MQTT_TOPIC, name)
    except ForbiddenError:
        return False
    return True


def test_users_anonymous_and_patterns(authz) -> None:
    pub, sub = Action.PUBLISH, Action.SUBSCRIBE
    alice, anon = ctx("alice"), ctx(None, "c2")
    assert allowed(authz, alice, pub, "alice/x") and allowed(authz, alice, sub, "alice/#")
    assert allowed(authz, alice, sub, "news/today") and not allowed(authz, alice, pub, "news/today")
    assert not allowed(authz, alice, sub, "news/secret")  # deny wins
    assert allowed(authz, alice, sub, "news/#")  # a deny inside it is applied per topic, at delivery
    assert allowed(authz, anon, sub, "public/a/b") and not allowed(authz, anon, pub, "public/a")
    assert allowed(authz, anon, pub, "dev/c2/t") and not allowed(authz, anon, pub, "dev/c1/t")  # %c
    assert allowed(authz, alice, sub, "users/alice/+") and not allowed(authz, anon, sub, "users/alice/x")  # %u


def test_denial_is_typed_and_other_resources_are_left_alone(authz) -> None:
    with pytest.raises(ForbiddenError) as e:
        authz.check(ctx(None), Action.PUBLISH, Resource.MQTT_TOPIC, "alice/x")
    assert e.value.code == "FORBIDDEN"
    authz.check(ctx(None), Action.PUBLISH, Resource.TOPIC, "alice")  # not an MQTT question: allowed here


def test_filter_cover_rules() -> None:
    assert filter_covers("a/#", "a/b/+") and filter_covers("a/+", "a/b") and not filter_covers("a/+", "a/#")
    assert not filter_covers("#", "$SYS/x") and filter_covers("$SYS/#", "$SYS/x")


def test_bad_file_is_refused_with_its_line(tmp_path) -> None:
    path = tmp_path / "bad"
    path.write_text("topic read a\nbogus line\n")
    with pytest.raises(AclFileError, match="line 2"):
        load_acl_file(path)
    with pytest.raises(AclFileError):
        load_acl_file(tmp_path / "missing")
