"""Every table txtasks uses, declared once as SQLAlchemy Core.

The migrations in `txtasks.schema.versions` must produce exactly this; a test compares them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from txtasks.types import READY_STATES, TaskState

metadata = MetaData()

#: Primary keys: BIGINT everywhere; SQLite needs INTEGER PRIMARY KEY for its rowid alias.
Id = BigInteger().with_variant(Integer(), "sqlite")
#: Timestamps are naive UTC with microseconds (MySQL/MariaDB need an explicit fsp).
Timestamp = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: Payloads up to the configured limit (BLOB is only 64 KiB on MySQL/MariaDB).
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: Long text (TEXT is only 64 KiB on MySQL/MariaDB).
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")

#: The state of a claimed task, as stored.
PROCESSING = TaskState.PROCESSING.value
READY = "state IN ({})".format(", ".join(f"'{s.value}'" for s in READY_STATES))
#: The ready condition on the hot table with its values written out: a database can only use
#: a partial index (`ix_txtasks_tasks_claim`) for a condition it can compare at planning time.
IS_READY = text(READY)
KEYED = "partition_key IS NOT NULL"
UNKEYED = "partition_key IS NULL"


class _Utf8Bytes(TypeDecorator[str]):
    """A string stored as its UTF-8 bytes in a VARBINARY column (MySQL/MariaDB's
    `ExactString`)."""

    impl = mysql.VARBINARY
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else str(value).encode("utf-8")

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else bytes(value).decode("utf-8")


class ExactString(TypeDecorator[str]):
    """A string compared byte for byte on every backend.

    MySQL/MariaDB collations ignore case, accents and trailing spaces, so "Reports" would match
    "reports": there the column is a VARBINARY variant, and values are UTF-8 encoded in and out.
    """

    impl = String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length
        self._column = String(length).with_variant(_Utf8Bytes(length), "mysql", "mariadb")

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        return self._column


class byte_order(FunctionElement[str]):  # an SQL expression, named like a function
    """An `ExactString` expression to ORDER BY in byte order (UTF-8: code point order, as
    Python sorts strings) on every backend: PostgreSQL sorts by the column's collation, which
    is the database's (`en_US.UTF-8` sorts "a" before "B"), unless told `COLLATE "C"`;
    MariaDB's VARBINARY and SQLite's default collation sort by bytes already. Statements that
    insert dedup keys in key order sort with it, so that they lock keys in one order."""

    inherit_cache = True


@compiles(byte_order)
def _byte_order_generic(element: byte_order, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(byte_order, "postgresql")
def _byte_order_postgresql(element: byte_order, compiler: SQLCompiler, **kw: Any) -> str:
    return f'({compiler.process(element.clauses, **kw)}) COLLATE "C"'


def _task_columns() -> list[Column[object]]:
    """Columns shared by the hot table and the archive."""
    return [
        Column("queue", ExactString(128), nullable=False),
        Column("task_name", String(255), nullable=False),
        Column("payload", Blob, nullable=False),
        Column("content_type", String(64), nullable=False),
        Column("state", String(16), nullable=False),
        Column("priority", Integer, nullable=False),
        Column("run_at", Timestamp, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("created_at", Timestamp, nullable=False),
        Column("dedup_key", ExactString(255), nullable=True),
        Column("headers", LongText, nullable=True),
        Column("checkpoint", LongText, nullable=True),
        Column("last_error", LongText, nullable=True),
        Column("worker_id", String(128), nullable=True),
        Column("lease_expires_at", Timestamp, nullable=True),
        Column("started_at", Timestamp, nullable=True),
        Column("expires_at", Timestamp, nullable=True),
        # the staging write (one Spark partition attempt) of a row not yet committed
        Column("stage_id", String(64), nullable=True),
        # the key whose limits the task shares (see txtasks.keys); None: no key
        Column("partition_key", ExactString(255), nullable=True),
        # the last progress a handler reported, as JSON (see TaskContext.progress)
        Column("progress", LongText, nullable=True),
        # when a cancel was asked for while the task was processing (see docs/control.md)
        Column("cancel_requested_at", Timestamp, nullable=True),
    ]


tasks = Table(
    "txtasks_tasks",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    *_task_columns(),
    mysql_engine="InnoDB",
    # ids are never reused: an archived task keeps its id (SQLite would reuse the highest).
    sqlite_autoincrement=True,
)
#: Ready rows in claim order (see `claim_order`): a claim reads only the rows it takes. Where
#: the database has partial indexes, tasks without a key are in the claim index and tasks with
#: one in the keyed claim index, by key (PostgreSQL orders an index scan only after equalities,
#: and `partition_key IS NULL` is not one); MariaDB/MySQL have one index of both, by key.
Index(
    "ix_txtasks_tasks_claim",
    tasks.c.queue,
    tasks.c.priority.desc(),
    tasks.c.run_at,
    tasks.c.id,
    postgresql_where=text(f"{READY} AND {UNKEYED}"),
    sqlite_where=text(f"{READY} AND {UNKEYED}"),
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple works
Index(
    "ix_txtasks_tasks_claim_keyed",
    tasks.c.queue,
    tasks.c.partition_key,
    tasks.c.priority.desc(),
    tasks.c.run_at,
    tasks.c.id,
    postgresql_where=text(f"{READY} AND {KEYED}"),
    sqlite_where=text(f"{READY} AND {KEYED}"),
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple works
Index(
    "ix_txtasks_tasks_claim",
    tasks.c.queue,
    tasks.c.partition_key,
    tasks.c.priority.desc(),
    tasks.c.run_at,
    tasks.c.id,
).ddl_if(dialect=("mysql", "mariadb"))  # type: ignore[arg-type]
#: Live rows by queue and state, where the claim index holds every row without its state
#: (MariaDB/MySQL): a count of a queue's ready, scheduled or processing tasks reads only the
#: index entries it counts.
Index(
    "ix_txtasks_tasks_state",
    tasks.c.queue,
    tasks.c.state,
    tasks.c.run_at,
).ddl_if(dialect=("mysql", "mariadb"))  # type: ignore[arg-type]
#: Processing rows by lease (the rescuer), and dedup keys; where the database has partial
#: indexes, only the rows concerned are in them.
Index(
    "ix_txtasks_tasks_lease",
    tasks.c.state,
    tasks.c.lease_expires_at,
    postgresql_where=text("state = 'processing'"),
    sqlite_where=text("state = 'processing'"),
)
Index(
    "uq_txtasks_tasks_dedup",
    tasks.c.dedup_key,
    unique=True,
    postgresql_where=text("dedup_key IS NOT NULL"),
    sqlite_where=text("dedup_key IS NOT NULL"),
)
#: Live rows of each key in enqueue order: the head of an ordered key is its first entry.
Index(
    "ix_txtasks_tasks_keyed",
    tasks.c.queue,
    tasks.c.partition_key,
    tasks.c.id,
    postgresql_where=text(KEYED),
    sqlite_where=text(KEYED),
)
#: The tasks of each key that are processing: a claim counts them, one probe per key.
Index(
    "ix_txtasks_tasks_running",
    tasks.c.queue,
    tasks.c.partition_key,
    postgresql_where=text(f"state = 'processing' AND {KEYED}"),
    sqlite_where=text(f"state = 'processing' AND {KEYED}"),
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple works
Index(
    "ix_txtasks_tasks_stage",
    tasks.c.stage_id,
    postgresql_where=text("stage_id IS NOT NULL"),
    sqlite_where=text("stage_id IS NOT NULL"),
)

archive = Table(
    "txtasks_archive",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=False),
    *_task_columns(),
    Column("finished_at", Timestamp, nullable=False),
    # the return value of a task that keeps its result, as JSON (`keep_result=True`)
    Column("result", LongText, nullable=True),
    mysql_engine="InnoDB",
)
#: Finished rows by state and age: dead letters newest first, retention oldest first (a queue,
#: when given, filters), the tasks finished and enqueued per minute of the last hour. On
#: PostgreSQL and MariaDB/MySQL it also holds the queue and the creation time, so that those
#: per-minute counts read the index alone (with ten million archived tasks PostgreSQL read the
#: whole archive for them, MariaDB a row per task); on MariaDB/MySQL after the id, so that a
#: page of them last finished first still follows it without a sort.
Index(
    "ix_txtasks_archive_state",
    archive.c.state,
    archive.c.finished_at,
    postgresql_include=["queue", "created_at"],
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple works
Index(
    "ix_txtasks_archive_state",
    archive.c.state,
    archive.c.finished_at,
    archive.c.id,
    archive.c.queue,
    archive.c.created_at,
).ddl_if(dialect=("mysql", "mariadb"))  # type: ignore[arg-type]
#: Dead letters by queue: the dashboard finds the queues with dead letters and counts each
#: one's up to a cap from it. Where the database has partial indexes, only dead letters are in
#: it (archiving a task that completed writes no entry of it); MariaDB/MySQL index every
#: archived row by state first.
IS_DEAD = text("state = 'dead'")
Index(
    "ix_txtasks_archive_dead",
    archive.c.queue,
    archive.c.finished_at,
    postgresql_where=IS_DEAD,
    sqlite_where=IS_DEAD,
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple works
Index(
    "ix_txtasks_archive_dead",
    archive.c.state,
    archive.c.queue,
    archive.c.finished_at,
).ddl_if(dialect=("mysql", "mariadb"))  # type: ignore[arg-type]


def along_archive_order(stmt: Any, *, by_queue: bool) -> Any:
    """`stmt` (archived tasks of one state, last finished first) on MariaDB/MySQL along the
    index in that order: of state, queue and finish time when it keeps one queue, else of state
    and finish time (its planner would rather read every entry of the state and sort them)."""
    if not by_queue:
        return along_archive_state(stmt)
    hint = "FORCE INDEX (ix_txtasks_archive_dead)"
    return stmt.with_hint(archive, hint, "mysql").with_hint(archive, hint, "mariadb")


def along_archive_state(stmt: Any) -> Any:
    """`stmt` (of the archive, by state) along the archive's index of state on MariaDB/MySQL,
    whose planner reads the whole table instead when a tenth of its rows are in the state."""
    hint = "FORCE INDEX (ix_txtasks_archive_state)"
    return stmt.with_hint(archive, hint, "mysql").with_hint(archive, hint, "mariadb")


#: One row per periodic schedule: a fire time is enqueued by whoever moves `next_fire_at` on.
periodic = Table(
    "txtasks_periodic",
    metadata,
    Column("name", ExactString(255), primary_key=True),
    Column("schedule", String(255), nullable=False),
    Column("next_fire_at", Timestamp, nullable=False),
    Column("last_fire_at", Timestamp, nullable=True),
    Column("updated_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: The partition attempts staging rows (Spark), one row each: the attempt's number (`id`), drawn
#: once when it starts, keys its staged rows; its write and stage id are kept here, once. The
#: commit or abort of its write ends it (write key "": no write reads its rows) and the cleaner's
#: purge deletes it after its rows (a deferred commit's: the publish of its last rows), or, when
#: its write never ended, its rows once it is older than `archiver.staged_after` (`created_at`:
#: when it started).
stages = Table(
    "txtasks_stages",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("write_key", String(32), nullable=False),
    Column("stage_id", String(64), nullable=False),
    Column("created_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
    sqlite_autoincrement=True,
)
Index("ix_txtasks_stages_write", stages.c.write_key)

#: Rows staged by a staging writer (a Spark partition attempt), until its write commits: the
#: commit copies them into the hot table with the write's queue, task name and attempts, and
#: its own time as each task's creation (and due time, unless the row has one). Keyed by the
#: attempt (`stage`: its `stages` row) and the row's number in it (0, 1, ...): the one index.
staged = Table(
    "txtasks_staged",
    metadata,
    Column("stage", Id, primary_key=True, autoincrement=False),
    Column("n", Integer, primary_key=True, autoincrement=False),
    Column("payload", Blob, nullable=False),
    Column("priority", Integer, nullable=False),
    # None: due when published
    Column("run_at", Timestamp, nullable=True),
    Column("dedup_key", ExactString(255), nullable=True),
    # the task's key (see txtasks.keys); None: no key
    Column("partition_key", ExactString(255), nullable=True),
    mysql_engine="InnoDB",
)

#: Staged writes in progress: staging commits only while its write's row is here (see
#: `txtasks.spark.staging`).
writes = Table(
    "txtasks_writes",
    metadata,
    Column("write_key", String(32), primary_key=True),
    Column("opened_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: The attempts of writes committed in deferred mode whose staged rows are not all published
#: yet (`stage`: the attempt's number, its `stages` row): a publisher moves them into the hot
#: table in batches and deletes the row with the last batch (see
#: `txtasks.spark.staging.publisher`).
deferred = Table(
    "txtasks_deferred",
    metadata,
    Column("stage", Id, primary_key=True, autoincrement=False),
    Column("commit_id", ExactString(255), nullable=False),
    # what the publish adds to each row (a task name and queue, or a topic), as JSON
    Column("target", Text, nullable=False),
    Column("committed_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Writes committed by a staging writer (Spark): a commit id is applied once.
commits = Table(
    "txtasks_commits",
    metadata,
    Column("commit_id", ExactString(255), primary_key=True),
    Column("committed_at", Timestamp, nullable=False),
    Column("tasks", Integer, nullable=False),
    mysql_engine="InnoDB",
)

#: One row per key that has had work: when a claim should look at it again (`ready_at`, None
#: while nothing can start) and its rate's next start. Written by claims only, under the row's
#: lock, so claims of one key never overlap; enqueues never touch it (they leave hints).
keys = Table(
    "txtasks_keys",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("queue", ExactString(128), nullable=False),
    Column("partition_key", ExactString(255), nullable=False),
    Column("ready_at", Timestamp, nullable=True),
    Column("next_start_at", Timestamp, nullable=True),
    Column("updated_at", Timestamp, nullable=False),
    UniqueConstraint("queue", "partition_key", name="uq_txtasks_keys"),
    mysql_engine="InnoDB",
    sqlite_autoincrement=True,
)
Index(
    "ix_txtasks_keys_ready",
    keys.c.queue,
    keys.c.ready_at,
    keys.c.id,
    postgresql_where=text("ready_at IS NOT NULL"),
    sqlite_where=text("ready_at IS NOT NULL"),
)

#: Hints that a key may have work (a task of it was enqueued, or finished an attempt): insert
#: only, so an enqueue waits for no lock; a claim turns them into `txtasks_keys` rows.
key_hints = Table(
    "txtasks_key_hints",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("queue", ExactString(128), nullable=False),
    Column("partition_key", ExactString(255), nullable=False),
    Column("run_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
    sqlite_autoincrement=True,
)
Index("ix_txtasks_key_hints_queue", key_hints.c.queue, key_hints.c.id)

#: Limits set at run time for a key (`txtasks keys set`), over those the application declares;
#: queue '*' is the key in every queue. A NULL field keeps the declared value.
key_limits = Table(
    "txtasks_key_limits",
    metadata,
    Column("queue", ExactString(128), primary_key=True),
    Column("partition_key", ExactString(255), primary_key=True),
    Column("concurrency", Integer, nullable=True),
    Column("ordered", Integer, nullable=True),
    Column("rate_count", Integer, nullable=True),
    Column("rate_per", Double, nullable=True),
    Column("rate_burst", Integer, nullable=True),
    Column("updated_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Groups subscribed to topics (see txtasks.topics): a publish inserts one task per row of its
#: topic, in one INSERT ... SELECT from this table, with the row's task name, queue, priority
#: and attempts.
subscriptions = Table(
    "txtasks_subscriptions",
    metadata,
    Column("topic", ExactString(128), primary_key=True),
    Column("group_name", ExactString(128), primary_key=True),
    Column("task_name", String(255), nullable=False),
    Column("queue", ExactString(128), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("updated_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Publishes that found no subscriber (insert only: a publish never waits for a lock here);
#: the cleaner's retention sweep forgets them after `retention.topic_drops`.
topic_drops = Table(
    "txtasks_topic_drops",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("topic", ExactString(128), nullable=False),
    Column("dropped_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
    sqlite_autoincrement=True,
)
Index("ix_txtasks_topic_drops_topic", topic_drops.c.topic, topic_drops.c.dropped_at)
Index("ix_txtasks_topic_drops_at", topic_drops.c.dropped_at)

#: Paused queues (`txtasks pause`): claims take no task of a queue that has a row here.
#: Tiny, and read by every claim along its primary key.
paused_queues = Table(
    "txtasks_paused_queues",
    metadata,
    Column("queue", ExactString(128), primary_key=True),
    Column("paused_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Workers and cleaners that are running: each writes its row at start and again at every
#: heartbeat (what it runs, how many tasks), and deletes it when it stops. A row whose
#: `expires_at` passed belongs to a process that stopped beating (killed, or cut off).
processes = Table(
    "txtasks_processes",
    metadata,
    Column("id", ExactString(128), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    # what it runs: its queues (a worker) or sweeps (a cleaner), comma-separated
    Column("runs", LongText, nullable=False),
    # tasks it is running (a worker), or None
    Column("running", Integer, nullable=True),
    Column("started_at", Timestamp, nullable=False),
    Column("beat_at", Timestamp, nullable=False),
    Column("expires_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Tasks enqueued and finished per queue and minute (`minute`: minutes since 1970-01-01 UTC),
#: kept a week: the cleaner's stats sweep writes each minute once it is over, inserting a row
#: only where none is (a second cleaner, or a rerun, finds it written and counts nothing twice),
#: and deletes those older than `StatsConfig.history_keep`. The dashboard charts a day or a
#: week from it (the last hour from the task tables). `failed`: failed, discarded and cancelled.
history = Table(
    "txtasks_history",
    metadata,
    Column("minute", Integer, primary_key=True, autoincrement=False),
    Column("queue", ExactString(128), primary_key=True),
    Column("enqueued", Integer, nullable=False),
    Column("completed", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("dead", Integer, nullable=False),
    mysql_engine="InnoDB",
)

migrations = Table(
    "txtasks_migrations",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", String(255), nullable=False),
    Column("applied_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Columns of the hot table, in order, as copied into the archive.
TASK_COLUMNS = tuple(c.name for c in tasks.columns)
