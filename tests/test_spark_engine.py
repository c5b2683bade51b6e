"""Tier 1 of the Spark connector: the `unimq` source and sink inside a real Spark.

The process's one ``local[2]`` SparkSession (tests/spark_fixtures.py: UI off, 2 shuffle
partitions, UTC, SPARK_LOCAL_IP=127.0.0.1, the source registered) and one `unimq up` serve
every test: a batch read with offset ranges and SQL over the JSON bodies; the lake job (an
availableNow stream to Parquet, partitioned, with a checkpoint) run twice; the stats job
publishing back to a topic through the sink; a ``writeStream`` into the sink; and an
end-to-end test where an MQTT client (paho), a CloudEvents POST and an AMQP publisher (pika)
write into unimq and one Spark read returns all three.

The stats job's state topic and its kill test are in tests/test_spark_stats_state.py, the
kill-and-restart exactly-once test in tests/test_spark_exactly_once.py: split so that
``--dist loadfile`` can run them on different workers.
"""

from __future__ import annotations

import io
import json

import pytest

from spark_fixtures import http, server  # noqa: F401 (fixtures; `spark` comes from conftest)

pytestmark = pytest.mark.timeout(900)


def test_batch_read_ranges_and_sql(spark, server, http):
    from spark_ingest.schema import spark_schema

    http.create_topic("se-batch", 4)
    n = http.send_events("se-batch", ({"i": i, "temp": float(i % 10)} for i in range(400)))
    for i in range(20):
        http.send("se-batch", json.dumps({"i": 1000 + i, "temp": 50.0}).encode(), {"unimq-tag": "hot"})
    df = spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", "se-batch").load()
    assert df.schema == spark_schema()
    df.createOrReplaceTempView("se_batch")
    rows = spark.sql("""
        SELECT protocol, count(*) AS n, count(DISTINCT queue_id, queue_offset) AS d,
               sum(get_json_object(cast(body AS string), '$.temp')) AS temps,
               min(store_timestamp) IS NOT NULL AS ts
        FROM se_batch GROUP BY protocol ORDER BY protocol""").collect()
    assert [(r.protocol, r.n, r.d, r.ts) for r in rows] == [("cloudevents", n, n, True), ("http", 20, 20, True)]
    assert rows[0].temps == sum(float(i % 10) for i in range(400)) and rows[1].temps == 1000.0
    ranged = (spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", "se-batch")
              .option("startingOffsets", '{"se-batch": {"0": 10}}')
              .option("endingOffsets", '{"se-batch": {"0": 30, "1": 5, "2": 0, "3": 0}}').load())
    got = ranged.select("queue_id", "queue_offset").orderBy("queue_id", "queue_offset").collect()
    assert [(r.queue_id, r.queue_offset) for r in got] == [(0, o) for o in range(10, 30)] + [(1, o) for o in range(5)]


def test_lake_job_available_now_to_parquet_twice(spark, server, http, tmp_path):
    from spark_ingest.jobs import lake
    from spark_ingest.progress import follow

    http.create_topic("se-lake", 3)
    http.send_events("se-lake", ({"i": i} for i in range(600)))
    path = tmp_path / "lake"
    argv = ["--endpoint", server.endpoint, "--topics", "se-lake", "--path", str(path), "--available-now",
            "--max-messages-per-trigger", "400"]
    out = io.StringIO()
    follow(lake.start(spark, lake.build_parser().parse_args(argv)), "lake", out=out, poll_s=0.5)
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["[lake] batch 0", "[lake] batch 1"], lines
    assert "400 rows" in lines[0] and "lag 200 messages" in lines[0], lines
    assert "200 rows" in lines[1] and lines[1].endswith("lag 0 messages"), lines
    assert (path / "_checkpoint" / "commits" / "1").exists()
    assert sorted(p.name for p in path.iterdir() if p.name.startswith("topic=")) == ["topic=se-lake"]
    http.send_events("se-lake", ({"i": i} for i in range(600, 700)))
    out2 = io.StringIO()
    follow(lake.start(spark, lake.build_parser().parse_args(argv)), "lake", out=out2, poll_s=0.5)
    assert out2.getvalue().startswith("[lake] batch 2: 100 rows"), out2.getvalue()
    df = spark.read.parquet(str(path))
    stats = df.selectExpr("count(*) n", "count(DISTINCT queue_id, queue_offset) d",
                          "count(DISTINCT get_json_object(cast(body AS string), '$.i')) i",
                          "min(topic) t", "count(DISTINCT date) days").collect()[0]
    assert (stats.n, stats.d, stats.i, stats.t) == (700, 700, 700, "se-lake") and stats.days >= 1


def test_stats_job_publishes_back_through_the_sink(spark, server, http, tmp_path):
    from spark_ingest.jobs import stats
    from spark_ingest.progress import follow

    http.create_topic("se-stats", 2)
    for i in range(30):
        http.send("se-stats", json.dumps({"temp": 10 + i, "name": "x"}).encode())
    http.send_events("se-stats", ({"temp": 100, "amount": 2.5} for _ in range(10)))
    args = stats.build_parser().parse_args([
        "--endpoint", server.endpoint, "--topics", "se-stats", "--available-now", "--window", "1 hour",
        "--output-topic", "se-stats-out", "--checkpoint", str(tmp_path / "ck")])
    out = io.StringIO()
    fields = stats.choose_fields(args, out=out)
    assert set(fields) == {"temp", "amount"}
    follow(stats.start(spark, args, fields, out=out), "stats", out=out, poll_s=0.5)
    text = out.getvalue()
    assert "[stats] windows updated by batch 0: 2" in text and "temp 10.0/24.5/39.0" in text, text
    assert "[stats] batch 0: 40 rows" in text and "[stats] batch 1" not in text, text
    msgs = (spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", "se-stats-out").load()
            .selectExpr("cast(body AS string) b", "tag", "keys", "properties['stats_protocol'] p", "protocol")
            .collect())
    docs = {r.p: json.loads(r.b) for r in msgs}
    assert {r.tag for r in msgs} == {"stats"} and {r.protocol for r in msgs} == {"http"}
    assert docs["http"]["count"] == 30 and docs["http"]["fields"]["temp"] == {"min": 10.0, "avg": 24.5, "max": 39.0}
    assert "amount" not in docs["http"]["fields"]
    assert docs["cloudevents"]["count"] == 10 and docs["cloudevents"]["fields"]["amount"]["max"] == 2.5
    assert all(r.keys[0].startswith(f"se-stats|{r.p}|") for r in msgs)


def test_write_stream_sink_republishes(spark, server, http, tmp_path):
    """writeStream.format("unimq"): rows of one topic published to another (at-least-once)."""
    http.create_topic("se-sink-in", 2)
    for i in range(25):
        http.send("se-sink-in", f"m{i}".encode(), {"unimq-tag": "in", "unimq-prop-n": str(i)})
    q = (spark.readStream.format("unimq").option("endpoint", server.endpoint).option("topics", "se-sink-in").load()
         .selectExpr("body", "'copied' AS tag", "map('n', properties['n'], 'src', topic) AS properties",
                     "array(message_id) AS keys")
         .writeStream.format("unimq").option("endpoint", server.endpoint).option("topic", "se-sink-out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None
    out = (spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", "se-sink-out").load()
           .selectExpr("cast(body AS string) b", "tag", "properties", "keys", "protocol").collect())
    assert sorted(r.b for r in out) == sorted(f"m{i}" for i in range(25))
    assert {r.tag for r in out} == {"copied"} and {r.protocol for r in out} == {"http"}
    assert all(r.properties["src"] == "se-sink-in" and r.b == f"m{r.properties['n']}" and len(r.keys) == 1
               for r in out)


def test_mqtt_cloudevents_amqp_in_one_spark_read(spark, server, http):
    missing = [d for d in ("mqtt", "amqp", "http") if d not in server.ports]
    if missing:
        pytest.skip(f"unimq up announced no {', '.join(missing)} door (adapters not built yet): {server.lines}")
    import paho.mqtt.client as mqtt
    import pika
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="se-sensor-1", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", server.ports["mqtt"])
    c.loop_start()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("unit", "C")]
    c.publish("seplant/line1/temp", b'{"temp": 21.5}', qos=1, properties=props).wait_for_publish(30)
    c.loop_stop()
    c.disconnect()

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "seplant.line2.pressure", b'{"bar": 2.5}',
                     pika.BasicProperties(content_type="application/json", message_id="m-1",
                                          headers={"site": "berlin"}))
    conn.close()

    st, body = http.call("POST", "/v1/topics/seplant/events", b'{"open_s": 3}', {
        "ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/building/7", "ce-type": "door.opened",
        "ce-subject": "door-3", "content-type": "application/json"})
    assert st == 200, body

    rows = (spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", "seplant").load()
            .orderBy("protocol").collect())
    by = {r.protocol: r for r in rows}
    assert sorted(by) == ["amqp", "cloudevents", "mqtt"] and len(rows) == 3
    m, a, e = by["mqtt"], by["amqp"], by["cloudevents"]
    assert m.body == b'{"temp": 21.5}' and m.mqtt_topic == "seplant/line1/temp" and m.properties["unit"] == "C"
    assert m.properties["mqtt_qos"] == "1" and m.topic == "seplant"
    assert a.body == b'{"bar": 2.5}' and a.tag == "seplant.line2.pressure" and a.keys == ["m-1"]
    assert a.mqtt_topic == "seplant/line2/pressure"  # amq.topic routing key == the MQTT topic
    assert a.properties["site"] == "berlin" and a.properties["amqp_content_type"] == "application/json"
    assert e.body == b'{"open_s": 3}' and (e.ce_type, e.ce_source, e.ce_subject) == ("door.opened", "/building/7",
                                                                                      "door-3")
    assert e.tag == "door.opened" and e.properties["ce_id"] == "e-1"
    assert all(r.store_timestamp is not None and r.message_id for r in rows)


