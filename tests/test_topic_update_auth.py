"""Who may change a topic's attributes (gateway/auth.py's table): the processor asks CREATE on
the topic (what creating it needs) and, refused that, ADMIN; queues and permission stay ADMIN.
A real merged processor on a temp-dir store, with the recording authorizer of
test_processor_auth."""

from __future__ import annotations

import pytest

from core_broker.errors import BadRequestError
from gateway.auth import Action, ForbiddenError, Resource
from gateway.processor import MessagingProcessor

from processor_fixtures import merged_processor  # noqa: F401  (a fixture)
from test_processor_auth import ALICE, Rules

A, C, AD, T = "alice", Action.CREATE, Action.ADMIN, Resource.TOPIC


async def _attrs(proc: MessagingProcessor, name: str) -> dict[str, str]:
    return dict((await proc.broker.describe_topic(name)).config.attributes)


async def test_attributes_need_create_or_admin(merged_processor: MessagingProcessor) -> None:
    proc = merged_processor
    await proc.create_topic(ALICE, "t", queues=2, attributes={"team": "ops"})
    rules = Rules()
    proc.set_authorizer(rules)
    tc = await proc.update_topic(ALICE, "t", attributes={"tier_retention_hours": "12"})
    assert rules.asked == [(A, C, T, "t")]
    assert tc.attributes == {"team": "ops", "tier_retention_hours": "12"} == await _attrs(proc, "t")
    assert tc.queues == 2

    rules = Rules((A, C, T, "t"))  # no CREATE: ADMIN will do
    proc.set_authorizer(rules)
    await proc.update_topic(ALICE, "t", attributes={"team": None})
    assert rules.asked == [(A, C, T, "t"), (A, AD, T, "t")]
    assert await _attrs(proc, "t") == {"tier_retention_hours": "12"}

    proc.set_authorizer(Rules((A, C, T, "t"), (A, AD, T, "t")))
    with pytest.raises(ForbiddenError):
        await proc.update_topic(ALICE, "t", attributes={"tier_retention_hours": "1"})
    assert await _attrs(proc, "t") == {"tier_retention_hours": "12"}  # nothing happened

    rules = Rules()
    proc.set_authorizer(rules)
    await proc.update_topic(ALICE, "t", queues=3)  # queues: ADMIN only, attributes kept
    assert rules.asked == [(A, AD, T, "t")]
    assert await _attrs(proc, "t") == {"tier_retention_hours": "12"}


async def test_a_bad_value_changes_nothing(merged_processor: MessagingProcessor) -> None:
    proc = merged_processor
    await proc.create_topic(ALICE, "t", queues=1, attributes={"tier_retention_hours": "5"})
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(BadRequestError):
            await proc.update_topic(ALICE, "t", attributes={"tier_retention_hours": bad})
    with pytest.raises(BadRequestError):
        await proc.update_topic(ALICE, "t", attributes={"delete_retention_ms": "-3"})
    assert await _attrs(proc, "t") == {"tier_retention_hours": "5"}
