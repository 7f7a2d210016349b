"""The `txtasks` PySpark data source: batch writes and streaming micro-batches.

Where each part runs: `writer()` / `streamWriter()` on the driver (options are checked there,
before any row is written); `write()` in executor Python workers, once per partition attempt;
`commit()` / `abort()` on the driver side again. Only strings and small dataclasses cross
between them.

Exactly once: every partition attempt stages its rows under a fresh `stage_id` that starts
with the write's key. Spark hands the commit one message per partition, from the attempt that
succeeded, so the commit publishes exactly those stage ids and deletes the write's other staged
rows (attempts that failed or lost a speculative race); an abort deletes them all. The commit is recorded under a commit id (the write's, or
`<stream_id>:<batch id>` for streaming), so a repeated commit (a restarted stream replaying a
micro-batch) publishes nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from txtasks.app import ENV_BROKER_URL, ENV_DATABASE_URL, check_queue_name
from txtasks.clock import utcnow
from txtasks.driver import SqlDriver, driver_for_url
from txtasks.errors import ConfigurationError, PayloadError
from txtasks.payload import DEFAULT_MAX_PAYLOAD_BYTES
from txtasks.types import JSON_CONTENT_TYPE, TaskState
from txtasks.wakeup import WakeupStats

SOURCE_NAME = "txtasks"
DEFAULT_MAX_ATTEMPTS = 5
#: The longest commit_id / stream_id (the ledger's key has room for a prefix and a batch id).
MAX_ID_BYTES = 200
#: Seconds the commit waits for its wake-ups to be published.
WAKEUP_TIMEOUT = 5.0

ATOMIC = (
    StringType,
    BooleanType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    DecimalType,
    DateType,
    TimestampType,
    TimestampNTZType,
    NullType,
)
INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
#: Types whose Python values json.dumps takes as they are.
NATIVE = (StringType, BooleanType, *INTEGRAL, FloatType, DoubleType, NullType)
TIMESTAMPS = (TimestampType, TimestampNTZType)


def register(spark: SparkSession | None = None) -> None:
    """Make `format("txtasks")` available in this Spark session (the active one by default)."""
    session = spark or SparkSession.getActiveSession()
    if session is None:
        raise ConfigurationError("txtasks.spark.register: no active Spark session")
    session.dataSource.register(TxtasksDataSource)


# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """The options of a write, checked against the DataFrame's schema on the driver."""

    url: str
    task: str
    queue: str = "default"
    payload: tuple[str, ...] = ()
    dedup: str | None = None
    priority: str | None = None
    run_at: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    broker_url: str | None = None
    commit_id: str | None = None
    stream_id: str | None = None
    #: column name -> "ntz" for TIMESTAMP_NTZ columns (naive UTC), "ltz" for TIMESTAMP ones.
    timestamps: Mapping[str, str] = field(default_factory=dict)
    #: Every column, in the order of the rows' fields.
    columns: tuple[str, ...] = ()
    #: Payload columns whose values are JSON as they are (no conversion per row).
    native: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> WriteOptions:
        """Validate `options` for `schema`; errors name the option or column."""
        get = {k.lower(): v for k, v in options.items()}.get
        url = get("url") or os.environ.get(ENV_DATABASE_URL)
        if not url:
            raise ConfigurationError(
                f"txtasks write: option 'url' is required (or {ENV_DATABASE_URL})"
            )
        task = get("task")
        if not task:
            raise ConfigurationError("txtasks write: option 'task' (the task name) is required")
        columns = {f.name: f.dataType for f in schema.fields}
        special = {k: get(k) for k in ("dedup", "priority", "run_at")}
        for option, column in special.items():
            if column is not None and column not in columns:
                raise ConfigurationError(
                    f"txtasks write: option '{option}': no column {column!r} "
                    f"(columns: {', '.join(columns)})"
                )
        priority, run_at = special["priority"], special["run_at"]
        if priority is not None and not isinstance(columns[priority], INTEGRAL):
            raise ConfigurationError(
                f"txtasks write: priority column {priority!r} must be an integer type, "
                f"not {columns[priority].simpleString()}"
            )
        if run_at is not None and not isinstance(columns[run_at], TIMESTAMPS):
            raise ConfigurationError(
                f"txtasks write: run_at column {run_at!r} must be a timestamp, "
                f"not {columns[run_at].simpleString()}"
            )
        dedup = special["dedup"]
        if dedup is not None and not isinstance(columns[dedup], (StringType, *INTEGRAL)):
            raise ConfigurationError(
                f"txtasks write: dedup column {dedup!r} must be a string or integer, "
                f"not {columns[dedup].simpleString()}"
            )
        payload = tuple(c.strip() for c in (get("payload") or "").split(",") if c.strip())
        if not payload:
            payload = tuple(columns)
        for column in payload:
            if column not in columns:
                raise ConfigurationError(
                    f"txtasks write: option 'payload': no column {column!r} "
                    f"(columns: {', '.join(columns)})"
                )
            problem = _json_problem(columns[column])
            if problem:
                raise ConfigurationError(
                    f"txtasks write: payload column {column!r} cannot be stored as JSON: "
                    f"{problem}; cast it or leave it out with option 'payload'"
                )
        for option in ("commit_id", "stream_id"):
            value = get(option)
            if value is not None and not 0 < len(value.encode()) <= MAX_ID_BYTES:
                raise ConfigurationError(
                    f"txtasks write: option '{option}' must be 1-{MAX_ID_BYTES} bytes"
                )
        return cls(
            url=url,
            task=task,
            queue=check_queue_name(get("queue") or "default", setting="txtasks write: queue"),
            payload=payload,
            dedup=dedup,
            priority=priority,
            run_at=run_at,
            max_attempts=_positive_int(get("max_attempts"), "max_attempts", DEFAULT_MAX_ATTEMPTS),
            broker_url=get("broker_url") or os.environ.get(ENV_BROKER_URL) or None,
            commit_id=get("commit_id"),
            stream_id=get("stream_id"),
            timestamps={
                name: "ntz" if isinstance(kind, TimestampNTZType) else "ltz"
                for name, kind in columns.items()
                if isinstance(kind, TIMESTAMPS)
            },
            columns=tuple(columns),
            native=frozenset(c for c in payload if isinstance(columns[c], NATIVE)),
        )


def _positive_int(text: str | None, option: str, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(f"txtasks write: option '{option}' must be an integer >= 1")
    return value


def _json_problem(kind: DataType) -> str | None:
    """Why values of `kind` cannot become JSON, or None."""
    if isinstance(kind, BinaryType):
        return "binary data (cast it to a base64 string)"
    if isinstance(kind, ATOMIC):
        return None
    if isinstance(kind, ArrayType):
        return _json_problem(kind.elementType)
    if isinstance(kind, MapType):
        if not isinstance(kind.keyType, StringType):
            return f"map keys of type {kind.keyType.simpleString()} (JSON keys are strings)"
        return _json_problem(kind.valueType)
    if isinstance(kind, StructType):
        for f in kind.fields:
            problem = _json_problem(f.dataType)
            if problem:
                return f"field {f.name!r}: {problem}"
        return None
    return f"type {kind.simpleString()}"


# -- rows to tasks ------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A Spark value as JSON data: dates and timestamps as ISO text, decimals as text."""
    if isinstance(value, Row):
        return {k: _jsonable(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _utc(value: datetime, kind: str) -> datetime:
    """A Spark timestamp as naive UTC: TIMESTAMP_NTZ values are taken as UTC already, and
    TIMESTAMP values arrive as naive datetimes in the Python worker's local time."""
    if kind == "ntz" and value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def staged_rows(
    rows: Iterable[Row], options: WriteOptions, stage_id: str, now: datetime
) -> Iterator[tuple[Any, ...]]:
    """The staged task of each row, as a tuple in `STAGED_COLUMNS` order."""
    where = {name: i for i, name in enumerate(options.columns)}
    payload = [(c, where[c], c not in options.native) for c in options.payload]
    dedup = None if options.dedup is None else where[options.dedup]
    priority = None if options.priority is None else where[options.priority]
    run_at = None if options.run_at is None else where[options.run_at]
    run_at_kind = options.timestamps.get(options.run_at or "", "ltz")
    limit = 255 - len(stage_id) - 1
    staged = TaskState.STAGED.value
    for row in rows:
        data = {c: _jsonable(row[i]) if convert else row[i] for c, i, convert in payload}
        try:
            text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except ValueError as exc:
            raise PayloadError(f"txtasks write: row {data!r}: {exc}") from None
        encoded = text.encode()
        if len(encoded) > DEFAULT_MAX_PAYLOAD_BYTES:
            raise PayloadError(
                f"txtasks write: a payload of {len(encoded)} bytes exceeds the limit of "
                f"{DEFAULT_MAX_PAYLOAD_BYTES}"
            )
        due = now if run_at is None or row[run_at] is None else _utc(row[run_at], run_at_kind)
        key = None
        if dedup is not None and row[dedup] is not None:
            key = f"{stage_id}/{row[dedup]}"
            if len(key.encode()) > 255:
                raise ConfigurationError(
                    f"txtasks write: dedup value {row[dedup]!r} is too long (at most {limit} bytes)"
                )
        rank = 0 if priority is None else row[priority] or 0
        yield (
            options.queue,
            options.task,
            encoded,
            JSON_CONTENT_TYPE,
            staged,
            int(rank),
            due,
            0,
            options.max_attempts,
            now,
            key,
            None,
            None,
            stage_id,
        )


# -- the writers --------------------------------------------------------------------------------

_drivers: dict[str, SqlDriver] = {}


def _driver(url: str) -> SqlDriver:
    """One driver per database URL and Python worker process (Spark reuses its workers)."""
    driver = _drivers.get(url)
    if driver is None:
        driver = _drivers[url] = driver_for_url(url)
    return driver


@dataclass
class StagedMessage(WriterCommitMessage):
    """What a partition attempt staged: its stage id and row count."""

    stage_id: str
    partition: int
    rows: int


def write_key(name: str) -> str:
    """The prefix of every stage id of a write or stream (hex: safe in LIKE patterns)."""
    return hashlib.sha256(name.encode()).hexdigest()[:24]


def _stage(options: WriteOptions, key: str, rows: Iterator[Row]) -> StagedMessage:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    stage_id = f"{key}.{uuid.uuid4().hex[:24]}"
    count = _driver(options.url).stage_insert_sync(staged_rows(rows, options, stage_id, utcnow()))
    return StagedMessage(stage_id, partition, count)


def _commit(options: WriteOptions, key: str, commit_id: str, messages: list[Any]) -> None:
    stage_ids = [m.stage_id for m in messages if isinstance(m, StagedMessage)]
    published = _driver(options.url).stage_commit_sync(commit_id, key, stage_ids, now=utcnow())
    if published and options.broker_url:
        _wake(options.broker_url, published)


def _wake(broker_url: str, published: Mapping[str, int]) -> None:
    """Wake the queues that got tasks, and wait for the messages to go out (this process may
    end right after the commit)."""
    from txtasks.wakeup.amqp import AmqpPublisher

    publisher = AmqpPublisher(broker_url, WakeupStats(), publish_timeout=WAKEUP_TIMEOUT)
    for queue in published:
        publisher.notify(queue, ())
    publisher.close(timeout=WAKEUP_TIMEOUT)


class TxtasksWriter(DataSourceWriter):
    """A batch write: staged per partition attempt, committed once by the driver."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.commit_id = options.commit_id or f"write:{uuid.uuid4().hex}"
        self.key = write_key(self.commit_id)

    def write(self, iterator: Iterator[Row]) -> StagedMessage:
        return _stage(self.options, self.key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.options, self.key, self.commit_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _driver(self.options.url).stage_abort_sync(self.key)


class TxtasksStreamWriter(DataSourceStreamWriter):
    """A streaming sink: each micro-batch committed once under `stream:<stream_id>:<batch>`."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.key = write_key(f"stream:{options.stream_id}")

    def write(self, iterator: Iterator[Row]) -> StagedMessage:
        return _stage(self.options, self.key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_id = f"stream:{self.options.stream_id}:{batchId}"
        _commit(self.options, self.key, commit_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _driver(self.options.url).stage_abort_sync(self.key)


class TxtasksDataSource(DataSource):
    """`format("txtasks")`: see the module docstring and docs/spark.md for the options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def writer(self, schema: StructType, overwrite: bool) -> TxtasksWriter:
        if overwrite:
            raise ConfigurationError("txtasks write: only mode('append') is supported")
        return TxtasksWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> TxtasksStreamWriter:
        options = WriteOptions.parse(self.options, schema)
        if not options.stream_id:
            raise ConfigurationError(
                "txtasks stream: option 'stream_id' is required: a name for this query that "
                "stays the same across restarts (each micro-batch is committed once under it)"
            )
        return TxtasksStreamWriter(options)
