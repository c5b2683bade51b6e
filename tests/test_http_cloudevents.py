"""CloudEvents through the HTTP door, produced and checked with the `cloudevents` SDK.

Binary, structured and batch mode in; attributes, extensions, datacontenttype
and data_base64 preserved; every stored message, from whatever door, comes
back as a valid CloudEvent (checked by parsing it with the SDK).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from http_helpers import CE_BATCH, CE_JSON, start_server

pytestmark = pytest.mark.timeout(120)

FMT = JSONFormat()


def _sdk_events(array: list[dict]) -> list[CloudEvent]:
    """Parse a JSON array of structured events with the SDK (it validates each one)."""
    return [FMT.read(None, json.dumps(e).encode()) for e in array]


async def test_sdk_binary_structured_and_batch_round_trip(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path, "--set", "http_index_event_ids=true")
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    binary_data = bytes(range(256))
    ev_binary = CloudEvent(
        {"id": "b-1", "source": "/sensors/7", "type": "com.example.reading", "subject": "room-1",
         "time": when, "datacontenttype": "application/octet-stream", "traceparent": "00-abc-def-01",
         "partitionkey": "sensor-7"},
        binary_data,
    )
    ev_struct = CloudEvent(
        {"id": "s-1", "source": "/orders", "type": "com.example.order", "datacontenttype": "application/json",
         "dataschema": "https://example.com/order.json", "region": "eu"},
        {"order": 42, "items": ["a", "b"], "total": 9.5},
    )
    ev_text = CloudEvent({"id": "s-2", "source": "/logs", "type": "com.example.log",
                          "datacontenttype": "text/plain"}, "line one\nline two")
    batch = [
        CloudEvent({"id": f"k-{i}", "source": "/batch", "type": "com.example.batch", "seq": str(i)}, {"i": i})
        for i in range(5)
    ] + [CloudEvent({"id": "k-bin", "source": "/batch", "type": "com.example.batch"}, b"\x00\x01\x02")]

    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        assert (await c.post("/v1/topics", json={"name": "ce", "queues": 1})).status_code == 201
        url = "/v1/topics/ce/events"
        msg = ce_http.to_binary_event(ev_binary)
        r = await c.post(url, headers=msg.headers, content=msg.body)
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"message_id", "topic", "queue_id", "queue_offset"}
        for ev in (ev_struct, ev_text):
            msg = ce_http.to_structured_event(ev)
            r = await c.post(url, headers=msg.headers, content=msg.body)
            assert r.status_code == 200, r.text
        body = b"[" + b",".join(FMT.write(e) for e in batch) + b"]"
        r = await c.post(url, headers={"content-type": CE_BATCH}, content=body)
        assert r.status_code == 200, r.text
        ids = r.json()
        assert isinstance(ids, list) and len(ids) == 6 and [x["queue_offset"] for x in ids] == list(range(3, 9))
        r = await c.post(url, headers={"content-type": CE_BATCH}, content=b"[]")
        assert r.status_code == 200 and r.json() == []

        # the stored messages: ce_* properties, type as tag, id as key, body byte for byte in binary mode
        page = (await c.get("/v1/topics/ce/queues/0/messages", params={"max": 100})).json()
        stored = page["messages"]
        assert len(stored) == 9
        b0 = stored[0]
        assert base64.b64decode(b0["body_base64"]) == binary_data
        assert b0["protocol"] == "cloudevents" and b0["tag"] == "com.example.reading" and b0["keys"] == ["b-1"]
        assert b0["message_group"] == "sensor-7"
        assert b0["properties"] == {
            "ce_id": "b-1", "ce_source": "/sensors/7", "ce_type": "com.example.reading", "ce_subject": "room-1",
            "ce_time": "2024-05-06T07:08:09Z", "ce_datacontenttype": "application/octet-stream",
            "ce_traceparent": "00-abc-def-01", "ce_partitionkey": "sensor-7",
        }
        assert json.loads(base64.b64decode(stored[1]["body_base64"])) == {"order": 42, "items": ["a", "b"], "total": 9.5}
        assert base64.b64decode(stored[2]["body_base64"]) == b"line one\nline two"
        assert base64.b64decode(stored[8]["body_base64"]) == b"\x00\x01\x02"

        # and back out as CloudEvents, parsed by the SDK
        r = await c.post("/v1/topics/ce/groups/g/pop", params={"max": 100}, headers={"accept": CE_BATCH})
        assert r.headers["content-type"].startswith(CE_BATCH)
        events = {e.get_id(): e for e in _sdk_events(r.json())}
        assert len(events) == 9
        e = events["b-1"]
        assert (e.get_source(), e.get_type(), e.get_subject(), e.get_time()) == ("/sensors/7", "com.example.reading",
                                                                                  "room-1", when)
        assert e.get_datacontenttype() == "application/octet-stream"
        assert e.get_extension("traceparent") == "00-abc-def-01" and e.get_extension("partitionkey") == "sensor-7"
        assert e.get_data() == binary_data
        e = events["s-1"]
        assert e.get_data() == {"order": 42, "items": ["a", "b"], "total": 9.5}
        assert e.get_dataschema() == "https://example.com/order.json" and e.get_extension("region") == "eu"
        assert e.get_subject() is None  # nothing invented for a producer's own event
        assert events["s-2"].get_data() == "line one\nline two"
        assert events["k-3"].get_data() == {"i": 3} and events["k-3"].get_extension("seq") == "3"
        assert events["k-bin"].get_data() == b"\x00\x01\x02"
        for ev in events.values():
            assert ev.get_extension("receipthandle") and ev.get_extension("deliveryattempt") == "1"

        # found again by CloudEvents id (the id is the message key), from every mode
        for ce_id, offset in (("b-1", 0), ("s-1", 1), ("k-3", 6)):
            found = (await c.get("/v1/topics/ce/events", params={"id": ce_id})).json()["messages"]
            assert [(m["queue_offset"], m["properties"]["ce_id"]) for m in found] == [(offset, ce_id)]
        r = await c.get("/v1/topics/ce/events", params={"id": "k-3", "source": "/batch"}, headers={"accept": CE_BATCH})
        assert r.status_code == 200 and [e.get_id() for e in _sdk_events(r.json())] == ["k-3"]
        for params in ({"id": "k-3", "source": "/elsewhere"}, {"id": "no-such-id"}):
            r = await c.get("/v1/topics/ce/events", params=params)
            assert r.status_code == 200 and r.json() == {"messages": []}
        assert (await c.get("/v1/topics/ce/events")).status_code == 400
        assert (await c.get("/v1/topics/nope/events", params={"id": "b-1"})).status_code == 404


async def test_event_ids_not_indexed_by_default(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    ev = {"specversion": "1.0", "id": "x-1", "source": "/s", "type": "t"}
    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        assert (await c.post("/v1/topics", json={"name": "noidx", "queues": 1})).status_code == 201
        r = await c.post("/v1/topics/noidx/events", headers={"content-type": CE_BATCH}, content=json.dumps([ev]))
        assert r.status_code == 200, r.text
        stored = (await c.get("/v1/topics/noidx/queues/0/messages")).json()["messages"]
        assert [(m["properties"]["ce_id"], m["keys"]) for m in stored] == [("x-1", [])]
        r = await c.get("/v1/topics/noidx/events", params={"id": "x-1"})
        assert r.status_code == 404 and r.json()["error"] == "EVENT_IDS_NOT_INDEXED"
        assert "http_index_event_ids" in r.json()["message"]


async def test_legacy_sdk_api_binary_and_structured(unimq_server, tmp_path: Path) -> None:
    """The SDK's v1 API (``cloudevents.v1.http``), which most deployed producers still use."""
    from cloudevents.v1.http import CloudEvent as LegacyEvent
    from cloudevents.v1.conversion import to_binary, to_structured
    from cloudevents.v1.http import from_http

    server = start_server(unimq_server, tmp_path)
    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        await c.post("/v1/topics", json={"name": "legacy", "queues": 1})
        for i, conv in enumerate((to_binary, to_structured)):
            ev = LegacyEvent({"type": "com.example.legacy", "source": "/legacy", "id": f"l-{i}"}, {"n": i})
            headers, body = conv(ev)
            r = await c.post("/v1/topics/legacy/events", headers=headers, content=body)
            assert r.status_code == 200, r.text
        r = await c.post("/v1/topics/legacy/groups/g/pop", params={"max": 10}, headers={"accept": CE_BATCH})
        got = sorted(r.json(), key=lambda e: e["id"])
        back = [from_http({"content-type": CE_JSON}, json.dumps(e)) for e in got]
        assert [(b["id"], b.data) for b in back] == [("l-0", {"n": 0}), ("l-1", {"n": 1})]


async def test_messages_from_other_doors_are_valid_cloudevents(tmp_path: Path) -> None:
    """Messages sent through the processor by MQTT, AMQP and gRPC paths, read as CloudEvents over HTTP."""
    from core_broker.model import Message
    from gateway.context import RequestContext
    from gateway.deployment import merged_processor
    from gateway.processor import ProcessorConfig
    from adapters.cloudevents.server import HttpDoor
    from gateway.door import ServerState
    from unimq.settings import load_settings

    settings = load_settings(None, {"http_port": 0, "data_dir": tmp_path / "d", "store.commitlog_segment_size": 1 << 24,
                                    "store.disk_min_free_ratio": 0.0, "store.disk_refuse_free_ratio": 0.0})
    processor = merged_processor(settings.store, settings.broker, ProcessorConfig(default_queue_count=1))
    await processor.start()
    state = ServerState(settings=settings, processor=processor, phase="ready")
    door = HttpDoor(state)
    host, port = await door.start()
    try:
        await processor.send(RequestContext("mqtt", "dev-7", "10.1.2.3:5000"), [Message(
            "sensors", b'{"temp": 21.5}', properties={"mqtt_topic": "sensors/room1/temp", "mqtt_client_id": "dev-7",
                                                      "mqtt_qos": "1"}, protocol="mqtt")])
        await processor.send(RequestContext("amqp", "app", "10.1.2.4:6000"), [Message(
            "sensors", b"<order/>", properties={"amqp_exchange": "orders", "amqp_routing_key": "eu.new",
                                                "amqp_content_type": "application/xml", "amqp_app_id": "shop"},
            protocol="amqp")])
        await processor.send(RequestContext("grpc", "producer-1", "10.1.2.5:7000"), [Message(
            "sensors", b"\x00\xffraw", tag="TagA", keys=["k"], properties={"region": "eu"}, protocol="grpc")])
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as c:
            r = await c.get("/v1/topics/sensors/queues/0/messages", headers={"accept": CE_BATCH})
            mqtt, amqp, grpc = _sdk_events(r.json())
            assert mqtt.get_type() == "io.unimq.mqtt.publish"
            assert mqtt.get_source() == "/mqtt/dev-7" and mqtt.get_subject() == "sensors/room1/temp"
            assert mqtt.get_data() == {"temp": 21.5} and isinstance(mqtt.get_time(), datetime)
            assert amqp.get_type() == "io.unimq.amqp.publish" and amqp.get_source() == "/amqp/%2F/orders/shop"
            assert amqp.get_subject() == "eu.new" and amqp.get_datacontenttype() == "application/xml"
            assert amqp.get_data() == "<order/>"
            assert grpc.get_type() == "io.unimq.grpc.message" and grpc.get_source() == "/grpc/10.1.2.5"
            assert grpc.get_subject() == "TagA" and grpc.get_extension("region") == "eu"
            assert grpc.get_data() == b"\x00\xffraw"
            ids = [m.get_id() for m in (mqtt, amqp, grpc)]
            assert len(set(ids)) == 3 and all(ids)
            # the JSON view names the door each came in by
            page = (await c.get("/v1/topics/sensors/queues/0/messages")).json()
            assert [m["protocol"] for m in page["messages"]] == ["mqtt", "amqp", "grpc"]
    finally:
        await door.stop()
        await processor.stop()
