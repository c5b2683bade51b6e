"""Spark jobs over unimq, each runnable as ``python -m spark_ingest.jobs.<name> --endpoint URL ...``.

- :mod:`.lake`: chosen topics -> a Parquet lake partitioned by topic and date (streaming, checkpointed).
- :mod:`.stats`: windowed statistics per topic and protocol (counts, bytes, min/avg/max of numeric
  JSON fields), printed and published back to a unimq topic.
"""
