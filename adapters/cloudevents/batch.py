"""Batched CloudEvents (``application/cloudevents-batch+json``) into messages: the ingest hot path.

Why a separate fast path: a batch of 100 events spends most of its mapping
time in per-event generality (the SDK's attribute validation builds error
dictionaries and runs a regex per extension, every member goes through a
chain of type dispatches). Almost every real event is plain: string
attributes, a known ``specversion``, an RFC 3339 ``time``, JSON ``data``.

:func:`plain_event_message` handles exactly those, with checks that are
*stricter* than the SDK's validation (every attribute a non-empty ``str``,
extension names ``[a-z0-9]+`` with nothing trailing, ``time`` accepted only
when :func:`datetime.fromisoformat` parses it with an offset). When it is
unsure it answers ``None`` and the event takes the careful path
(:func:`mapping.message_from_event_dict`: the SDK's validator of record), so
an invalid event gets exactly the error it always got, and a valid but
unusual one (``data_base64``, integer or boolean extensions, JSON ``null``
members, a ``time`` only dateutil parses) is still accepted. The message
built is the one the careful path builds for the same event: the same body
bytes, the same properties in the same order, the same tag and group.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import orjson

from core_broker.model import Message

from .mapping import (
    CloudEventError, _JSON_CT, _dump_data, _loads, key_by_event_id, message_from_event_dict, route_to_mqtt,
)

__all__ = ["messages_from_batch", "plain_event_message"]

# Attribute name -> message property, for the string attributes other than specversion and time.
_STRING_ATTRS = {
    "id": "ce_id",
    "source": "ce_source",
    "type": "ce_type",
    "subject": "ce_subject",
    "datacontenttype": "ce_datacontenttype",
    "dataschema": "ce_dataschema",
}
# Extension names already seen valid -> their property key (bounded: names come from clients).
_ext_keys: dict[str, str] = {}
_EXT_KEYS_MAX = 4096
_EXT_NAME = re.compile(r"[a-z0-9]+")  # the SDK's rule, matched in full (the SDK's "$" lets a trailing \n by)
_RESERVED = frozenset(("specversion", "time", "data", "data_base64"))
# datacontenttype -> whether string data is stored as JSON text (bounded the same way).
_json_ct: dict[str, bool] = {}
_fromisoformat = datetime.fromisoformat
_dumps = orjson.dumps


def _ext_key(name: str) -> str | None:
    """``ce_<name>`` if ``name`` is a valid extension name, else None (the careful path decides)."""
    if name in _RESERVED or name in _STRING_ATTRS or not _EXT_NAME.fullmatch(name):
        return None
    key = "ce_" + name
    if len(_ext_keys) < _EXT_KEYS_MAX:
        _ext_keys[name] = key
    return key


def _is_json_ct(ct: str) -> bool:
    r = _json_ct.get(ct)
    if r is None:
        r = _JSON_CT.match(ct) is not None
        if len(_json_ct) < 256:
            _json_ct[ct] = r
    return r


def plain_event_message(topic: str, d: dict[str, Any], key_by_id: bool = False) -> Message | None:
    """The message of a plain, valid structured event, or None when the careful path must decide.

    ``d`` is a decoded JSON object. None never means "invalid", only "not provably valid here".
    ``key_by_id``: the event's ``id`` becomes the message key (what ``mapping.key_by_event_id`` does).
    """
    props: dict[str, str] = {}
    specversion = False
    time_raw = None
    has_data = False
    data: Any = None
    for k, v in d.items():
        key = _STRING_ATTRS.get(k)
        if key is not None:
            if type(v) is not str or not v:
                return None
            props[key] = v
        elif k == "specversion":
            if v != "1.0":
                return None
            specversion = True
        elif k == "data":
            if v is None:
                return None
            data, has_data = v, True
        elif k == "time":
            if type(v) is not str:
                return None
            time_raw = v
        else:
            key = _ext_keys.get(k) or _ext_key(k)
            if key is None or type(v) is not str:
                return None
            props[key] = v
    if not specversion or "ce_id" not in props or "ce_source" not in props or "ce_type" not in props:
        return None
    if time_raw is not None:
        try:
            if _fromisoformat(time_raw).tzinfo is None:
                return None
        except ValueError:
            return None
        props["ce_time"] = time_raw
    if not has_data:
        body = b""
    else:
        ct = props.get("ce_datacontenttype")
        if type(data) is str and ct is not None and not _is_json_ct(ct):
            body = data.encode()
        else:
            try:
                body = _dumps(data)
            except TypeError:  # e.g. an integer beyond 64 bits: the careful path's encoder takes it
                body = _dump_data(data)
    ce_id = props["ce_id"]
    route_to_mqtt(props)
    return Message(topic, body, tag=props["ce_type"], properties=props,
                   keys=(ce_id,) if key_by_id and "\0" not in ce_id else (),
                   message_group=props.get("ce_partitionkey") or None, protocol="cloudevents")


def messages_from_batch(topic: str, body: bytes, max_batch: int, key_by_id: bool = False) -> list[Message]:
    """Batched content mode: a JSON array of structured events, decoded once.

    ``key_by_id``: each event's ``id`` becomes its message key (``http_index_event_ids``).
    """
    arr = _loads(body)
    if type(arr) is not list:
        raise CloudEventError("a CloudEvents batch must be a JSON array of events")
    if len(arr) > max_batch:
        raise CloudEventError(f"a batch holds at most {max_batch} events, this one {len(arr)}")
    out = []
    add = out.append
    for i, d in enumerate(arr):
        m = plain_event_message(topic, d, key_by_id) if type(d) is dict else None
        if m is None:
            m = message_from_event_dict(topic, d, f"event {i}: ")
            if key_by_id:
                key_by_event_id(m)
        add(m)
    return out
