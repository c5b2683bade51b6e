"""CloudEvents 1.0 <-> unified messages, both ways (sans-io: bytes and dicts in, objects out).

Ingest: the HTTP binding's three modes (binary ``ce-*`` headers, structured
``application/cloudevents+json``, batch ``application/cloudevents-batch+json``)
become :class:`core_broker.model.Message` objects whose properties carry the
context attributes as ``ce_<attribute>`` (``ce_id``, ``ce_source``,
``ce_type``, ``ce_subject``, ``ce_time``, ``ce_datacontenttype``,
``ce_dataschema`` and every extension). The event's data is the message body,
byte for byte in binary mode. The ``type`` is also the message tag (so tag
filters select by type) and the ``id`` a message key (so query-by-key finds an
event by its id; the door applies :func:`key_by_event_id` when
``http_index_event_ids`` is on); the ``partitionkey`` extension is the message
group.

Egress: *any* stored message, whatever door it came in by, becomes a valid
CloudEvent. Attributes a CloudEvents producer set are given back; for other
messages they are derived from the protocol (MQTT: source names the client,
subject the MQTT topic; AMQP: source the exchange, subject the routing key;
gRPC: source the producer, subject the tag). See the README's mapping table.

The ``cloudevents`` SDK does the binding work: header percent-decoding and
encoding, attribute validation (types, empty values, extension names),
binary/structured serialization. Three things are done here on purpose:

* required attributes are checked *before* the SDK builds an event, because
  its constructor silently fills in a missing ``id``, ``specversion`` and
  ``time``, which would hide a producer's mistake;
* ``time`` is parsed with :func:`datetime.fromisoformat` (RFC 3339 in Python
  3.11) and only falls back to the SDK's dateutil parser, which is several
  times slower on the batch hot path; the original string is what is stored;
* the SDK has no batch format, so a batch is one JSON decode and then, per
  element, a strict plain-event check (``batch.py``) that hands anything
  unusual or invalid to the SDK's event validation here.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping
from urllib.parse import quote, unquote

from cloudevents.core.bindings import http as ce_http
from cloudevents.core.exceptions import BaseCloudEventException, CloudEventValidationError
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
import orjson
from dateutil.parser import isoparse

from core_broker.errors import BadRequestError
from core_broker.model import Message
from gateway.naming import CE_MQTT_TOPIC_EXTENSION, P_MQTT_QOS, P_MQTT_TOPIC

__all__ = [
    "CE_BATCH_CONTENT_TYPE",
    "CE_JSON_CONTENT_TYPE",
    "CloudEventError",
    "event_attributes",
    "key_by_event_id",
    "message_from_binary",
    "message_from_event_dict",
    "message_from_structured",
    "to_cloudevent",
    "to_binary_http",
    "to_structured_json",
]

CE_JSON_CONTENT_TYPE = "application/cloudevents+json"
CE_BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
SPECVERSION = "1.0"
PREFIX = "ce_"
# Set on messages whose structured event carried ``data_base64``: egress gives it back the same way.
P_DATA_BASE64 = "ce_data_base64"
REQUIRED = ("id", "source", "type", "specversion")
# Context attributes other than extensions (CloudEvents 1.0 core).
CORE_ATTRIBUTES = frozenset(("id", "source", "type", "specversion", "datacontenttype", "dataschema", "subject", "time"))
_EXT_NAME = re.compile(r"^[a-z0-9]{1,64}$")
_JSON_CT = re.compile(r"^(application|text)/([a-zA-Z0-9\-.]+\+)?json(;.*)?$", re.I)
_TEXT_CT = re.compile(r"^(text/|application/(xml|[a-zA-Z0-9\-.]+\+xml|x-www-form-urlencoded|javascript)($|;))", re.I)

# Where other doors put what the CloudEvent of their messages needs. Several
# spellings are accepted so the mapping does not depend on one door's choice.
MQTT_TOPIC_PROPS = (P_MQTT_TOPIC, "mqtt.topic", "MQTT_TOPIC")
MQTT_CLIENT_PROPS = ("mqtt_client_id", "mqtt.client_id", "client_id")
AMQP_EXCHANGE_PROPS = ("amqp_exchange", "amqp.exchange", "exchange")
AMQP_ROUTING_KEY_PROPS = ("amqp_routing_key", "amqp.routing_key", "routing_key")
AMQP_APP_PROPS = ("amqp_app_id", "amqp.app_id", "app_id")
AMQP_VHOST_PROPS = ("amqp_vhost", "amqp.vhost", "vhost")
CLIENT_PROPS = ("client_id", "producer_group", "grpc_client_id", "grpc.client_id")
CONTENT_TYPE_PROPS = ("content_type", "content-type", "contentType", "mqtt_content_type", "amqp_content_type",
                      "amqp.content_type")

EVENT_TYPES = {
    "mqtt": "io.unimq.mqtt.publish",
    "amqp": "io.unimq.amqp.publish",
    "grpc": "io.unimq.grpc.message",
    "http": "io.unimq.http.message",
    "cloudevents": "io.unimq.http.message",
}

_JSON_FORMAT = JSONFormat()


class CloudEventError(BadRequestError):
    """The request is not a valid CloudEvent (HTTP 400)."""

    code = "INVALID_CLOUDEVENT"


class _RawDataFormat(JSONFormat):
    """The SDK's JSON format, except that binary-mode data stays the exact bytes sent."""

    def read_data(self, body: bytes, datacontenttype: str | None) -> bytes | None:  # type: ignore[override]
        return body or None


_RAW_FORMAT = _RawDataFormat()

_CE_MQTT_TOPIC = "ce_" + CE_MQTT_TOPIC_EXTENSION


def route_to_mqtt(props: dict[str, str]) -> None:
    """An event with the ``mqtttopic`` extension reaches MQTT subscribers of that topic and AMQP
    queues bound to ``amq.topic`` (which route on ``mqtt_topic``): a cloud service commanding a
    device. The value must be an MQTT topic name (no wildcards)."""
    t = props.get(_CE_MQTT_TOPIC)
    if t is None:
        return
    if not t or "+" in t or "#" in t or "\0" in t or len(t.encode()) > 65535:
        raise CloudEventError(f"extension {CE_MQTT_TOPIC_EXTENSION!r} must be an MQTT topic name without wildcards, got {t!r}")
    props[P_MQTT_TOPIC] = t
    props.setdefault(P_MQTT_QOS, "1")


# ------------------------------------------------------------------------------ ingest


def _parse_time(value: Any) -> datetime:
    if not isinstance(value, str) or not value:
        raise CloudEventError("attribute 'time' must be an RFC 3339 timestamp string")
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        try:
            t = isoparse(value)
        except (ValueError, OverflowError):
            raise CloudEventError(f"attribute 'time' is not an RFC 3339 timestamp: {value[:64]!r}") from None
    if t.tzinfo is None:
        raise CloudEventError(f"attribute 'time' must carry a time zone offset (RFC 3339): {value[:64]!r}")
    return t


def _validate(attrs: dict[str, Any]) -> None:
    """The SDK's validation of a 1.0 event (types, empty values, extension names)."""
    try:
        CloudEvent._validate_attribute(attributes=attrs)  # what CloudEvent(attrs) runs, minus its defaults
    except CloudEventValidationError as e:
        raise CloudEventError(_validation_message(e)) from None
    except BaseCloudEventException as e:
        raise CloudEventError(str(e)) from None


def _validation_message(e: CloudEventValidationError) -> str:
    parts = []
    for name, errs in e.errors.items():
        parts.append(f"{name}: {'; '.join(str(x) for x in errs)}")
    return "invalid CloudEvent: " + ", ".join(parts)


def _check_required(present: Iterable[str], where: str = "") -> None:
    have = set(present)
    missing = [a for a in REQUIRED if a not in have]
    if missing:
        raise CloudEventError(f"{where}missing required attribute{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")


def _check_specversion(value: Any, where: str = "") -> None:
    if value != SPECVERSION:
        raise CloudEventError(f"{where}unsupported specversion {value!r}: unimq accepts CloudEvents {SPECVERSION}")


def _ext_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    raise CloudEventError(f"attribute {name!r} must be a string, an integer or a boolean")


def _message(
    topic: str,
    body: bytes,
    attrs: Mapping[str, Any],
    time_raw: str | None,
    extra_props: dict[str, str] | None = None,
) -> Message:
    props: dict[str, str] = {}
    for k, v in attrs.items():
        if k == "specversion" or k == "time" or v is None:
            continue
        props[PREFIX + k] = v if isinstance(v, str) else _ext_value(k, v)
    if time_raw is not None:
        props["ce_time"] = time_raw
    if extra_props:
        props.update(extra_props)
    route_to_mqtt(props)
    pk = props.get("ce_partitionkey")
    return Message(
        topic,
        body,
        tag=props["ce_type"],
        properties=props,
        message_group=pk or None,
        protocol="cloudevents",
    )


def message_from_binary(topic: str, headers: Mapping[str, str], body: bytes) -> Message:
    """Binary content mode: attributes in ``ce-*`` headers, data is the body (kept byte for byte)."""
    hdrs: dict[str, str] = {}
    names = []
    time_raw = None
    for k, v in headers.items():
        lk = k.lower()
        if lk.startswith("ce-"):
            names.append(lk[3:])
            if lk == "ce-time":  # parsed here (fromisoformat), not by the SDK's slower dateutil path
                time_raw = unquote(v)
                _parse_time(time_raw)
            else:
                hdrs[lk] = v
        elif lk == "content-type":
            hdrs[lk] = v
    _check_required(names)
    _check_specversion(hdrs["ce-specversion"].strip())
    for n in names:
        if not _EXT_NAME.match(n):
            raise CloudEventError(
                f"header 'ce-{n}': attribute names are lowercase letters and digits only (1 to 64 characters)"
            )
    try:
        ev = ce_http.from_binary(ce_http.HTTPMessage(hdrs, body), _RAW_FORMAT, CloudEvent)
    except CloudEventValidationError as e:
        raise CloudEventError(_validation_message(e)) from None
    except (ValueError, OverflowError) as e:  # e.g. an unparsable ce-time
        raise CloudEventError(f"invalid CloudEvent header: {e}") from None
    except BaseCloudEventException as e:
        raise CloudEventError(str(e)) from None
    attrs = dict(ev.get_attributes())
    attrs.pop("time", None)  # the SDK's own default when ce-time is absent; the header's value is time_raw
    return _message(topic, body, attrs, time_raw)


def message_from_event_dict(topic: str, d: Any, where: str = "") -> Message:
    """One structured-mode event (a decoded JSON object) as a message: the careful path.

    Structured single events always come here, and so does any batch member
    that ``batch.plain_event_message`` cannot prove valid; the SDK's validator
    decides, so its errors are the ones clients see. One pass over the
    members builds both the attributes the SDK validates and the message
    properties (a JSON ``null`` member counts as absent).
    """
    if type(d) is not dict:
        raise CloudEventError(f"{where}a CloudEvent in JSON format must be a JSON object")
    check: dict[str, Any] = {}
    props: dict[str, str] = {}
    time_raw = data = b64 = None
    has_data = False
    for k, v in d.items():
        if v is None:
            continue
        if k == "data":
            data, has_data = v, True
        elif k == "data_base64":
            b64 = v
        elif k == "time":
            time_raw = v
        else:
            check[k] = v
            if k != "specversion":
                if isinstance(v, str):
                    props["ce_" + k] = v
                elif k in CORE_ATTRIBUTES:
                    props["ce_" + k] = v  # a wrong type: the SDK's validation below names it
                else:
                    try:
                        props["ce_" + k] = _ext_value(k, v)
                    except CloudEventError as e:
                        raise CloudEventError(f"{where}extension {e}") from None
    if "id" not in check or "source" not in check or "type" not in check or "specversion" not in check:
        _check_required(check, where)
    if check["specversion"] != SPECVERSION:
        _check_specversion(check["specversion"], where)
    if has_data and b64 is not None:
        raise CloudEventError(f"{where}an event carries 'data' or 'data_base64', not both")
    # The SDK would invent a time when there is none; validate with a placeholder instead.
    check["time"] = _parse_time(time_raw) if time_raw is not None else _EPOCH
    try:
        _validate(check)
    except CloudEventError as e:
        raise CloudEventError(f"{where}{e}") from None
    if time_raw is not None:
        props["ce_time"] = time_raw
    ct = check.get("datacontenttype")
    if b64 is not None:
        if not isinstance(b64, str):
            raise CloudEventError(f"{where}'data_base64' must be a base64 string")
        try:
            body = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise CloudEventError(f"{where}'data_base64' is not valid base64") from None
        props[P_DATA_BASE64] = "true"
    elif not has_data:
        body = b""
    elif isinstance(data, str) and ct is not None and not _JSON_CT.match(ct):
        body = data.encode()
    else:
        body = _dump_data(data)
    route_to_mqtt(props)
    return Message(topic, body, tag=props["ce_type"], properties=props,
                   message_group=props.get("ce_partitionkey") or None, protocol="cloudevents")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _dump_data(data: Any) -> bytes:
    try:
        return orjson.dumps(data)
    except TypeError:  # e.g. an integer beyond 64 bits, which orjson does not take
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass  # the standard library takes a few things orjson refuses (huge integers), and words errors well
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise CloudEventError("the body is not UTF-8 encoded JSON") from None
    except json.JSONDecodeError as e:
        raise CloudEventError(f"invalid JSON: {e}") from None
    except RecursionError:
        raise CloudEventError("invalid JSON: nested too deeply") from None


def key_by_event_id(m: Message) -> None:
    """Make the event's ``id`` the message's key, so query by key (and ``GET .../events?id=``) finds it.

    Keys are stored NUL-joined, so an id holding a NUL character is left unindexed.
    """
    ce_id = m.properties.get("ce_id")
    if ce_id and "\0" not in ce_id:
        m.keys = (ce_id,)


def message_from_structured(topic: str, body: bytes) -> Message:
    """Structured content mode: one event as a JSON object (``data`` or ``data_base64``)."""
    return message_from_event_dict(topic, _loads(body))


# ------------------------------------------------------------------------------ egress


def _first(props: Mapping[str, str], names: Iterable[str]) -> str | None:
    for n in names:
        v = props.get(n)
        if v:
            return v
    return None


def _ms_to_time(ms: int) -> str:
    t = datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def event_attributes(m: Message) -> dict[str, str]:
    """The CloudEvent context attributes of a stored message (strings; see the README's table)."""
    props = m.properties
    attrs: dict[str, str] = {"specversion": SPECVERSION}
    for k, v in props.items():
        if k.startswith(PREFIX):
            name = k[3:]
            if _EXT_NAME.match(name) and name != "specversion":
                attrs[name] = v
    proto = m.protocol or "internal"
    if "id" not in attrs:
        attrs["id"] = (proto == "amqp" and props.get("amqp_message_id")) or m.message_id
    if "type" not in attrs:
        attrs["type"] = (proto == "amqp" and props.get("amqp_type")) or EVENT_TYPES.get(
            proto, f"io.unimq.{proto}.message"
        )
    if "source" not in attrs:
        attrs["source"] = _source(proto, props, m)
    if "subject" not in attrs and proto != "cloudevents":
        subject = _subject(proto, props, m)
        if subject:
            attrs["subject"] = subject
    if "time" not in attrs and m.born_timestamp_ms:
        attrs["time"] = _ms_to_time(m.born_timestamp_ms)
    if "datacontenttype" not in attrs:
        ct = _first(props, CONTENT_TYPE_PROPS)
        if ct:
            attrs["datacontenttype"] = ct
    if "partitionkey" not in attrs and m.message_group:
        attrs["partitionkey"] = m.message_group
    # Plain properties whose names are valid extension names travel as extensions.
    if proto != "cloudevents":
        for k, v in props.items():
            if k not in attrs and k not in CORE_ATTRIBUTES and _EXT_NAME.match(k):
                attrs[k] = v
    return attrs


def _q(s: str) -> str:
    return quote(s, safe="")


def _source(proto: str, props: Mapping[str, str], m: Message) -> str:
    host = m.born_host or "unknown"
    if host.count(":") == 1:  # "host:port" of a TCP peer: the port is noise for an event source
        host = host.partition(":")[0]
    if proto == "mqtt":
        return f"/mqtt/{_q(_first(props, MQTT_CLIENT_PROPS) or host)}"
    if proto == "amqp":
        vhost = _first(props, AMQP_VHOST_PROPS) or "/"
        exchange = _first(props, AMQP_EXCHANGE_PROPS) or "amq.default"
        app = _first(props, AMQP_APP_PROPS)
        src = f"/amqp/{_q(vhost)}/{_q(exchange)}"
        return src + (f"/{_q(app)}" if app else "")
    if proto == "grpc":
        return f"/grpc/{_q(_first(props, CLIENT_PROPS) or host)}"
    return f"/{_q(proto)}/{_q(host)}"


def _subject(proto: str, props: Mapping[str, str], m: Message) -> str | None:
    if proto == "mqtt":
        return _first(props, MQTT_TOPIC_PROPS) or m.topic
    if proto == "amqp":
        return _first(props, AMQP_ROUTING_KEY_PROPS) or m.tag
    return m.tag or None


def _data_for_structured(m: Message, ct: str | None) -> Any:
    body = m.body
    if not body:
        return None
    if m.properties.get(P_DATA_BASE64):
        return bytes(body)
    if ct is None or _JSON_CT.match(ct):
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            if ct is not None:
                return bytes(body)
    if ct is None or _TEXT_CT.match(ct):
        try:
            return body.decode("utf-8") if ct is not None else bytes(body)
        except UnicodeDecodeError:
            return bytes(body)
    return bytes(body)


def to_cloudevent(m: Message, extensions: Mapping[str, str | int] | None = None, binary: bool = False) -> CloudEvent:
    """The SDK CloudEvent of any stored message (``binary``: data is the exact body bytes)."""
    attrs: dict[str, Any] = dict(event_attributes(m))
    if extensions:
        attrs.update(extensions)
    t = attrs.pop("time", None)
    dt: datetime | None = None
    if t is not None:
        try:
            dt = _parse_time(t)
        except CloudEventError:
            dt = None
    if dt is None and m.born_timestamp_ms:
        dt = datetime.fromtimestamp(m.born_timestamp_ms / 1000.0, tz=timezone.utc)
    attrs["time"] = dt if dt is not None else _EPOCH
    ct = attrs.get("datacontenttype")
    data = (bytes(m.body) or None) if binary else _data_for_structured(m, ct)
    try:
        return CloudEvent(attrs, data)
    except CloudEventValidationError:
        # A property that is not a valid attribute value (e.g. an empty subject): drop the extras.
        keep = {k: attrs[k] for k in ("id", "source", "type", "specversion", "time") if attrs.get(k)}
        keep.setdefault("id", m.message_id or "unknown")
        keep.setdefault("source", "/unimq")
        keep.setdefault("type", "io.unimq.message")
        return CloudEvent(keep, data)


def to_structured_json(m: Message, extensions: Mapping[str, str | int] | None = None) -> bytes:
    """One message as a structured-mode CloudEvent (``application/cloudevents+json`` body)."""
    return _JSON_FORMAT.write(to_cloudevent(m, extensions))


def to_binary_http(m: Message, extensions: Mapping[str, str | int] | None = None) -> tuple[dict[str, str], bytes]:
    """One message as a binary-mode HTTP request: (headers, body); the body is the stored bytes."""
    msg = ce_http.to_binary(to_cloudevent(m, extensions, binary=True), _JSON_FORMAT)
    return msg.headers, msg.body
