"""The fixed schema of a unimq topic as a Spark table.

One row per stored message, whatever door it came in by. The columns that
every protocol has are first-class (``body`` is the payload as sent,
``properties`` every header/attribute as strings); the attributes analyses
group by most are promoted to columns: ``mqtt_topic`` (the full MQTT topic,
also set for ``amq.topic`` publishes by the AMQP door) and the CloudEvents
``ce_type`` / ``ce_source`` / ``ce_subject``. Every field is nullable, as
Spark makes them anyway.

The Arrow side of the same schema is :data:`gateway.arrow_schema.ARROW_SCHEMA`
(re-exported as ``spark_ingest.wire.ARROW_SCHEMA``), which the gateway builds
its pages in; ``tests/test_spark_reader.py`` pins it equal to
``to_arrow_schema(spark_schema(), "UTC")``, the engine's own conversion
(Spark rejects a batch whose Arrow schema differs in any detail).
"""

from __future__ import annotations

SCHEMA_DDL = (
    "topic STRING, queue_id INT, queue_offset BIGINT, message_id STRING, keys ARRAY<STRING>, tag STRING, "
    "message_group STRING, body BINARY, properties MAP<STRING, STRING>, protocol STRING, "
    "born_timestamp TIMESTAMP, store_timestamp TIMESTAMP, mqtt_topic STRING, ce_type STRING, "
    "ce_source STRING, ce_subject STRING"
)

COLUMNS = tuple(c.split()[0] for c in SCHEMA_DDL.replace("MAP<STRING, STRING>", "MAP").split(", "))


def spark_schema():  # noqa: ANN201 - pyspark imported lazily (the server imports this package too)
    """The table schema as a StructType (built without a SparkSession)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    s, ts = StringType(), TimestampType()
    return StructType(
        [
            StructField("topic", s),
            StructField("queue_id", IntegerType()),
            StructField("queue_offset", LongType()),
            StructField("message_id", s),
            StructField("keys", ArrayType(s)),
            StructField("tag", s),
            StructField("message_group", s),
            StructField("body", BinaryType()),
            StructField("properties", MapType(s, s)),
            StructField("protocol", s),
            StructField("born_timestamp", ts),
            StructField("store_timestamp", ts),
            StructField("mqtt_topic", s),
            StructField("ce_type", s),
            StructField("ce_source", s),
            StructField("ce_subject", s),
        ]
    )
