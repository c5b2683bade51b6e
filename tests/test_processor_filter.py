"""MessagingProcessor: server-side filtering on pop and pull -- tag expressions and
SQL92 over message properties; a bad expression is a clear client error.
"""

from __future__ import annotations

import pytest

from core_broker.errors import BadRequestError, IllegalFilterExpressionError
from core_broker.model import FilterExpression

from processor_fixtures import (  # noqa: F401  (processor, processor_options are fixtures)
    CTX,
    bodies,
    msg,
    pop_nothing,
    pop_until,
    processor,
    processor_options,
    sql,
    tags,
)

READINGS = [
    # body, tag, properties
    ("eu-hot", "TagA", {"region": "eu", "temp": "35", "city": "Berlin"}),
    ("eu-cold", "TagB", {"region": "eu", "temp": "5", "city": "Paris"}),
    ("us-hot", "TagA", {"region": "us", "temp": "40", "city": "Austin"}),
    ("us-mild", "TagC", {"region": "us", "temp": "20"}),
    ("no-region", "TagB", {"temp": "31"}),
    ("untagged", None, {"region": "ap", "temp": "30", "city": "Bern"}),
]
ALL = sorted(b for b, _, _ in READINGS)


async def readings_topic(processor, name: str = "r", queues: int = 2) -> None:
    await processor.create_topic(CTX, name, queues=queues)
    await processor.send(CTX, [msg(name, b, tag=t, properties=dict(p)) for b, t, p in READINGS])


async def pop_filtered(processor, group: str, expr: FilterExpression, expect: int) -> list[str]:
    got = await pop_until(processor, group, "r", expect, filter_expression=expr, ack=True)
    await pop_nothing(processor, group, "r", wait_ms=0, filter_expression=expr)
    return sorted(b.decode() for b in bodies(got))


async def pull_filtered(processor, expr: FilterExpression) -> list[str]:
    out = []
    for q in range(2):
        offset = 0
        while True:
            r = await processor.pull(CTX, "r", q, offset, 32, filter_expression=expr)
            out += [m.body.decode() for m in r.messages]
            if r.next_offset == offset or r.next_offset >= r.max_offset:
                break
            offset = r.next_offset
    return sorted(out)


TAG_CASES = [
    ("*", ALL),
    ("", ALL),
    ("TagA", ["eu-hot", "us-hot"]),
    ("TagA || TagB", ["eu-cold", "eu-hot", "no-region", "us-hot"]),
    (" TagC ||  TagZ ", ["us-mild"]),
    ("TagZ", []),
    ("TagA || *", ALL),
]

SQL_CASES = [
    ("region = 'eu' AND temp > 30", ["eu-hot"]),
    ("region = 'eu' OR region = 'us'", ["eu-cold", "eu-hot", "us-hot", "us-mild"]),
    ("region IS NULL", ["no-region"]),
    ("city IS NOT NULL AND temp >= 30", ["eu-hot", "untagged", "us-hot"]),
    ("temp BETWEEN 20 AND 35", ["eu-hot", "no-region", "untagged", "us-mild"]),
    ("temp NOT BETWEEN 20 AND 35", ["eu-cold", "us-hot"]),
    ("region IN ('eu', 'ap')", ["eu-cold", "eu-hot", "untagged"]),
    ("region NOT IN ('eu', 'ap')", ["us-hot", "us-mild"]),  # unknown for a missing region
    ("city LIKE 'B%'", ["eu-hot", "untagged"]),
    ("city LIKE 'Ber_'", ["untagged"]),
    ("city NOT LIKE 'B%'", ["eu-cold", "us-hot"]),
    ("TAGS = 'TagB' AND temp > 10", ["no-region"]),
    ("NOT (temp > 10)", ["eu-cold"]),
    ("temp > 100", []),
]


@pytest.mark.parametrize("expr,expected", TAG_CASES, ids=[c[0] or "empty" for c in TAG_CASES])
async def test_tag_filter_on_pop_and_pull(processor, expr, expected):
    await readings_topic(processor)
    if expected:
        assert await pop_filtered(processor, "g", tags(expr), len(expected)) == expected
    else:
        await pop_nothing(processor, "g", "r", wait_ms=0, filter_expression=tags(expr))
    assert await pull_filtered(processor, tags(expr)) == expected


@pytest.mark.parametrize("expr,expected", SQL_CASES, ids=[c[0] for c in SQL_CASES])
async def test_sql92_filter_on_pop_and_pull(processor, expr, expected):
    await readings_topic(processor)
    if expected:
        assert await pop_filtered(processor, "g", sql(expr), len(expected)) == expected
    else:
        await pop_nothing(processor, "g", "r", wait_ms=0, filter_expression=sql(expr))
    assert await pull_filtered(processor, sql(expr)) == expected


async def test_groups_with_different_filters_share_a_topic(processor):
    await readings_topic(processor)
    assert await pop_filtered(processor, "eu", sql("region = 'eu'"), 2) == ["eu-cold", "eu-hot"]
    assert await pop_filtered(processor, "a", tags("TagA"), 2) == ["eu-hot", "us-hot"]
    assert await pop_filtered(processor, "all", tags("*"), 6) == ALL


async def test_pull_skips_non_matching_messages_and_reports_where_to_go_on(processor):
    await processor.create_topic(CTX, "one", queues=1)
    await processor.send(CTX, [msg("one", f"m{i}", tag="keep" if i % 10 == 9 else "skip") for i in range(50)])
    r = await processor.pull(CTX, "one", 0, 0, 2, filter_expression=tags("keep"))
    assert [(m.body, m.queue_offset) for m in r.messages] == [(b"m9", 9), (b"m19", 19)]
    assert r.next_offset == 20
    r = await processor.pull(CTX, "one", 0, 41, 10, filter_expression=tags("keep"))
    assert [m.body for m in r.messages] == [b"m49"] and r.next_offset == 50


async def test_a_retried_message_is_filtered_the_same_way(processor):
    await readings_topic(processor)
    expr = sql("region = 'us' AND temp > 30")
    [p] = await pop_until(processor, "g", "r", 1, filter_expression=expr, invisible_ms=100)
    assert p.message.body == b"us-hot"
    [again] = await pop_until(processor, "g", "r", 1, filter_expression=expr)
    assert again.message.body == b"us-hot" and again.delivery_attempt == 2
    assert again.message.properties["city"] == "Austin"


async def test_filters_apply_to_fifo_and_delay_topics_too(processor):
    await processor.create_topic(CTX, "f", queues=1, message_type="FIFO")
    await processor.send(
        CTX, [msg("f", f"{i}", tag="A" if i % 2 else "B", message_group="one") for i in range(6)]
    )
    got = []
    for _ in range(3):
        [p] = await pop_until(processor, "g", "f", 1, filter_expression=tags("A"))
        got.append(p.message.body)
        await processor.ack(CTX, "g", "f", p.receipt_handle)
    assert got == [b"1", b"3", b"5"]


BAD = [
    sql("region = "),
    sql("region = 'eu"),
    sql("temp >> 3"),
    sql("AND"),
    sql(""),
    sql("region IN ()"),
    tags("||"),
    FilterExpression("x", "REGEX"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("expr", BAD, ids=[f"{e.type}:{e.expression}" for e in BAD])
async def test_bad_filter_expression_is_a_client_error(processor, expr):
    await processor.create_topic(CTX, "r", queues=1)
    with pytest.raises(IllegalFilterExpressionError) as e:
        await processor.pop(CTX, "g", "r", 1, 1000, filter_expression=expr, wait_ms=5000)
    assert isinstance(e.value, BadRequestError)
    assert e.value.code == "ILLEGAL_FILTER_EXPRESSION"
    assert str(e.value)
    with pytest.raises(IllegalFilterExpressionError):
        await processor.pull(CTX, "r", 0, 0, 1, filter_expression=expr)

