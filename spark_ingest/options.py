"""Options of the `unimq` Spark source and sink, parsed once from Spark's strings.

Spark hands every option over as a string with a case-insensitive key (and
lower-cases keys when they are iterated); this turns them into one typed,
validated, picklable object so the driver-side planner and the executor-side
reader agree on what they mean, and a typo fails at ``load()`` with the name
of the option instead of deep inside an executor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

#: The HTTP door's largest pull page (``max`` of ``GET .../queues/{q}/messages``): Arrow pages
#: up to MAX_PAGE, JSON pages (the fallback) up to MAX_JSON_PAGE (the door's limits). Pages of
#: 65,536 rows instead of 16,384 cost the server and Spark's Python workers up to a quarter
#: less CPU per read (a fixed price per page: bench/RESULTS.md, issue 18, branch spark2); a
#: door from before them takes OLD_MAX_PAGE.
MAX_PAGE = 65536
OLD_MAX_PAGE = 16384
MAX_JSON_PAGE = 4096

SOURCE_KEYS = {
    "endpoint", "topics", "topic", "topicpattern", "startingoffsets", "endingoffsets", "maxmessagespertrigger",
    "maxmessagesperpartition", "pagesize", "pageformat", "failondataloss", "requesttimeoutms", "retries", "path",
    "compacted", "maxpartitions",
}
SINK_KEYS = {"endpoint", "topic", "requesttimeoutms", "retries", "batchsize", "path", "checkpointlocation", "queryname"}


class OptionError(ValueError):
    pass


def _bool(name: str, v: str | None, default: bool) -> bool:
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {name} must be true or false, got {v!r}")


def _int(name: str, v: str | None, default: int | None, minimum: int = 1, maximum: int | None = None) -> int | None:
    if v is None or str(v).strip() == "":
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {v!r}") from None
    if n < minimum:
        raise OptionError(f"option {name} must be at least {minimum}, got {n}")
    if maximum is not None and n > maximum:
        raise OptionError(f"option {name} must be at most {maximum}, got {n}")
    return n


def _endpoint(o: Mapping[str, str]) -> str:
    endpoint = str(o.get("endpoint") or o.get("path") or "").strip().rstrip("/")
    if not endpoint.startswith(("http://", "https://")):
        raise OptionError(
            "option endpoint is required: the HTTP door's base URL, e.g. http://127.0.0.1:8080 "
            f"(got {endpoint!r})"
        )
    return endpoint


def _unknown(o: Mapping[str, str], known: set[str], what: str) -> None:
    bad = sorted(k for k in o if k not in known)
    if bad:
        raise OptionError(f"unknown option(s) for the unimq {what}: {', '.join(bad)}")


@dataclass(frozen=True)
class SourceOptions:
    endpoint: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    max_messages_per_trigger: int | None = None
    max_messages_per_partition: int = 250_000
    # At most this many tasks per read or micro-batch (queue ranges packed together); None: one
    # task per range. Default: the session's task slots when registered by ``source.register``.
    max_partitions: int | None = None
    page_size: int = MAX_PAGE
    page_format: str = "arrow"
    fail_on_data_loss: bool = True
    request_timeout_s: float = 60.0
    retries: int = 3
    # COMPACTED topics: "all" reads every message compaction kept (offsets have gaps where it
    # dropped older values); "latest" (batch only) the table: the latest message of each key,
    # delete markers left out. None: offsets must be contiguous, as for any other topic.
    compacted: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], default_max_partitions: int | None = None) -> "SourceOptions":
        """``default_max_partitions``: ``maxPartitions`` when the options do not name it."""
        o = {str(k).lower(): v for k, v in options.items()}
        _unknown(o, SOURCE_KEYS, "source")
        compacted = str(o["compacted"]).strip().lower() if o.get("compacted") else None
        if compacted not in (None, "all", "latest"):
            raise OptionError(f"option compacted must be all or latest, got {o.get('compacted')!r}")
        topics = tuple(t.strip() for t in str(o.get("topics") or o.get("topic") or "").split(",") if t.strip())
        pattern = o.get("topicpattern") or None
        if bool(topics) == bool(pattern):
            raise OptionError("give exactly one of the options topics (comma list) or topicPattern (a regex)")
        if pattern:
            try:
                re.compile(pattern)
            except re.error as e:
                raise OptionError(f"option topicPattern is not a valid regular expression: {e}") from None
        fmt = str(o.get("pageformat") or "arrow").strip().lower()
        if fmt not in ("arrow", "json"):
            raise OptionError(f"option pageFormat must be arrow or json, got {fmt!r}")
        starting = str(o.get("startingoffsets") or "earliest").strip()
        ending = str(o.get("endingoffsets") or "latest").strip()
        for name, v in (("startingOffsets", starting), ("endingOffsets", ending)):
            if v.lower() not in ("earliest", "latest") and not v.startswith("{"):
                raise OptionError(f"option {name} must be earliest, latest or a JSON offsets document, got {v!r}")
        if ending.lower() == "earliest":
            raise OptionError("option endingOffsets must be latest or JSON (earliest would read nothing)")
        timeout_ms = _int("requestTimeoutMs", o.get("requesttimeoutms"), 60_000)
        return cls(
            endpoint=_endpoint(o),
            topics=topics,
            topic_pattern=pattern,
            starting_offsets=starting,
            ending_offsets=ending,
            max_messages_per_trigger=_int("maxMessagesPerTrigger", o.get("maxmessagespertrigger"), None),
            max_messages_per_partition=_int("maxMessagesPerPartition", o.get("maxmessagesperpartition"), 250_000),  # type: ignore[arg-type]
            max_partitions=_int("maxPartitions", o.get("maxpartitions"), default_max_partitions, minimum=0) or None,
            page_size=_int("pageSize", o.get("pagesize"), MAX_PAGE, maximum=MAX_PAGE),  # type: ignore[arg-type]
            page_format=fmt,
            fail_on_data_loss=_bool("failOnDataLoss", o.get("failondataloss"), True),
            request_timeout_s=(timeout_ms or 60_000) / 1000.0,
            retries=_int("retries", o.get("retries"), 3, minimum=0),  # type: ignore[arg-type]
            compacted=compacted,
        )


@dataclass(frozen=True)
class SinkOptions:
    endpoint: str
    topic: str | None
    request_timeout_s: float = 60.0
    retries: int = 3
    batch_size: int = 1  # rows per request: > 1 posts JSON batches (one record each on a batch topic)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SinkOptions":
        o = {str(k).lower(): v for k, v in options.items()}
        _unknown(o, SINK_KEYS, "sink")
        timeout_ms = _int("requestTimeoutMs", o.get("requesttimeoutms"), 60_000)
        return cls(
            endpoint=_endpoint(o),
            topic=(str(o.get("topic")).strip() or None) if o.get("topic") else None,
            request_timeout_s=(timeout_ms or 60_000) / 1000.0,
            retries=_int("retries", o.get("retries"), 3, minimum=0),  # type: ignore[arg-type]
            batch_size=min(1024, _int("batchSize", o.get("batchsize"), 1, minimum=1)),  # type: ignore[type-var]
        )
