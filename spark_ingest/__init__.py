"""Spark reads the unified streams: the `unimq` PySpark data source, ingestion jobs and `unimq demo`.

    from spark_ingest.session import get_spark      # a session with format "unimq" registered
    spark.read.format("unimq").option("endpoint", "http://127.0.0.1:8080").option("topics", "t").load()

Kept import-free on purpose: importing a submodule (:mod:`spark_ingest.wire`,
pyarrow only) must not pay for pyspark.
"""
