"""What every job shares: the source options on the command line, the session, the trigger."""

from __future__ import annotations

import argparse
from typing import Any


def add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", required=True, metavar="URL",
                   help="the unimq HTTP door, e.g. http://127.0.0.1:8080")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--topics", metavar="A,B", help="comma-separated topics to read")
    g.add_argument("--topic-pattern", metavar="REGEX", help="read every topic whose whole name matches")
    p.add_argument("--starting-offsets", default="earliest", metavar="SPEC",
                   help="earliest (default), latest or a JSON offsets document; used only without a checkpoint")
    p.add_argument("--max-messages-per-trigger", type=int, metavar="N",
                   help="cap each micro-batch at N messages, split over queues by backlog")
    p.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"],
                   help="fail when messages were deleted by retention before they were read (default true)")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--available-now", action="store_true",
                   help="process what is in unimq now (in micro-batches), then stop")
    t.add_argument("--trigger-seconds", type=float, default=10.0, metavar="S",
                   help="run continuously, a micro-batch every S seconds (default 10)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop a continuous run after S seconds")
    p.add_argument("--master", metavar="URL", help="Spark master (default local[2], or $SPARK_MASTER)")
    p.add_argument("--ui", action="store_true", help="enable Spark's web UI")


def source_options(args: argparse.Namespace) -> dict[str, str]:
    o = {"endpoint": args.endpoint, "startingOffsets": args.starting_offsets,
         "failOnDataLoss": args.fail_on_data_loss}
    if args.topics:
        o["topics"] = args.topics
    else:
        o["topicPattern"] = args.topic_pattern
    if args.max_messages_per_trigger:
        o["maxMessagesPerTrigger"] = str(args.max_messages_per_trigger)
    return o


def read_stream(spark: Any, args: argparse.Namespace) -> Any:
    return spark.readStream.format("unimq").options(**source_options(args)).load()


def apply_trigger(writer: Any, args: argparse.Namespace) -> Any:
    if args.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{args.trigger_seconds} seconds")


def session(args: argparse.Namespace, app: str) -> Any:
    from ..session import get_spark

    return get_spark(app, master=args.master, ui=args.ui,
                     conf={"spark.ui.showConsoleProgress": "true"})
