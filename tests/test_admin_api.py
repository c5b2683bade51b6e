"""The JSON admin API (/v1/admin) against a real `unimq up`, driven by real clients (paho, pika, HTTP).

Every action the console offers is exercised here: overview counters, topics and groups with
paging and filters, offset resets (to an offset and to a time), resending dead letters, clients
of every door and disconnecting them, message search by id, key and time, the cluster view,
the new /metrics families, and the console's static files.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pika
import pytest

from adapters.cloudevents.admin_views import RateMeter, page
from gateway.clients import ClientInfo, ClientRegistry
from tests.conftest import REPO_ROOT
from polling import wait_for


def mqtt_client(port: int, client_id: str, clean: bool = True) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def test_overview_topics_groups_reset_and_search(unimq_server: Any) -> None:
    srv = unimq_server()
    base = srv.url()
    with httpx.Client(base_url=base, timeout=20) as h:
        before = h.get("/v1/admin/overview").json()
        assert set(before["doors"]) >= {"mqtt", "amqp", "http", "grpc"}
        assert before["store"]["disk_total_bytes"] > 0 and before["brokers"][0]["live"] is True

        # traffic through three doors
        pub = mqtt_client(srv.ports["mqtt"], "admin-test-pub")
        pub.publish("sensors/t1", b'{"celsius": 21.5}', qos=1).wait_for_publish(10)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
        conn.channel().basic_publish("amq.topic", "sensors.t2", b"from amqp")
        for i in range(5):
            r = h.post("/v1/topics/orders/messages", params={"keys": f"o-{i}"}, content=f"order {i}".encode())
            assert r.status_code == 200
        after = wait_for(lambda: (o := h.get("/v1/admin/overview").json())["doors"]["amqp"]["messages_in"] >= 1 and o,
                         what="the AMQP publish to be counted")
        assert after["doors"]["mqtt"]["messages_in"] >= before["doors"]["mqtt"]["messages_in"] + 1
        assert after["doors"]["http"]["messages_in"] >= before["doors"]["http"]["messages_in"] + 5
        assert after["doors"]["http"]["bytes_in"] >= 5 * len(b"order 0")
        assert after["doors"]["mqtt"]["connections"] == 1 and after["doors"]["amqp"]["connections"] == 1
        conn.close()
        pub.loop_stop()
        pub.disconnect()

        # topics: filter and paging, the page described
        for i in range(12):
            assert h.post("/v1/topics", json={"name": f"bulk-{i:02d}", "queues": 1}).status_code == 201
        r = h.get("/v1/admin/topics", params={"q": "bulk-", "offset": 5, "limit": 4}).json()
        assert r["total"] == 12 and [t["name"] for t in r["items"]] == [f"bulk-{i:02d}" for i in range(5, 9)]
        orders = h.get("/v1/admin/topics/orders").json()
        assert orders["messages"] == 5 and orders["type"] == "NORMAL" and orders["retention_hours"] > 0
        assert h.get("/v1/admin/topics/nope").status_code == 404

        # a pop group: consume everything, then its lag is 0 and it shows as the topic's consumer
        got = h.post("/v1/topics/orders/groups/billing/pop", params={"max": 32}).json()["messages"]
        assert len(got) == 5
        assert h.post("/v1/topics/orders/groups/billing/ack",
                      json={"receipt_handles": [m["receipt_handle"] for m in got]}).json()["acked"] == 5
        g = h.get("/v1/admin/groups/billing").json()
        assert g["topics"] == ["orders"] and g["lag"] == 0 and g["inflight"] == 0
        assert sum(q["max_offset"] for q in g["queues"] if q["topic"] == "orders") == 5
        assert "billing" in h.get("/v1/admin/topics/orders").json()["consumers"]
        groups = h.get("/v1/admin/groups", params={"topic": "orders"}).json()
        assert [x["group"] for x in groups["items"]] == ["billing"]
        assert h.get("/v1/admin/groups/nobody").status_code == 404

        # reset to offset 0: the five come again
        r = h.post("/v1/admin/groups/billing/reset", json={"topic": "orders", "offset": 0})
        assert r.status_code == 200 and all(q["offset"] == 0 for q in r.json()["queues"])
        assert h.get("/v1/admin/groups/billing").json()["lag"] == 5
        again = h.post("/v1/topics/orders/groups/billing/pop", params={"max": 32}).json()["messages"]
        assert sorted(m["message_id"] for m in again) == sorted(m["message_id"] for m in got)
        h.post("/v1/topics/orders/groups/billing/ack", json={"receipt_handles": [m["receipt_handle"] for m in again]})

        # reset to a time: only what was stored from then on comes again
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        late = h.post("/v1/topics/orders/messages", params={"keys": "late"}, content=b"late").json()
        h.post("/v1/topics/orders/groups/billing/pop", params={"max": 32}).json()  # consumed, not acked: dropped by reset
        r = h.post("/v1/admin/groups/billing/reset", json={"topic": "orders", "timestamp_ms": cut})
        assert r.status_code == 200
        third = h.post("/v1/topics/orders/groups/billing/pop", params={"max": 32}).json()["messages"]
        assert [m["message_id"] for m in third] == [late["message_id"]]

        # bad resets are 400s
        assert h.post("/v1/admin/groups/billing/reset", json={"topic": "orders"}).status_code == 400
        assert h.post("/v1/admin/groups/billing/reset", json={"offset": 1}).status_code == 400
        assert h.post("/v1/admin/groups/billing/reset", json={"topic": "orders", "offset": "x"}).status_code == 400
        assert h.post("/v1/admin/groups/billing/reset", json={"topic": "nope", "offset": 0}).status_code == 404
        assert h.post("/v1/admin/groups/billing/reset", json={"topic": "orders", "offset": 2**70}).status_code == 400
        assert h.post("/v1/admin/groups/billing/reset", json={"topic": "orders", "offset": 0, "queue_id": 99}).status_code == 400
        assert h.post("/v1/admin/groups/%25bad/reset", json={"topic": "orders", "offset": 0}).status_code == 400
        assert h.post("/v1/admin/groups/billing/reset", content=b"nope",
                      headers={"content-type": "application/json"}).status_code == 400
        assert h.post("/v1/admin/groups/billing/resend-dlq", json={}).json()["resent"] == 0  # no dead letters

        # message search: by key, by id, by time; the body three ways and the door it came in by
        by_key = h.get("/v1/admin/messages", params={"topic": "orders", "key": "o-3"}).json()["items"]
        assert len(by_key) == 1 and by_key[0]["body_text"] == "order 3" and by_key[0]["protocol"] == "http"
        assert by_key[0]["body_hex"] == b"order 3".hex() and by_key[0]["body_json"] is None
        mid = by_key[0]["message_id"]
        assert h.get("/v1/admin/messages", params={"id": mid}).json()["items"][0]["keys"] == ["o-3"]
        by_time = h.get("/v1/admin/messages", params={"topic": "orders", "begin_ms": cut}).json()["items"]
        assert [m["message_id"] for m in by_time] == [late["message_id"]]
        sensor = h.get("/v1/admin/messages", params={"topic": "sensors"}).json()["items"]
        mqtt_msg = [m for m in sensor if m["protocol"] == "mqtt"]
        assert mqtt_msg and mqtt_msg[0]["body_json"] == {"celsius": 21.5}
        assert {m["protocol"] for m in sensor} == {"mqtt", "amqp"}
        assert h.get("/v1/admin/messages").status_code == 400
        assert h.get("/v1/admin/messages", params={"id": "00" * 17}).json()["items"] == []

        # the cluster page: the broker of this process, the listeners
        c = h.get("/v1/admin/cluster").json()
        assert c["brokers"][0]["name"] and c["listening"]["mqtt"].endswith(f":{srv.ports['mqtt']}")

        # the metrics the dashboard reads
        text = h.get("/metrics").text
        for family in ("unimq_bytes_in_total", "unimq_bytes_out_total", "unimq_connections",
                       "unimq_consumer_inflight_messages", "unimq_consumer_retry_messages",
                       "unimq_store_disk_free_bytes", "unimq_store_flush_seconds_bucket"):
            assert family in text, family
        assert 'unimq_bytes_in_total{protocol="http",topic="orders"}' in text
        # every series the shipped Grafana dashboard plots is one this server exports (or one that
        # only exists with replication, tiered storage or dead letters)
        dashboard = (REPO_ROOT / "deploy" / "grafana" / "unimq.json").read_text()
        conditional = ("unimq_replication_", "unimq_tier_", "unimq_dead_letter", "unimq_push_")
        for name in sorted(set(re.findall(r"unimq_[a-z_]+", dashboard)) - {"unimq_json"}):
            if not name.startswith(conditional):
                assert re.search(rf"^{name}(_bucket)?[{{ ]", text, re.M), name

        # the console's files, and the admin API's own OpenAPI document
        ui = h.get("/ui/")
        assert ui.status_code == 200 and "unimq console" in ui.text
        assert h.get("/ui/app.js").status_code == 200
        assert "/reset" in str(h.get("/v1/admin/openapi.json").json()["paths"])


def test_resend_from_the_dead_letter_topic(unimq_server: Any) -> None:
    srv = unimq_server("--set=broker.max_delivery_attempts=1", "--set=broker.retry_backoff_ms=[100]")
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        for i in range(3):
            h.post("/v1/topics/jobs/messages", params={"keys": f"j-{i}"}, content=f"job {i}".encode())
        popped = h.post("/v1/topics/jobs/groups/workers/pop", params={"max": 32, "invisible_s": 0.2}).json()
        assert len(popped["messages"]) == 3  # never acked: one attempt allowed, so each is dead-lettered
        g = wait_for(lambda: (x := h.get("/v1/admin/groups", params={"q": "workers"}).json()["items"]) and
                     x[0]["dlq"] == 3 and x[0], what="three dead letters")
        assert g["topics"] == ["jobs"]
        r = h.post("/v1/admin/groups/workers/resend-dlq", json={})
        assert r.status_code == 200 and r.json() == {"group": "workers", "topic": "jobs", "resent": 3}
        again = h.post("/v1/topics/jobs/groups/workers/pop", params={"max": 32}).json()["messages"]
        assert sorted(m["keys"][0] for m in again) == ["j-0", "j-1", "j-2"]
        # nothing is resent twice
        assert h.post("/v1/admin/groups/workers/resend-dlq", json={"topic": "jobs"}).json()["resent"] == 0
        assert h.post("/v1/admin/groups/workers/resend-dlq", json={"topic": "%DLQ%workers"}).status_code == 400
        assert "unimq_dead_letter_messages" in h.get("/metrics").text


def test_clients_of_every_door_and_disconnect(unimq_server: Any) -> None:
    srv = unimq_server()
    gone = threading.Event()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="dev-7", clean_session=False,
                      protocol=mqtt.MQTTv311)
    sub.on_disconnect = lambda *a: gone.set()
    sub.reconnect_delay_set(60, 60)  # stay gone while we look
    sub.connect("127.0.0.1", srv.ports["mqtt"])
    sub.loop_start()
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe("plant/+/temp", 1)
    assert subscribed.wait(10)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None)
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        r = h.get("/v1/admin/clients").json()
        assert r["connections"]["mqtt"] == 1 and r["connections"]["amqp"] == 1
        by_door = {c["door"]: c for c in r["items"]}
        assert by_door["mqtt"]["client_id"] == "dev-7" and by_door["mqtt"]["connected"]
        assert by_door["mqtt"]["subscriptions"] == [{"filter": "plant/+/temp", "qos": 1}]
        amqp = by_door["amqp"]
        assert amqp["channels"][0]["consumers"][0]["queue"] == q and amqp["user"] == "guest"
        only = h.get("/v1/admin/clients", params={"door": "mqtt", "q": "dev"}).json()
        assert only["total"] == 1 and only["items"][0]["client_id"] == "dev-7"
        assert h.get("/v1/admin/clients", params={"q": "nobody"}).json()["total"] == 0

        # disconnect the MQTT client: its connection closes, its session stays (clean_session=False)
        assert h.post("/v1/admin/clients/mqtt/dev-7/disconnect").json()["disconnected"] is True
        assert gone.wait(10)
        kept = wait_for(lambda: (x := h.get("/v1/admin/clients", params={"door": "mqtt"}).json()["items"]) and
                        not x[0]["connected"] and x[0], what="the session to show disconnected")
        assert kept["subscriptions"] == [{"filter": "plant/+/temp", "qos": 1}]
        assert h.post("/v1/admin/clients/mqtt/dev-7/disconnect").status_code == 404

        # disconnect the AMQP connection: 320 CONNECTION_FORCED reaches pika
        peer = amqp["client_id"]
        assert h.post(f"/v1/admin/clients/amqp/{peer}/disconnect").status_code == 200
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            for _ in range(100):
                conn.process_data_events(time_limit=0.1)
        assert e.value.reply_code == 320
        wait_for(lambda: h.get("/v1/admin/clients", params={"door": "amqp"}).json()["total"] == 0,
                 what="the AMQP connection to go")
        assert h.post("/v1/admin/clients/nodoor/x/disconnect").status_code == 404
    sub.loop_stop()


def test_client_pages_walk_ids_and_describe_only_the_page() -> None:
    described: list[str] = []

    class Many:
        door = "mqtt"

        def __init__(self) -> None:
            self.sessions = {f"dev-{i:06d}": i for i in range(100_000)}

        def ids(self) -> Any:
            return self.sessions.keys()

        def describe(self, cid: str) -> ClientInfo | None:
            described.append(cid)
            return ClientInfo("mqtt", cid, self.sessions[cid] % 2 == 0)

        def connections(self) -> int:
            return 50_000

        async def disconnect(self, cid: str) -> bool:
            return False

    reg = ClientRegistry()
    reg.register(Many())
    p = reg.page("", "dev-0999", 5, 3)
    assert p.total == 100 and [c.client_id for c in p.clients] == ["dev-099905", "dev-099906", "dev-099907"]
    assert described == ["dev-099905", "dev-099906", "dev-099907"]
    assert reg.page("amqp").total == 0 and reg.connections() == {"mqtt": 50_000}


def test_rates_and_pages() -> None:
    m = RateMeter(min_s=1.0)
    assert m.rates({"mqtt/messages_in": 10}, now=100.0) == {"mqtt/messages_in": 0.0}
    assert m.rates({"mqtt/messages_in": 30}, now=102.0) == {"mqtt/messages_in": 10.0}
    assert m.rates({"mqtt/messages_in": 31}, now=102.5) == {"mqtt/messages_in": 10.0}  # too soon: the last rate
    assert m.rates({"mqtt/messages_in": 31}, now=104.0) == {"mqtt/messages_in": 0.5}
    assert page(list(range(10)), 8, 5) == (10, [8, 9])


def test_bytes_out_count_live_mqtt_and_amqp_deliveries(unimq_server: Any) -> None:
    srv = unimq_server()
    got = threading.Event()
    sub = mqtt_client(srv.ports["mqtt"], "bytes-sub")
    sub.on_message = lambda *a: got.set()
    done = threading.Event()
    sub.on_subscribe = lambda *a: done.set()
    sub.subscribe("farm/#", 1)
    assert done.wait(10)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "farm.#")
    pub = mqtt_client(srv.ports["mqtt"], "bytes-pub")
    pub.publish("farm/cow", b"x" * 1000, qos=1).wait_for_publish(10)
    assert got.wait(10)
    body = wait_for(lambda: ch.basic_get(q, auto_ack=True)[2], what="the AMQP delivery")
    assert body == b"x" * 1000
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        doors = wait_for(lambda: (d := h.get("/v1/admin/overview").json()["doors"])["mqtt"]["bytes_out"] >= 1000
                         and d["amqp"]["bytes_out"] >= 1000 and d, what="bytes out of both doors")
        assert doors["mqtt"]["bytes_in"] >= 1000
        text = h.get("/metrics").text
        assert re.search(r'^unimq_bytes_out_total\{protocol="mqtt",topic="farm"\} [1-9]', text, re.M)
        # AMQP deliveries count under the queue's own topic (as messages_out does)
        assert re.search(r'^unimq_bytes_out_total\{protocol="amqp",topic="%LMQ%amqp/[^"]+"\} 1000', text, re.M)
    conn.close()
    for c in (sub, pub):
        c.loop_stop()
        c.disconnect()


def test_grpc_clients_listed_and_disconnected(unimq_server: Any) -> None:
    """The official RocketMQ 5 client shows up with its type and topics; a disconnect ends its
    telemetry stream (the client opens a new one when it next syncs its settings)."""
    from grpc_helpers import message, producer, started

    srv = unimq_server()
    with started(producer(srv.ports["grpc"], ("rmq-orders",))) as p, \
            httpx.Client(base_url=srv.url(), timeout=20) as h:
        p.send(message("rmq-orders", b"via grpc", keys=("g-1",)))
        c = wait_for(lambda: (x := h.get("/v1/admin/clients", params={"door": "grpc"}).json()["items"]) and
                     x[0]["connected"] and x[0], what="the gRPC client with a telemetry stream")
        assert c["client_type"] == "PRODUCER" and "rmq-orders" in c["topics"]
        assert h.get("/v1/admin/overview").json()["doors"]["grpc"]["connections"] == 1
        assert h.post(f"/v1/admin/clients/grpc/{c['client_id']}/disconnect").json()["disconnected"] is True

        def stream_ended() -> bool:  # no stream open now, or the client already opened a new one
            now = h.get("/v1/admin/clients", params={"door": "grpc"}).json()["items"][0]
            return not now["connected"] or now["streams_opened"] > c["streams_opened"]

        wait_for(stream_ended, what="the telemetry stream to end")
        found = h.get("/v1/admin/messages", params={"topic": "rmq-orders", "key": "g-1"}).json()["items"]
        assert found and found[0]["protocol"] == "grpc" and found[0]["body_text"] == "via grpc"
        p.send(message("rmq-orders", b"after the disconnect"))


def test_the_console_api_acts_as_the_caller(unimq_server: Any) -> None:
    """With users, the console's routes need the caller's rights: anonymous callers get 401 (with a
    Basic challenge, so a browser asks), a user with only a topic's rights reads that topic's
    messages but not the groups or clients, an admin sees everything; the static files stay open."""
    srv = unimq_server()
    admin_auth = ("root", "root-pw-1")
    r = httpx.post(srv.url(path="/v1/admin/users"), json={"name": admin_auth[0], "password": admin_auth[1], "admin": True})
    assert r.status_code == 201, r.text
    with httpx.Client(base_url=srv.url(), auth=admin_auth, timeout=20) as root:
        assert root.post("/v1/admin/users", json={"name": "reader", "password": "reader-pw-1"}).status_code == 201
        assert root.post("/v1/admin/acl", json={"subject": "reader", "resource": "topic", "pattern": "orders",
                                                 "actions": ["publish", "subscribe"]}).status_code == 201
        root.post("/v1/topics/orders/messages", params={"keys": "k1"}, content=b"one")
        for path in ("/v1/admin/overview", "/v1/admin/groups", "/v1/admin/clients", "/v1/admin/cluster",
                     "/v1/admin/messages?topic=orders&key=k1"):
            assert root.get(path).status_code == 200, path
    anon = httpx.get(srv.url(path="/v1/admin/groups"))
    assert anon.status_code == 401 and "Basic" in anon.headers["www-authenticate"]
    assert httpx.post(srv.url(path="/v1/admin/clients/mqtt/x/disconnect")).status_code == 401
    with httpx.Client(base_url=srv.url(), auth=("reader", "reader-pw-1"), timeout=20) as reader:
        found = reader.get("/v1/admin/messages", params={"topic": "orders", "key": "k1"})
        assert found.status_code == 200 and found.json()["items"][0]["body_text"] == "one"
        for path in ("/v1/admin/groups", "/v1/admin/clients", "/v1/admin/overview"):
            assert reader.get(path).status_code == 403, path
        assert reader.post("/v1/admin/groups/g/reset", json={"topic": "orders", "offset": 0}).status_code == 403
    assert httpx.get(srv.url(path="/ui/")).status_code == 200
