"""The `unimq` PySpark data source: every unimq topic as a batch and streaming table.

Design (README "Spark"; the measured facts behind it are in the connector notes):

- Partitions are message queues, split when a range is larger than
  ``maxMessagesPerPartition`` and packed a few to a task when there are more ranges
  than ``maxPartitions`` (by default the session's task slots: each task costs a
  fixed price, and tasks beyond the slots run in a second wave); each range is read
  by offset range through the HTTP door's pull endpoint (never the store's files),
  page by page, as Arrow record batches built by the server in the exact table schema. A replayed range
  returns the same rows, so Spark's checkpoint (offsets WAL + commit log) with
  a file sink gives exactly-once output; ``read()`` checks every page for
  contiguous offsets so a gap is a loud :class:`DataLossError`, never silence.
- Spark runs this code in three processes (the streaming driver runner, the
  planner, the executors): the reader instance is pickled to executors, so it
  holds only options and column names, and clients are created inside
  ``read()`` or lazily on the driver and left out of the pickled state.
  ``read()`` depends only on the partition and the options.
- State that must survive between micro-batches (the availableNow target) lives
  on the driver-side stream reader; a queue that appears later first enters an
  end offset at its earliest offset and is read from the next batch on, so
  ``partitions(start, end)`` never needs anything but its arguments (a replay
  after a crash calls it without ``latestOffset``).
- ``commit()`` does nothing: Spark calls it one batch late and never for the
  last batch of an availableNow run, so the checkpoint, not the broker, is the
  source of truth for progress.
- The sink publishes rows as plain messages, at-least-once (a retried task
  sends its rows again; the door has no idempotent producer).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from . import offsets as off
from . import wire
from .client import GatewayClient, GatewayError
from .options import MAX_JSON_PAGE, OLD_MAX_PAGE, OptionError, SinkOptions, SourceOptions
from .schema import SCHEMA_DDL, spark_schema

DataLossError = off.DataLossError


class UnimqPartition(InputPartition):
    """One task: ``[start, end)`` of one queue of one topic."""

    def __init__(self, topic: str, queue_id: int, start: int, end: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"UnimqPartition({self.topic!r}, queue={self.queue_id}, [{self.start}, {self.end}))"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnimqPartition) and vars(self) == vars(other)


class UnimqPartitionGroup(InputPartition):
    """One task reading several ranges one after the other (``maxPartitions``)."""

    def __init__(self, parts: tuple[UnimqPartition, ...]) -> None:
        self.parts = parts

    def __repr__(self) -> str:
        return f"UnimqPartitionGroup({', '.join(map(repr, self.parts))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnimqPartitionGroup) and self.parts == other.parts


AnyPartition = UnimqPartition | UnimqPartitionGroup


def planned(ranges: list[off.QueueRange], max_partitions: int | None) -> list[AnyPartition]:
    """Spark's partitions for these ranges: one per range, or packed into ``max_partitions``."""
    out: list[AnyPartition] = []
    for group in off.pack(ranges, max_partitions):
        parts = tuple(UnimqPartition(r.topic, r.queue_id, r.start, r.end) for r in group)
        out.append(parts[0] if len(parts) == 1 else UnimqPartitionGroup(parts))
    return out


def ranges_of(partition: AnyPartition) -> tuple[UnimqPartition, ...]:
    return partition.parts if isinstance(partition, UnimqPartitionGroup) else (partition,)


def current_bounds(client: GatewayClient, opts: SourceOptions, strict: bool) -> off.Bounds:
    """{topic: {queue: (min, max)}} of the topics read. ``strict``: a named topic must exist."""
    if opts.topic_pattern:
        listed = client.list_topics()
        return off.to_bounds({t: listed[t] for t in off.select_topics(list(listed), (), opts.topic_pattern)})
    raw: dict[str, Any] = {}
    for t in opts.topics:
        d = client.describe(t)
        if d is None and strict:
            raise ValueError(f"unimq topic {t!r} does not exist at {opts.endpoint}")
        raw[t] = d or {}
    return off.to_bounds(raw)


def _projection(schema: Any) -> tuple[str, ...] | None:
    """Column names to keep when the user gave a schema (a subset of ours, same types)."""
    if schema is None:
        return None
    ours = {f.name: f.dataType for f in spark_schema().fields}
    names = tuple(f.name for f in schema.fields)
    if names == tuple(ours):
        return None
    for f in schema.fields:
        if f.name not in ours or ours[f.name] != f.dataType:
            raise OptionError(
                f"column {f.name} {f.dataType.simpleString()} is not in the unimq schema; "
                f"leave .schema() out or pick columns of: {SCHEMA_DDL}"
            )
    return names


def _fetch(client: GatewayClient, state: dict, topic: str, queue_id: int, offset: int,
           want: int) -> tuple[list[pa.RecordBatch], int, int]:
    """One page as (its non-empty batches, queue min offset, queue max offset).

    An Arrow page's batches are kept as the door sent them (the door sends a page as one batch
    already, batch topics included: every batch costs Spark's worker and JVM a fixed price)."""
    if state["arrow"]:
        try:
            batches, _nxt, lo, hi = client.pull_arrow(topic, queue_id, offset, want)
        except GatewayError as e:
            if e.status not in (406, 422):
                raise
            if e.status == 422 and want > OLD_MAX_PAGE:  # a door from before 65,536-row pages
                state["page"] = OLD_MAX_PAGE
                return _fetch(client, state, topic, queue_id, offset, OLD_MAX_PAGE)
            state["arrow"] = False  # a door without Arrow pages (or without pyarrow): JSON pages
        else:
            return [b for b in batches if b.num_rows], lo, hi
    page = client.pull_json(topic, queue_id, offset, min(want, MAX_JSON_PAGE))
    msgs = page["messages"]
    return ([wire.json_to_batch(msgs)] if msgs else []), int(page["min_offset"]), int(page["max_offset"])


def read_range(opts: SourceOptions, p: UnimqPartition, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Pull ``[p.start, p.end)`` of one queue page by page and check the offsets are contiguous.

    The next page is requested while Spark consumes the current one (one request in flight,
    on one keep-alive connection), so the door builds a page while the engine converts the last.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    client = GatewayClient(opts.endpoint, opts.request_timeout_s, opts.retries)
    state = {"arrow": opts.page_format == "arrow", "page": opts.page_size}
    pool = ThreadPoolExecutor(1, thread_name_prefix="unimq-prefetch")
    ahead: tuple[int, int, Future] | None = None
    offset = p.start
    where = f"topic {p.topic!r} queue {p.queue_id}"
    try:
        while offset < p.end:
            size = state["page"] if state["arrow"] else min(opts.page_size, MAX_JSON_PAGE)
            want = min(size, p.end - offset)
            if ahead is not None and ahead[:2] == (offset, want):
                batches, lo, hi = ahead[2].result()
            else:
                if ahead is not None:  # a guess that missed (a short page): let it finish, drop it
                    ahead[2].exception()
                batches, lo, hi = _fetch(client, state, p.topic, p.queue_id, offset, want)
            ahead = None
            if offset + want < p.end:  # speculate that this page is full: fetch the next one now
                nxt = offset + want
                nwant = min(size, p.end - nxt)
                ahead = (nxt, nwant, pool.submit(_fetch, client, state, p.topic, p.queue_id, nxt, nwant))
            n = sum(b.num_rows for b in batches)
            if n == 0:
                if offset < lo:  # retention removed [offset, lo) before we read it
                    if opts.fail_on_data_loss:
                        raise DataLossError(
                            f"{where}: offsets {offset}..{lo - 1} were deleted by retention before they were read "
                            "(failOnDataLoss=false skips them)"
                        )
                    offset = lo
                    continue
                raise DataLossError(
                    f"{where}: no message at offset {offset} (the queue holds [{lo}, {hi})) although the planned "
                    f"range ends at {p.end}: the topic was deleted or recreated"
                )
            qo = np.concatenate([b.column(2).to_numpy() for b in batches]) if len(batches) > 1 \
                else batches[0].column(2).to_numpy()
            first, last = int(qo[0]), int(qo[-1])
            contiguous = opts.compacted is None  # else gaps are where compaction dropped older values
            if contiguous and (first != offset or last - first != n - 1 or (n > 2 and not (np.diff(qo) == 1).all())):
                if opts.fail_on_data_loss:
                    missing = offset if first != offset else int(qo[np.flatnonzero(np.diff(qo) != 1)[0]] + 1)
                    raise DataLossError(
                        f"{where}: offset {missing} is missing from the queue (read {first}..{last} from {offset}); "
                        "a message was lost or unreadable (failOnDataLoss=false skips it)"
                    )
            keep = n
            if last >= p.end:
                keep = int(np.searchsorted(qo, p.end))
                last = p.end - 1
            for batch in batches:
                if keep <= 0:
                    break
                if batch.num_rows > keep:
                    batch = batch.slice(0, keep)
                keep -= batch.num_rows
                if columns is not None:
                    batch = batch.select(list(columns))
                yield batch
            offset = last + 1
    finally:
        if ahead is not None:
            ahead[2].exception()  # never close the connection under a request in flight
        pool.shutdown(wait=True)
        client.close()


class UnimqBatchReader(DataSourceReader):
    def __init__(self, options: dict, columns: tuple[str, ...] | None = None,
                 default_max_partitions: int | None = None) -> None:
        self.opts = SourceOptions.parse(options, default_max_partitions)
        self.columns = columns

    def plan(self) -> list[AnyPartition]:
        with GatewayClient(self.opts.endpoint, self.opts.request_timeout_s, self.opts.retries) as client:
            bounds = current_bounds(client, self.opts, strict=True)
        start = off.resolve(self.opts.starting_offsets, bounds, "startingOffsets", default_latest=False)
        start = off.check_data_loss(start, bounds, self.opts.fail_on_data_loss)
        end = off.resolve(self.opts.ending_offsets, bounds, "endingOffsets", default_latest=True)
        for t, qs in end.items():
            for q, e in qs.items():
                hi = bounds[t][q][1]
                if e > hi:
                    raise ValueError(f"endingOffsets: topic {t!r} queue {q}: {e} is past the queue's end {hi}")
                if e < start[t][q]:
                    raise ValueError(f"endingOffsets: topic {t!r} queue {q}: {e} is before the start {start[t][q]}")
        # compacted=latest: one task per queue (a key's rows are all in its queue)
        whole = self.opts.compacted == "latest"
        ranges = off.plan(start, end, 2**62 if whole else self.opts.max_messages_per_partition)
        return planned(ranges, self.opts.max_partitions)

    def partitions(self) -> list[AnyPartition]:
        return self.plan()

    def read(self, partition: AnyPartition) -> Iterator[pa.RecordBatch]:
        for p in ranges_of(partition):
            if self.opts.compacted == "latest":
                yield from latest_per_key(read_range(self.opts, p), self.columns)
            else:
                yield from read_range(self.opts, p, self.columns)


def latest_per_key(batches: Iterator[pa.RecordBatch], columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
    """A compacted queue as a table: the last row of each key (its first key), delete markers
    (an empty body) left out. A key lives in one queue, so one partition holds all its rows."""
    import pyarrow.compute as pc

    table = pa.Table.from_batches(list(batches), wire.ARROW_SCHEMA)
    if table.num_rows == 0:
        return
    keyed = pa.table({"k": pc.list_element(table.column("keys"), 0), "i": pa.array(np.arange(table.num_rows))})
    last = keyed.group_by("k").aggregate([("i", "max")]).column("i_max").to_numpy()
    table = table.take(pa.array(np.sort(last)))
    table = table.filter(pc.greater(pc.binary_length(table.column("body")), 0))
    if columns is not None:
        table = table.select(list(columns))
    yield from table.to_batches()


class UnimqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict, columns: tuple[str, ...] | None = None,
                 default_max_partitions: int | None = None) -> None:
        self.opts = SourceOptions.parse(options, default_max_partitions)
        if self.opts.compacted == "latest":
            raise OptionError("option compacted=latest is for batch reads (spark.read); a stream reads compacted=all")
        self.columns = columns
        self._target: off.Offsets | None = None
        self._latest: off.Offsets | None = None
        self._client: GatewayClient | None = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_client"] = None
        return d

    def _bounds(self) -> off.Bounds:
        if self._client is None:
            self._client = GatewayClient(self.opts.endpoint, self.opts.request_timeout_s, self.opts.retries)
        return current_bounds(self._client, self.opts, strict=False)

    def initialOffset(self) -> dict:
        bounds = self._bounds()
        return off.resolve(self.opts.starting_offsets, bounds, "startingOffsets", default_latest=False)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = off.latest(self._bounds())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return self.next_end(start, limit, self._bounds())

    def next_end(self, start: off.Offsets, limit: ReadLimit, bounds: off.Bounds) -> off.Offsets:
        """The end offset of the next micro-batch (``latestOffset`` with the bounds given)."""
        start = {t: {q: int(o) for q, o in qs.items()} for t, qs in start.items()}
        checked = off.check_data_loss(start, bounds, self.opts.fail_on_data_loss)
        latest = off.latest(bounds)
        self._latest = off.merge_new_queues(latest, {t: {q: (o, o) for q, o in qs.items()} for t, qs in start.items()})
        # Queues new since ``start`` enter the end offset at their earliest offset first (no rows
        # yet), so the next batch's start names them and partitions() needs nothing else.
        new = {t: {q: lo for q, (lo, _) in qs.items() if q not in start.get(t, {})} for t, qs in bounds.items()}
        known = {t: {q: o for q, o in qs.items() if q in start.get(t, {})} for t, qs in latest.items()}
        known = off.clamp(known, self._target, checked)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = off.cap(checked, known, max_rows)
        for t, qs in new.items():
            for q, lo in qs.items():
                end.setdefault(t, {})[q] = lo
        for t, qs in start.items():  # recreated (failOnDataLoss=false): restart at its earliest, as if new
            for q, o in qs.items():
                b = bounds.get(t, {}).get(q)
                if b is not None and o > b[1]:
                    end[t][q] = b[0]
        for t, qs in start.items():  # queues the broker no longer lists keep their offset (nothing to read)
            for q, o in qs.items():
                end.setdefault(t, {}).setdefault(q, o)
        for t in start:  # a topic with no queues yet stays, so an unchanged offset compares equal
            end.setdefault(t, {})
        return {t: qs for t, qs in end.items() if qs or t in start}

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def partitions(self, start: dict, end: dict) -> list[AnyPartition]:
        return planned(off.plan(start, end, self.opts.max_messages_per_partition), self.opts.max_partitions)

    def read(self, partition: AnyPartition) -> Iterator[pa.RecordBatch]:
        for p in ranges_of(partition):
            yield from read_range(self.opts, p, self.columns)

    def commit(self, end: dict) -> None:
        # Deliberately nothing (see the module docstring): Spark's checkpoint is the truth.
        return None

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# -- sink -----------------------------------------------------------------------------------


class UnimqCommit(WriterCommitMessage):
    def __init__(self, count: int) -> None:
        self.count = count


def _utf8(v: Any) -> bytes:
    return str(v).encode("utf-8")


def row_to_message(d: dict, default_topic: str | None) -> tuple[str, bytes, dict[str, Any]]:
    """(topic, body, headers) of one row: ``topic``, ``body``/``value``, ``tag``, ``keys``,
    ``message_group``, ``properties`` columns; the ``topic`` option wins over a topic column."""
    topic = default_topic or d.get("topic")
    if not topic:
        raise ValueError("the unimq sink needs the option topic or a topic column")
    body = d.get("body", d.get("value"))
    if body is None:
        body = b""
    elif isinstance(body, str):
        body = body.encode("utf-8")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        body = bytes(body)
    else:
        body = json.dumps(body, default=str).encode()
    headers: dict[str, Any] = {"content-type": "application/octet-stream"}
    if d.get("tag"):
        headers["unimq-tag"] = _utf8(d["tag"])
    keys = d.get("keys")
    if keys:
        headers["unimq-keys"] = _utf8(",".join(map(str, keys)) if isinstance(keys, (list, tuple)) else keys)
    if d.get("message_group"):
        headers["unimq-message-group"] = _utf8(d["message_group"])
    props = d.get("properties") or {}
    for k, v in (props.items() if isinstance(props, dict) else props):
        if v is not None:
            headers[f"unimq-prop-{k}"] = _utf8(v)
    return str(topic), body, headers


def row_to_item(topic: str, body: bytes, headers: dict[str, Any]) -> dict:
    """A row's message as an item of a JSON batch (what :func:`row_to_message` puts in headers)."""
    item: dict[str, Any] = {"body_base64": base64.b64encode(body).decode()}
    if "unimq-tag" in headers:
        item["tag"] = headers["unimq-tag"].decode()
    if "unimq-keys" in headers:
        item["keys"] = headers["unimq-keys"].decode().split(",")
    item["properties"] = {k[11:]: v.decode() for k, v in headers.items() if k.startswith("unimq-prop-")}
    return item


def publish_rows(opts: SinkOptions, rows: Iterator) -> int:
    """POST each row as a plain message, or with ``batchSize`` > 1 runs of rows of one topic as a
    batch (one record each on a batch topic; a row with a message group goes alone); at-least-once
    (a retried task sends its rows again)."""
    n = 0
    pending: list[dict] = []
    pending_topic = None
    with GatewayClient(opts.endpoint, opts.request_timeout_s, opts.retries) as client:
        def flush() -> None:
            if pending:
                client.send_batch(pending_topic, pending)  # type: ignore[arg-type]
                pending.clear()

        for row in rows:
            d = row.asDict(recursive=True) if hasattr(row, "asDict") else dict(row)
            topic, body, headers = row_to_message(d, opts.topic)
            n += 1
            if opts.batch_size <= 1 or "unimq-message-group" in headers:
                client.send(topic, body, headers)
                continue
            if topic != pending_topic or len(pending) >= opts.batch_size:
                flush()
                pending_topic = topic
            pending.append(row_to_item(topic, body, headers))
        flush()
    return n


class UnimqWriter(DataSourceWriter):
    def __init__(self, options: dict) -> None:
        self.opts = SinkOptions.parse(options)

    def write(self, iterator: Iterator) -> UnimqCommit:
        return UnimqCommit(publish_rows(self.opts, iterator))


class UnimqStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: dict) -> None:
        self.opts = SinkOptions.parse(options)

    def write(self, iterator: Iterator) -> UnimqCommit:
        return UnimqCommit(publish_rows(self.opts, iterator))

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's name
        return None

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803
        return None


class UnimqDataSource(DataSource):
    """``spark.read.format("unimq")`` / ``readStream`` / ``write`` / ``writeStream``."""

    #: ``maxPartitions`` when a read does not set it (see :func:`register`).
    default_max_partitions: int | None = None

    @classmethod
    def name(cls) -> str:
        return "unimq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> UnimqBatchReader:
        return UnimqBatchReader(dict(self.options), _projection(schema), self.default_max_partitions)

    def streamReader(self, schema: Any) -> UnimqStreamReader:
        return UnimqStreamReader(dict(self.options), _projection(schema), self.default_max_partitions)

    def writer(self, schema: Any, overwrite: bool) -> UnimqWriter:
        return UnimqWriter(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> UnimqStreamWriter:
        return UnimqStreamWriter(dict(self.options))


def session_source(task_slots: int | None) -> type[UnimqDataSource]:
    """The source with ``maxPartitions`` defaulting to ``task_slots``.

    Spark plans a Python data source's partitions in a Python process of its own that cannot
    see the session, so the session's slots travel with the registered class: a class made
    here is pickled by value (cloudpickle), class attribute included."""

    class UnimqSessionSource(UnimqDataSource):
        default_max_partitions = task_slots

    return UnimqSessionSource


def register(spark: Any, max_partitions: int | None = None) -> None:
    """Register the source on a session (registration is per session, not per JVM); reads pack
    their queue ranges into at most ``max_partitions`` tasks unless they set ``maxPartitions``
    (default: the session's ``defaultParallelism``, its task slots in local mode)."""
    slots = max_partitions if max_partitions is not None else spark.sparkContext.defaultParallelism
    spark.dataSource.register(session_source(slots or None))
