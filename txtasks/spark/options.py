"""The options of a `txtasks` Spark write, checked against the DataFrame's schema on the driver
before any row is written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

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
from sqlalchemy import make_url

from txtasks.app import ENV_BROKER_URL, ENV_DATABASE_URL, check_queue_name
from txtasks.driver import capabilities_for_url
from txtasks.driver.urls import backend_name
from txtasks.errors import ConfigurationError
from txtasks.topics import MAX_PUBLISH_DEDUP_BYTES, check_topic_name

DEFAULT_MAX_ATTEMPTS = 5
#: The longest dedup key or task key the hot table holds, in bytes.
MAX_KEY_BYTES = 255
#: The longest commit_id / stream_id (the ledger's key has room for a prefix and a batch id).
MAX_ID_BYTES = 200
#: Seconds the commit waits for its wake-ups to be published.
WAKEUP_TIMEOUT = 5.0
#: The publish modes (option `publish`): the commit makes every task claimable before it
#: returns, or records the write and leaves the rows to publishers (workers, the cleaner).
PUBLISH_MODES = ("atomic", "deferred")

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


@dataclass(frozen=True)
class WriteOptions:
    """The options of a write, checked against the DataFrame's schema on the driver."""

    url: str
    #: The task name workers run; None with `topic`.
    task: str | None
    queue: str = "default"
    #: The topic each row is published to (every group subscribed at the commit gets a task
    #: of it); None with `task`.
    topic: str | None = None
    payload: tuple[str, ...] = ()
    dedup: str | None = None
    #: The column of each task's key (see docs/keys.md); None: no task has a key.
    key: str | None = None
    priority: str | None = None
    run_at: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    broker_url: str | None = None
    commit_id: str | None = None
    stream_id: str | None = None
    #: "atomic" (the commit publishes every task) or "deferred" (publishers do, after it).
    publish: str = "atomic"
    #: Seconds the commit waits for a lock at most (option `lock_wait_timeout`); None: the
    #: default, `txtasks.spark.staging.LOCK_WAIT_TIMEOUT` or the database's own bound when it
    #: is longer.
    lock_wait_timeout: float | None = None
    #: column name -> "ntz" for TIMESTAMP_NTZ columns (naive UTC), "ltz" for TIMESTAMP ones.
    timestamps: Mapping[str, str] = field(default_factory=dict)
    #: Every column, in the order of the rows' fields.
    columns: tuple[str, ...] = ()
    #: Payload columns whose values are JSON as they are (no conversion per row).
    native: frozenset[str] = frozenset()
    #: The DataFrame's schema (the Arrow path converts the other payload columns by type).
    schema: StructType = field(default_factory=StructType)

    @property
    def dedup_bytes(self) -> int:
        """The longest dedup key a row may have (a topic's groups add `<group>/` to it)."""
        return MAX_PUBLISH_DEDUP_BYTES if self.topic else MAX_KEY_BYTES

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> WriteOptions:
        """Validate `options` for `schema`; errors name the option or column."""
        get = {k.lower(): v for k, v in options.items()}.get
        url = get("url") or os.environ.get(ENV_DATABASE_URL)
        if not url:
            raise ConfigurationError(
                f"txtasks write: option 'url' is required (or {ENV_DATABASE_URL})"
            )
        task, topic = get("task"), get("topic")
        if not task and not topic:
            raise ConfigurationError(
                "txtasks write: option 'task' (the task name) or 'topic' (a topic to publish "
                "each row to) is required"
            )
        if task and topic:
            raise ConfigurationError("txtasks write: give option 'task' or 'topic', not both")
        if topic:
            check_topic_name(topic, setting="txtasks write: topic")
            for option in ("queue", "max_attempts"):
                if get(option) is not None:
                    raise ConfigurationError(
                        f"txtasks write: option '{option}' does not apply with 'topic' "
                        f"(each group's tasks get its subscription's {option})"
                    )
        publish = (get("publish") or "atomic").strip().lower()
        if publish not in PUBLISH_MODES:
            raise ConfigurationError(
                f"txtasks write: option 'publish' must be 'atomic' or 'deferred', "
                f"got {get('publish')!r}"
            )
        url = _local_infile(url, get("local_infile"))
        columns = {f.name: f.dataType for f in schema.fields}
        special = {k: get(k) for k in ("dedup", "key", "priority", "run_at")}
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
        dedup, key = special["dedup"], special["key"]
        for option, column in (("dedup", dedup), ("key", key)):
            if column is not None and not isinstance(columns[column], (StringType, *INTEGRAL)):
                raise ConfigurationError(
                    f"txtasks write: {option} column {column!r} must be a string or integer, "
                    f"not {columns[column].simpleString()}"
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
            task=task or None,
            topic=topic or None,
            queue=check_queue_name(get("queue") or "default", setting="txtasks write: queue"),
            payload=payload,
            dedup=dedup,
            key=key,
            priority=priority,
            run_at=run_at,
            max_attempts=_positive_int(get("max_attempts"), "max_attempts", DEFAULT_MAX_ATTEMPTS),
            broker_url=get("broker_url") or os.environ.get(ENV_BROKER_URL) or None,
            commit_id=get("commit_id"),
            stream_id=get("stream_id"),
            publish=publish,
            lock_wait_timeout=_seconds(get("lock_wait_timeout"), "lock_wait_timeout"),
            timestamps={
                name: "ntz" if isinstance(kind, TimestampNTZType) else "ltz"
                for name, kind in columns.items()
                if isinstance(kind, TIMESTAMPS)
            },
            columns=tuple(columns),
            native=frozenset(c for c in payload if isinstance(columns[c], NATIVE)),
            schema=schema,
        )


def _local_infile(url: str, value: str | None) -> str:
    """The database URL of the write: with option `local_infile` = "true" (MariaDB/MySQL
    only), its connections are opened with `local_infile`, and stage by LOAD DATA LOCAL
    INFILE."""
    flag = (value or "false").strip().lower()
    if flag not in ("true", "false"):
        raise ConfigurationError(
            f"txtasks write: option 'local_infile' must be 'true' or 'false', got {value!r}"
        )
    if flag == "false":
        return url
    if not capabilities_for_url(url).local_infile:
        raise ConfigurationError(
            "txtasks write: option 'local_infile' applies to MariaDB/MySQL only, "
            f"not {backend_name(url)}"
        )
    with_flag = make_url(url).update_query_dict({"local_infile": "1"})
    return with_flag.render_as_string(hide_password=False)


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


def _seconds(text: str | None, option: str) -> float | None:
    """A number of seconds > 0, or None when the option is not given."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ConfigurationError(f"txtasks write: option '{option}' must be seconds > 0")
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
