"""Land unimq topics in a Parquet lake partitioned by topic and date, exactly once.

    python -m spark_ingest.jobs.lake --endpoint http://127.0.0.1:8080 --topics factory,orders \\
        --path ./lake [--checkpoint ./lake/_checkpoint] [--available-now | --trigger-seconds 10]

Layout: ``<path>/topic=<topic>/date=<yyyy-mm-dd>/part-*.parquet`` with every
column of the unimq table (``date`` is the UTC store date). A restarted job
continues from its checkpoint; with Spark's file sink the output is
exactly-once *as read through Spark* (``spark.read.parquet(path)`` consults
``_spark_metadata``): a killed micro-batch can leave orphan part files that
tools listing files directly (pyarrow, pandas, DuckDB) would see.

Prints Spark's progress bar and one line per micro-batch (rows, rate, lag).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from . import common


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_ingest.jobs.lake", description=__doc__.split("\n\n")[0])
    common.add_source_args(p)
    p.add_argument("--path", required=True, metavar="DIR", help="the lake's root directory (local or any Hadoop URI)")
    p.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (default <path>/_checkpoint)")
    return p


def start(spark: Any, args: argparse.Namespace) -> Any:
    """Start the lake query on ``spark`` (the caller follows or awaits it)."""
    from pyspark.sql import functions as F

    df = common.read_stream(spark, args).withColumn("date", F.to_date("store_timestamp"))
    checkpoint = args.checkpoint or os.path.join(args.path, "_checkpoint")
    w = (df.writeStream.format("parquet").option("path", args.path).option("checkpointLocation", checkpoint)
         .partitionBy("topic", "date").queryName("unimq_lake"))
    return common.apply_trigger(w, args).start()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..progress import follow

    spark = common.session(args, "unimq-lake")
    q = start(spark, args)
    what = args.topics or f"/{args.topic_pattern}/"
    print(f"[lake] {what} -> {args.path} (partitioned by topic, date); "
          f"{'available now' if args.available_now else f'every {args.trigger_seconds:g}s'}", flush=True)
    try:
        follow(q, "lake", timeout_s=args.timeout)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
