"""The `txtasks` PySpark data source: batch writes and streaming micro-batches.

Where each part runs: `writer()` / `streamWriter()` on the driver (options are checked there,
before any row is written); `write()` in executor Python workers, once per partition attempt;
`commit()` / `abort()` on the driver side again. Only strings and small dataclasses cross
between them.

Writers take Arrow record batches (`DataSourceArrowWriter`; streams from PySpark 4.1 on, Spark
rows before): see `txtasks.spark.encode`. Each partition attempt stages its rows, one
transaction per batch, under a fresh `stage_id` of the write's key (`txtasks.spark.staging`),
while the write is open: the writer opens it on the driver, the commit and the abort close it.

Exactly once: Spark hands the commit one message per partition, from the attempt that
succeeded (its stage id and row count), so the commit publishes exactly those attempts' rows,
checks none is missing, and ends the write's other attempts (that failed or lost a speculative
race), whose rows no write reads and the cleaner deletes; an abort ends them all. With option `publish` = "deferred" the commit
only records the write (`SqlStaging.commit_deferred`), and workers or the cleaner publish its
rows after it (`txtasks.spark.staging.publisher`). The commit is recorded under a commit id (the
write's, or `stream:<stream_id>:<batch id>` for streaming), so a repeated commit (a restarted
stream replaying a micro-batch) publishes nothing twice. A write with option `topic` instead of
`task` is staged alike; its commit fans each row out to the groups subscribed to the topic at
that moment (`txtasks.spark.staging.fanout`).
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import datasource as pyspark_datasource
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from txtasks.clock import utcnow
from txtasks.driver import SqlDriver, driver_for_url
from txtasks.errors import ConfigurationError
from txtasks.spark.encode import staged_from_arrow, staged_from_rows
from txtasks.spark.options import WAKEUP_TIMEOUT, WriteOptions
from txtasks.spark.staging import SqlStaging, StageTarget, TopicTarget, staging_for
from txtasks.wakeup import WakeupStats

#: PySpark 4.1+ hands streaming micro-batches over as Arrow record batches too; 4.0 as rows.
STREAM_ARROW = hasattr(pyspark_datasource, "DataSourceStreamArrowWriter")
StreamWriterBase: Any = getattr(
    pyspark_datasource, "DataSourceStreamArrowWriter", DataSourceStreamWriter
)

SOURCE_NAME = "txtasks"
#: Spark rows per staged batch on the row path.
ROWS_PER_BATCH = 10_000
#: Random hex digits of a stage id (64 bits): it tells apart the attempts of one write in the
#: messages Spark hands the commit (the database keeps it once per attempt, beside the number
#: that keys the attempt's staged rows).
STAGE_ID_CHARS = 16


def register(spark: SparkSession | None = None) -> None:
    """Make `format("txtasks")` available in this Spark session (the active one by default)."""
    session = spark or SparkSession.getActiveSession()
    if session is None:
        raise ConfigurationError("txtasks.spark.register: no active Spark session")
    session.dataSource.register(TxtasksDataSource)


# -- the writers --------------------------------------------------------------------------------

_drivers: dict[str, SqlDriver] = {}


def _driver(url: str) -> SqlDriver:
    """One driver per database URL and Python worker process (Spark reuses its workers)."""
    driver = _drivers.get(url)
    if driver is None:
        driver = _drivers[url] = driver_for_url(url)
    return driver


def _staging(url: str) -> SqlStaging:
    """The staging of the database at `url`, on this process's driver for it."""
    return staging_for(_driver(url))


@dataclass
class StagedMessage(WriterCommitMessage):
    """What a partition attempt staged: its stage id and row count."""

    stage_id: str
    partition: int
    rows: int


def write_key(name: str) -> str:
    """The key under which every attempt of a write or stream stages its rows."""
    return hashlib.sha256(name.encode()).hexdigest()[:24]


def arrow_encoder(options: WriteOptions, batches: Iterable[Any]) -> Iterator[Any]:
    """Arrow record batches -> staged tables, one per batch."""
    return (staged_from_arrow(b, options) for b in batches)


def row_encoder(options: WriteOptions, rows: Iterable[Any]) -> Iterator[Any]:
    """Spark rows -> staged tables of `ROWS_PER_BATCH` rows."""
    iterator = iter(rows)
    chunks = iter(lambda: list(itertools.islice(iterator, ROWS_PER_BATCH)), [])
    return (staged_from_rows(c, options) for c in chunks)


def _stage(options: WriteOptions, key: str, staged: Iterator[Any]) -> StagedMessage:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    stage_id = uuid.uuid4().hex[:STAGE_ID_CHARS]
    count = _staging(options.url).stage(key, stage_id, staged, now=utcnow())
    return StagedMessage(stage_id, partition, count)


def _target(options: WriteOptions) -> StageTarget | TopicTarget:
    """What the commit adds to the staged rows: a task name and queue, or a topic whose
    groups (those subscribed at the commit) each get a task of every row."""
    dedup, keyed = options.dedup is not None, options.key is not None
    if options.topic is not None:
        ranked = options.priority is not None
        return TopicTarget(options.topic, dedup=dedup, keyed=keyed, ranked=ranked)
    assert options.task is not None  # WriteOptions.parse requires one of them
    return StageTarget(options.queue, options.task, options.max_attempts, dedup=dedup, keyed=keyed)


def _commit(options: WriteOptions, key: str, commit_id: str, messages: list[Any]) -> None:
    stages = {m.stage_id: m.rows for m in messages if isinstance(m, StagedMessage)}
    target, staging = _target(options), _staging(options.url)
    wait = options.lock_wait_timeout
    if options.publish == "deferred":  # publishers (workers, the cleaner) wake the queues
        staging.commit_deferred(commit_id, key, stages, target, now=utcnow(), lock_wait=wait)
        return
    published = staging.commit(commit_id, key, stages, target, now=utcnow(), lock_wait=wait)
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


class TxtasksWriter(DataSourceArrowWriter):
    """A batch write: staged per partition attempt, committed once by the driver."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.commit_id = options.commit_id or f"write:{uuid.uuid4().hex}"
        self.key = write_key(self.commit_id)
        _staging(options.url).open(self.key, utcnow())

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        return _stage(self.options, self.key, arrow_encoder(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.options, self.key, self.commit_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _staging(self.options.url).abort(self.key)


class TxtasksStreamWriter(StreamWriterBase):  # type: ignore[misc]
    """A streaming sink: each micro-batch committed once under `stream:<stream_id>:<batch>`."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.key = write_key(f"stream:{options.stream_id}")
        _staging(options.url).open(self.key, utcnow())

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        encoder = arrow_encoder if STREAM_ARROW else row_encoder
        return _stage(self.options, self.key, encoder(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_id = f"stream:{self.options.stream_id}:{batchId}"
        _commit(self.options, self.key, commit_id, messages)
        _staging(self.options.url).open(self.key, utcnow())  # the next micro-batch

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _staging(self.options.url).abort(self.key)


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
