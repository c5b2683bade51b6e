"""The batch hot path maps events exactly like the careful (SDK-validated) path, or defers to it.

``batch.plain_event_message`` may answer None ("let the careful path decide")
for any event, but when it answers a message, that message must equal what
``mapping.message_from_event_dict`` builds, and it must never accept an event
the careful path (the SDK's validation) refuses. Checked on hand-picked edge
cases and on generated events, and through ``messages_from_batch`` so a batch
error names the same event and says the same thing as before.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.cloudevents.batch import messages_from_batch, plain_event_message
from adapters.cloudevents.mapping import CloudEventError, message_from_event_dict

BASE = {"specversion": "1.0", "id": "e-1", "source": "/src", "type": "com.example.t"}


def _shape(m: Any) -> tuple:
    return (m.topic, bytes(m.body), m.tag, list(m.properties.items()), m.message_group, m.protocol, m.keys,
            m.message_id, m.delivery_time_ms)


def _careful(d: Any) -> tuple | str:
    try:
        return _shape(message_from_event_dict("t", d))
    except CloudEventError as e:
        return f"error: {e}"


def _check(d: Any) -> bool:
    """Asserts the contract for one event; True when the fast path took it."""
    fast = plain_event_message("t", d)
    careful = _careful(d)
    if fast is None:
        return False
    assert not isinstance(careful, str), f"fast path accepted an event the SDK refuses: {d!r} ({careful})"
    assert _shape(fast) == careful
    return True


EDGE_CASES: list[dict[str, Any]] = [
    BASE,
    {**BASE, "time": "2018-04-05T03:56:24Z", "datacontenttype": "application/json", "data": {"a": [1, 2.5, None]}},
    {**BASE, "datacontenttype": "text/plain", "data": "plain text"},
    {**BASE, "datacontenttype": "application/cloudevents+json; charset=utf-8", "data": "a JSON string"},
    {**BASE, "data": "no content type: JSON string"},
    {**BASE, "subject": "s", "dataschema": "https://x/y", "partitionkey": "pk-1", "traceparent": "00-1-2-01"},
    {**BASE, "partitionkey": ""},
    {**BASE, "data": 2**70},  # beyond orjson's integers
    {**BASE, "data": None},
    {**BASE, "data_base64": "AAEC"},
    {**BASE, "data_base64": "!!"},
    {**BASE, "data": 1, "data_base64": "AAEC"},
    {**BASE, "specversion": "0.3"},
    {**BASE, "specversion": 1.0},
    {**BASE, "id": ""},
    {**BASE, "id": 5},
    {**BASE, "source": None},
    {**BASE, "subject": ""},
    {**BASE, "datacontenttype": ""},
    {**BASE, "time": "yesterday"},
    {**BASE, "time": "2018-04-05T03:56:24"},  # no offset
    {**BASE, "time": "2018-04-05T03:56:24.123456789+02:00"},  # nanoseconds: dateutil's business
    {**BASE, "time": 17},
    {**BASE, "Bad_Ext": "x"},
    {**BASE, "ext\n": "x"},
    {**BASE, "": "x"},
    {**BASE, "count": 3, "flag": True},
    {**BASE, "count": 3.5},
    {**BASE, "nested": {"a": 1}},
    {"id": "e", "source": "/s", "type": "t"},
    {"specversion": "1.0", "source": "/s", "type": "t"},
]


@pytest.mark.parametrize("event", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_edge_cases_match_the_careful_path(event: dict[str, Any]) -> None:
    _check(event)


def test_plain_events_take_the_fast_path() -> None:
    assert _check({**BASE, "time": "2018-04-05T03:56:24Z", "datacontenttype": "application/json", "data": {"x": 1}})
    assert _check({**BASE, "subject": "s", "region": "eu", "datacontenttype": "text/plain", "data": "t"})


_names = st.sampled_from(["specversion", "id", "source", "type", "subject", "time", "datacontenttype",
                          "dataschema", "data", "data_base64", "partitionkey", "ext1", "Ext", "e_x", ""])
_values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=False),
    st.sampled_from(["", "1.0", "0.3", "2018-04-05T03:56:24Z", "2018-04-05T03:56:24", "AAEC", "!!",
                     "application/json", "text/plain", "text/plain; charset=utf-8"]),
    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(extra=st.dictionaries(_names, _values, max_size=6), drop=st.sets(st.sampled_from(list(BASE)), max_size=2))
def test_generated_events_match_the_careful_path(extra: dict[str, Any], drop: set[str]) -> None:
    d = {k: v for k, v in BASE.items() if k not in drop}
    d.update(extra)
    _check(d)


def test_batch_errors_are_the_careful_paths() -> None:
    good = dict(BASE)
    bad = {**BASE, "id": ""}
    with pytest.raises(CloudEventError) as e:
        messages_from_batch("t", orjson.dumps([good, good, bad]), 100)
    with pytest.raises(CloudEventError) as e2:
        message_from_event_dict("t", bad, "event 2: ")
    assert str(e.value) == str(e2.value) and str(e.value).startswith("event 2: ")
    with pytest.raises(CloudEventError, match="event 1: a CloudEvent in JSON format must be a JSON object"):
        messages_from_batch("t", b'[{"specversion":"1.0","id":"1","source":"/s","type":"t"}, 5]', 100)
    with pytest.raises(CloudEventError, match="at most 2 events"):
        messages_from_batch("t", orjson.dumps([good] * 3), 2)
    with pytest.raises(CloudEventError, match="JSON array"):
        messages_from_batch("t", b'{"a": 1}', 100)
    msgs = messages_from_batch("t", orjson.dumps([good, {**BASE, "data_base64": "AAEC"}]), 100)
    assert [bytes(m.body) for m in msgs] == [b"", b"\x00\x01\x02"]
    assert msgs[1].properties["ce_data_base64"] == "true"


def test_event_id_as_key_on_both_paths() -> None:
    events = [dict(BASE), {**BASE, "id": "e-2", "data_base64": "AAEC"}, {**BASE, "id": "nul\0id"}]
    msgs = messages_from_batch("t", orjson.dumps(events), 100, key_by_id=True)
    assert [m.keys for m in msgs] == [("e-1",), ("e-2",), ()]  # the 2nd took the careful path; NUL: unindexed
    assert [m.keys for m in messages_from_batch("t", orjson.dumps(events), 100)] == [(), (), ()]


def test_batch_answer_shape() -> None:
    from adapters.cloudevents.http_app import send_json, send_list_json
    from gateway.processor import SendResult

    results = [SendResult(f"ID{i}", "t/x", "broker-a", i, 10 + i, None) for i in range(3)]
    assert send_list_json(results) == [send_json(r) for r in results]
    assert list(send_list_json(results)[0]) == ["message_id", "topic", "queue_id", "queue_offset"]
