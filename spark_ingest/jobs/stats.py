"""Windowed statistics per topic and protocol, printed and published back to a unimq topic.

    python -m spark_ingest.jobs.stats --endpoint http://127.0.0.1:8080 --topics factory,events,orders \\
        [--window "1 minute"] [--fields temp,amount] [--output-topic unimq-stats] [--available-now]

For every window of store time, topic and ingress protocol: message count,
body bytes, and min/avg/max of each numeric JSON field (``--fields``; by
default the numeric top-level fields found in a sample of each topic's latest
messages). Each micro-batch's updated windows are printed and sent to
``--output-topic`` as JSON messages (key ``<topic>|<protocol>|<window start>``,
tag ``stats``, properties ``stats_topic``, ``stats_protocol``,
``window_start``, ``window_end``): later messages for a key supersede earlier
ones (output mode update). Publishing is at-least-once.

The running aggregates live in a COMPACTED state topic (``--state-topic``, by default
named after the topics, window and output topic), committed after each micro-batch with
the source offsets they count (:mod:`.stats_state`, :mod:`spark_ingest.state_topic`): a
restarted job, with or without its checkpoint directory, restores them and continues
from those offsets, counting every message exactly once.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from collections import Counter
from typing import Any, Sequence, TextIO

import orjson

from ..offsets import dumps as offsets_json
from ..state_topic import StateTopic
from . import common
from .stats_state import RunningStats, col_name

MAX_AUTO_FIELDS = 10


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_ingest.jobs.stats", description=__doc__.split("\n\n")[0])
    common.add_source_args(p)
    p.add_argument("--window", default="1 minute", metavar="DURATION", help='window length (default "1 minute")')
    p.add_argument("--watermark", default="10 minutes", metavar="DURATION",
                   help='how late a message may arrive and still count (default "10 minutes")')
    p.add_argument("--fields", metavar="A,B", help="numeric JSON fields (dotted paths); default: discovered")
    p.add_argument("--output-topic", default="unimq-stats", metavar="TOPIC",
                   help="publish the statistics here (default unimq-stats)")
    p.add_argument("--no-publish", action="store_true", help="only print")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="checkpoint directory, to continue where the last run stopped (default: a temporary one, "
                        "removed at exit: each run starts from --starting-offsets)")
    p.add_argument("--state-topic", metavar="TOPIC",
                   help="COMPACTED topic of the running aggregates and the offsets they count, created on demand "
                        "(default unimq-stats-state-<hash of the topics, window and output topic>)")
    p.add_argument("--reset-state", action="store_true",
                   help="delete the state topic and the --checkpoint directory first: start again from "
                        "--starting-offsets (which a job with state ignores)")
    p.add_argument("--show", type=int, default=20, metavar="N", help="rows printed per micro-batch (default 20)")
    return p


def discover_fields(endpoint: str, topics: list[str], sample: int = 50) -> list[str]:
    """Numeric top-level JSON fields seen in the latest messages of ``topics`` (most frequent first)."""
    import base64

    from ..client import GatewayClient

    seen: Counter[str] = Counter()
    with GatewayClient(endpoint) as c:
        for t in topics:
            for q, (lo, hi) in (c.describe(t) or {}).items():
                if hi <= lo:
                    continue
                page = c.pull_json(t, q, max(lo, hi - sample), sample)
                for m in page["messages"]:
                    try:
                        doc = orjson.loads(base64.b64decode(m.get("body_base64") or ""))
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(doc, dict):
                        seen.update(k for k, v in doc.items()
                                    if isinstance(v, (int, float)) and not isinstance(v, bool))
    return [k for k, _ in seen.most_common(MAX_AUTO_FIELDS)]


def topics_of(endpoint: str, args: argparse.Namespace) -> list[str]:
    if args.topics:
        return [t.strip() for t in args.topics.split(",") if t.strip()]
    from ..client import GatewayClient
    from ..offsets import select_topics

    with GatewayClient(endpoint) as c:
        return select_topics(list(c.list_topics()), (), args.topic_pattern)


def state_topic_name(args: argparse.Namespace) -> str:
    """``--state-topic``, or a name derived from what the state depends on (so a restart finds it)."""
    if args.state_topic:
        return str(args.state_topic)
    topics = sorted(t.strip() for t in (args.topics or "").split(",") if t.strip())
    ident = orjson.dumps([topics, args.topic_pattern, args.window, args.output_topic])
    return f"unimq-stats-state-{hashlib.sha1(ident).hexdigest()[:10]}"


def aggregate(df: Any, fields: Sequence[str], window: str, watermark: str) -> Any:
    """The windowed aggregation of a streaming or a batch DataFrame of the unimq table in one pass
    (Spark keeping the state); the job's incremental result over the same rows equals it."""
    from pyspark.sql import functions as F

    body = F.col("body").cast("string")
    exprs = [F.count(F.lit(1)).alias("count"), F.sum(F.length("body")).cast("long").alias("bytes")]
    for f in fields:
        v = F.get_json_object(body, f"$.{f}").cast("double")
        c = col_name(f)
        exprs += [F.min(v).alias(f"{c}__min"), F.avg(v).alias(f"{c}__avg"), F.max(v).alias(f"{c}__max")]
    if df.isStreaming:
        df = df.withWatermark("store_timestamp", watermark)
    return df.groupBy(F.window("store_timestamp", window), "topic", "protocol").agg(*exprs)


def partials(df: Any, fields: Sequence[str], window: str, counted: dict[str, dict[str, int]]) -> Any:
    """One micro-batch aggregated without state, per window, topic, protocol and queue (rows
    for :meth:`RunningStats.apply`); rows below the ``counted`` offsets (a replay) left out."""
    from pyspark.sql import functions as F

    seen = None
    for t, qs in counted.items():
        for q, o in qs.items():
            c = (F.col("topic") == t) & (F.col("queue_id") == int(q)) & (F.col("queue_offset") < o)
            seen = c if seen is None else seen | c
    if seen is not None:
        df = df.where(~seen)
    body = F.col("body").cast("string")
    exprs = [F.count(F.lit(1)).alias("count"), F.sum(F.length("body")).cast("long").alias("bytes"),
             F.min("queue_offset").alias("lo"), F.max("queue_offset").alias("hi"),
             F.max(F.unix_micros("store_timestamp")).alias("max_ts_us")]
    for f in fields:
        v = F.get_json_object(body, f"$.{f}").cast("double")
        n = col_name(f)
        exprs += [F.min(v).alias(f"{n}__min"), F.sum(v).alias(f"{n}__sum"), F.count(v).alias(f"{n}__n"),
                  F.max(v).alias(f"{n}__max")]
    return (df.groupBy(F.window("store_timestamp", window).alias("w"), "topic", "protocol", "queue_id").agg(*exprs)
            .withColumn("start_us", F.unix_micros("w.start")).withColumn("end_us", F.unix_micros("w.end")).drop("w"))


def entries_frame(spark: Any, entries: Sequence[dict], fields: Sequence[str]) -> Any:
    """Running entries as a local DataFrame in :func:`aggregate`'s shape (for :func:`presentable`)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cols = [T.StructField("start_us", T.LongType()), T.StructField("end_us", T.LongType()),
            T.StructField("topic", T.StringType()), T.StructField("protocol", T.StringType()),
            T.StructField("count", T.LongType()), T.StructField("bytes", T.LongType())]
    cols += [T.StructField(f"{col_name(f)}__{a}", T.DoubleType()) for f in fields for a in ("min", "avg", "max")]
    data = []
    for e in entries:
        row: list = [e["start_us"], e["end_us"], e["topic"], e["protocol"], e["count"], e["bytes"]]
        for f in fields:
            v = e["fields"].get(f)
            row += [None, None, None] if v is None else [v[0], v[1] / v[2], v[3]]
        data.append(row)
    df = spark.createDataFrame(data, T.StructType(cols))
    window = F.struct(F.timestamp_micros("start_us").alias("start"), F.timestamp_micros("end_us").alias("end"))
    return df.select(window.alias("window"), *[c.name for c in cols[2:]])


def presentable(agg: Any, fields: Sequence[str]) -> Any:
    """Flat columns for printing and the JSON message for publishing."""
    from pyspark.sql import functions as F

    per_field = []
    summary = []
    for f in fields:
        c = col_name(f)
        per_field.append(F.when(F.col(f"{c}__avg").isNotNull(), F.struct(
            F.col(f"{c}__min").alias("min"), F.round(F.col(f"{c}__avg"), 3).alias("avg"),
            F.col(f"{c}__max").alias("max"))).alias(f))
        summary.append(F.when(F.col(f"{c}__avg").isNotNull(), F.format_string(
            f"{f} %s/%s/%s", *(F.round(F.col(f"{c}__{a}"), 3) for a in ("min", "avg", "max")))))
    fields_col = F.struct(*per_field) if per_field else F.lit(None).cast("map<string,string>")
    out = agg.select(
        F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
        "topic", "protocol", "count", "bytes",
        (F.concat_ws(", ", *summary) if summary else F.lit("")).alias("fields min/avg/max"),
        fields_col.alias("fields"),
    )
    return out


def format_table(rows: Sequence[Any], columns: Sequence[str]) -> str:
    """A plain text table (what DataFrame.show prints, but to any stream)."""
    def cell(v: Any) -> str:
        if hasattr(v, "strftime"):
            return v.strftime("%Y-%m-%d %H:%M:%S")
        return "" if v is None else str(v)

    table = [list(columns)] + [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_messages(df: Any, output_topic: str) -> Any:
    """Rows for the unimq sink: one JSON message per (window, topic, protocol)."""
    from pyspark.sql import functions as F

    ws = F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'")
    we = F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss'Z'")
    body = F.to_json(F.struct(ws.alias("window_start"), we.alias("window_end"), "topic", "protocol", "count",
                              "bytes", "fields"))
    return df.select(
        F.lit(output_topic).alias("topic"),
        body.alias("body"),
        F.lit("stats").alias("tag"),
        F.array(F.concat_ws("|", "topic", "protocol", ws)).alias("keys"),
        F.create_map(F.lit("stats_topic"), F.col("topic"), F.lit("stats_protocol"), F.col("protocol"),
                     F.lit("window_start"), ws, F.lit("window_end"), we).alias("properties"),
    )


def choose_fields(args: argparse.Namespace, out: TextIO = sys.stdout) -> list[str]:
    if args.fields:
        return [f.strip() for f in args.fields.split(",") if f.strip()]
    fields = discover_fields(args.endpoint, topics_of(args.endpoint, args))
    print(f"[stats] numeric JSON fields found: {', '.join(fields) or '(none)'} (choose with --fields)",
          file=out, flush=True)
    return fields


def open_state(args: argparse.Namespace, fields: Sequence[str], out: TextIO = sys.stdout) -> tuple[StateTopic, RunningStats]:
    """The job's state topic and its restored aggregates (empty on a first run or with --reset-state)."""
    state = StateTopic(args.endpoint, state_topic_name(args))
    if args.reset_state:
        state.reset()
        if args.checkpoint:  # its offsets would skip what the empty state never counted
            shutil.rmtree(args.checkpoint, ignore_errors=True)
    snap = state.load()
    running = RunningStats.restored(snap, args.window, args.watermark, fields)
    if snap.seq and running.fields != list(fields):
        if args.fields:
            raise ValueError(f"--fields {','.join(fields)} differs from the state's {','.join(running.fields)}: "
                             "use --reset-state to start again, or another --state-topic")
        print(f"[stats] numeric JSON fields of the state: {', '.join(running.fields) or '(none)'}", file=out, flush=True)
    what = f"restored {len(running.entries)} open windows (commit {snap.seq})" if snap.seq else "new"
    print(f"[stats] state topic {state.topic!r}: {what}", file=out, flush=True)
    return state, running


def start(spark: Any, args: argparse.Namespace, fields: Sequence[str], out: TextIO = sys.stdout) -> Any:
    """Start the statistics query on ``spark`` (the caller follows or awaits it)."""
    import tempfile

    from pyspark.sql import functions as F

    state, running = open_state(args, fields, out)
    fields = running.fields
    source_args = argparse.Namespace(**vars(args))
    if running.offsets:  # continue where the state's counts end (a checkpoint, when present, agrees)
        source_args.starting_offsets = offsets_json(running.offsets)
    src = common.read_stream(spark, source_args).where(~F.col("topic").isin(args.output_topic, state.topic))
    check_gaps = args.fail_on_data_loss == "true"

    def each_batch(batch_df: Any, batch_id: int) -> None:
        # Spark aggregates the batch without state; the few partial rows are merged here, the
        # updated windows printed and published, and only then the state committed (a crash
        # before that replays the batch: at-least-once output, exactly-once state).
        rows = [r.asDict() for r in partials(batch_df, fields, args.window, running.offsets).collect()]
        if not rows:
            return
        updated, closed = running.apply(rows, check_gaps)
        if updated:
            shown = (presentable(entries_frame(spark, list(updated.values()), fields), fields)
                     .orderBy("window_start", "topic", "protocol"))
            out_rows = shown.collect()
            print(f"[stats] windows updated by batch {batch_id}: {len(out_rows)}", file=out, flush=True)
            if args.show:
                print(format_table(out_rows[: args.show], [c for c in shown.columns if c != "fields"]), file=out,
                      flush=True)
            if not args.no_publish:  # shown is a local DataFrame already: no second pass over the batch
                (to_messages(shown, args.output_topic).write.format("unimq")
                 .option("endpoint", args.endpoint).mode("append").save())
        if closed:
            print(f"[stats] windows closed by the watermark in batch {batch_id}: {len(closed)}", file=out, flush=True)
        state.commit({**updated, **{k: None for k in closed}}, running.progress())

    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="unimq-stats-ckpt-")  # main() removes its own
    w = (src.writeStream.outputMode("append").foreachBatch(each_batch)
         .option("checkpointLocation", checkpoint).queryName("unimq_stats"))
    q = common.apply_trigger(w, args).start()
    what = args.topics or f"/{args.topic_pattern}/"
    dest = "printed only" if args.no_publish else f"published to topic {args.output_topic!r}"
    print(f"[stats] {what}: windows of {args.window} per topic and protocol, {dest}", file=out, flush=True)
    return q


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..progress import follow

    import tempfile

    fields = choose_fields(args)
    temporary = None
    if not args.checkpoint:
        args.checkpoint = temporary = tempfile.mkdtemp(prefix="unimq-stats-ckpt-")
    spark = common.session(args, "unimq-stats")
    try:
        follow(start(spark, args, fields), "stats", timeout_s=args.timeout)
    finally:
        spark.stop()
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
