"""MariaDB / MySQL: SKIP LOCKED claims as SELECT then UPDATE (no UPDATE ... RETURNING)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import math
import time
import typing
from collections.abc import Generator, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Executable,
    Integer,
    Result,
    String,
    bindparam,
    cast,
    event,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.mysql import CHAR
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert

from txtasks._waits import within
from txtasks.driver.base import Capabilities
from txtasks.driver.database import CLOSE_WITHIN, SqlDatabase
from txtasks.driver.dialect import SqlDialect
from txtasks.driver.insert_plan import TASK_COLUMNS, DriverSql, Step
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sql_claims import Claim, SqlClaims
from txtasks.driver.sql_lanes import SqlLanes
from txtasks.driver.statements.claims import ClaimStatements
from txtasks.driver.statements.control import ControlStatements
from txtasks.driver.statements.dashboard import DashboardStatements, minute_of
from txtasks.driver.statements.enqueue import EnqueueStatements
from txtasks.driver.statements.history import HISTORY_COLUMNS, HistoryStatements
from txtasks.driver.statements.keys import (
    HeldKey,
    KeyStatements,
    keys_arm_values,
)
from txtasks.driver.statements.outcomes import OutcomeStatements
from txtasks.driver.statements.topics import PUBLISH_COLUMNS, TopicStatements
from txtasks.driver.timeouts import DatabaseTimeout, Watchdog, keepalive_set, socket_of
from txtasks.errors import SchemaError
from txtasks.schema import migrate as schema_migrate
from txtasks.schema.tables import (
    READY,
    ExactString,
    Timestamp,
    archive,
    history,
    keys,
    paused_queues,
    subscriptions,
    tasks,
)
from txtasks.types import CLAIMED_COLUMNS, READY_STATES, NewTask, TaskRow, TaskState

#: A JSON array of ids, or of [id, attempt] pairs, as a table: joined to the tasks table by
#: STRAIGHT_JOIN, each row is then found by its primary key (MariaDB 10.6+, MySQL 8).
IDS_TABLE = "JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS v"
#: The rows of `txtasks_keys` whose ids `:ids` holds (a JSON array), each found by its
#: primary key. A statement that locks or changes keys reaches them this way only: InnoDB
#: locks every index entry a statement passes, so a claim that locked its keys along the
#: index of ready keys also held the entries of full keys it passed (their `ready_at` is
#: NULL), and every outcome arming such a key waited for the claim to end, or deadlocked
#: with it.
KEYS_BY_ID = f"{IDS_TABLE} STRAIGHT_JOIN txtasks_keys AS k FORCE INDEX (PRIMARY) ON k.id = v.id"
KEYS_TABLE = (
    "JSON_TABLE(:keys, '$[*]' COLUMNS (id BIGINT PATH '$[0]', attempt INT PATH '$[1]')) AS k"
)


def _listed(stmt: Any) -> Executable:
    """`stmt`'s rows as one JSON array (of its values, or of arrays of them): PyMySQL reads a
    row in Python, column by column, in microseconds; `json.loads` reads the array in C. Names
    (`ExactString`, stored as UTF-8 bytes) go as text; times as their text (which
    `datetime.fromisoformat` reads back). See `MySQLDialect.rows`."""
    listed = stmt.subquery("j")
    values = [
        cast(c, CHAR(charset="utf8mb4")) if isinstance(c.type, ExactString) else c for c in listed.c
    ]
    one = values[0] if len(values) == 1 else func.json_array(*values)
    return select(func.json_arrayagg(one))


def _delete_by_ids(name: str) -> Executable:
    """Delete the rows `:ids` (a JSON array) of table `name`, each found by its primary key."""
    return text(
        f"DELETE t FROM {IDS_TABLE} STRAIGHT_JOIN {name} AS t FORCE INDEX (PRIMARY) ON t.id = v.id"
    ).bindparams(bindparam("ids", type_=JSON))


#: The longest a `GROUP_CONCAT` (and MariaDB's `JSON_ARRAYAGG`) may be: 1 GiB, the largest
#: `max_allowed_packet` (which then bounds it).
GROUP_CONCAT_MAX = 1 << 30

#: Lock wait timeout exceeded (ER_LOCK_WAIT_TIMEOUT): a lock wait reached
#: `innodb_lock_wait_timeout`; on the kept connection (`NAMED_CLAIM_SQL`), a row is locked.
LOCK_WAIT_TIMEOUT = 1205
#: Deadlock found; lock wait timeout exceeded.
TRANSIENT_ERRNOS = frozenset({1213, LOCK_WAIT_TIMEOUT})


def lock_wait_timed_out(error: BaseException | None) -> bool:
    """Whether `error` (PyMySQL's, as aiomysql raises it or a SQLAlchemy error's `orig`) is
    MariaDB/MySQL's lock wait timeout."""
    return getattr(error, "args", (None,))[:1] == (LOCK_WAIT_TIMEOUT,)


#: pymysql's client flags: affected rows are the rows found (as SQLAlchemy's connections
#: count them), and several statements go in one query.
CLIENT_FOUND_ROWS = 2
CLIENT_MULTI_STATEMENTS = 1 << 16

#: What the named claim returns of each row: the payload, and the other columns of
#: `CLAIMED_COLUMNS` as one JSON array (PyMySQL parses each column of a result in Python, at
#: some microseconds each; `json.loads` the array in C). Names stored as bytes (`ExactString`)
#: go as text, times as their text.
_NAMED_JSON = "JSON_ARRAY({})".format(
    ", ".join(
        f"CAST({c} AS CHAR CHARACTER SET utf8mb4)"
        if c in ("queue", "dedup_key", "partition_key")
        else c
        for c in CLAIMED_COLUMNS
        if c != "payload"
    )
)

#: Claim those of the tasks {ids} a claim of the queues {queues} would take, in one round trip
#: on MariaDB's kept connection (`MySQLDatabase.kept_take`): autocommit, READ COMMITTED, and no
#: lock waits (`innodb_lock_wait_timeout = 0`). The UPDATE finds each row by its primary key and
#: notes the ids it changes in a session variable; the SELECT reads those rows back (MariaDB
#: has no UPDATE ... RETURNING). A row another transaction holds fails the UPDATE at once
#: (`LOCK_WAIT_TIMEOUT`, nothing changed) instead of waiting for it: the claim then goes the
#: transactional way, which skips it (`MySQLClaimStatements.stmt_named_rows`). Parameters:
#: lease_until, worker_id, now, the ids, the queues' names (bytes), now, the ids.
NAMED_CLAIM_SQL = f"""SET @txtasks_named = NULL;
UPDATE txtasks_tasks FORCE INDEX (PRIMARY)
   SET state = 'processing',
       attempt = attempt + 1
                 + 0 * LENGTH(@txtasks_named := CONCAT_WS(',', @txtasks_named, id)),
       lease_expires_at = %s, worker_id = %s, started_at = %s
 WHERE id IN ({{ids}}) AND queue IN ({{queues}}) AND partition_key IS NULL AND {READY}
   AND run_at <= %s AND queue NOT IN (SELECT p.queue FROM txtasks_paused_queues AS p);
SELECT payload, {_NAMED_JSON} FROM txtasks_tasks FORCE INDEX (PRIMARY)
 WHERE id IN ({{ids}}) AND FIND_IN_SET(id, @txtasks_named) AND state = 'processing'"""


def migration_lock_name(conn: Connection) -> str:
    """The migration lock of the connection's database. Named locks are the server's, so the
    name holds the database's: migrations of databases side by side on one server never wait
    for each other. (At most 64 characters: a long database name is hashed.)"""
    database = str(conn.exec_driver_sql("SELECT DATABASE()").scalar() or "")
    name = f"{schema_migrate.LOCK_NAME}.{database}"
    if len(name) > 64:
        name = f"{schema_migrate.LOCK_NAME}.{hashlib.sha1(database.encode()).hexdigest()}"
    return name


#: The columns of a bulk enqueue on MariaDB, in the order of `_bulk_values`.
BULK_COLUMNS = ", ".join(TASK_COLUMNS)
#: The most SQL one bulk statement carries (as PyMySQL's executemany; a longer row goes alone).
BULK_STATEMENT_BYTES = 1_024_000


def _exact(value: str | None) -> bytes | None:
    """An `ExactString` value as bound on MySQL/MariaDB: its UTF-8 bytes."""
    return None if value is None else value.encode("utf-8")


def _bulk_values(row: NewTask) -> tuple[Any, ...]:
    """A new task's values in the order of `BULK_COLUMNS`, as SQLAlchemy would bind them."""
    return (
        _exact(row.queue),
        row.task_name,
        row.payload,
        row.content_type,
        row.state.value,
        row.priority,
        row.run_at,
        0,
        row.max_attempts,
        row.created_at,
        _exact(row.dedup_key),
        row.headers,
        row.expires_at,
        row.stage_id,
        _exact(row.partition_key),
    )


def _bulk_statements(
    records: list[tuple[Any, ...]], literal: Any
) -> list[tuple[str, tuple[Any, ...], int]]:
    """Multi-row `INSERT ... RETURNING id` statements of `records` in order, each with its
    parameters and row count. Every value is written by the driver's own escaping (what its
    executemany does) and a column that holds one value in every row is escaped once; but
    the first value of each statement, which is bound as its one parameter: the drivers
    `%`-format a statement with parameters and, for some calls without, not for others, so
    each statement has one (and its `%` doubled)."""
    columns = list(zip(*records, strict=True))
    once = [literal(c[0]) if c.count(c[0]) == len(c) else None for c in columns]
    head = f"INSERT INTO txtasks_tasks ({BULK_COLUMNS}) VALUES (%s"
    statements: list[tuple[str, tuple[Any, ...], int]] = []
    parts: list[str] = []
    size = 0
    first = 0

    def close() -> None:
        sql = head + ",".join(parts).replace("%", "%%") + " RETURNING id"
        statements.append((sql, (records[first][0],), len(parts)))

    for n, record in enumerate(records):
        values = [v if v is not None else literal(x) for v, x in zip(once, record, strict=True)]
        if parts and size > BULK_STATEMENT_BYTES:
            close()
            parts, size, first = [], 0, n
        if parts:
            parts.append("(" + ",".join(values) + ")")
        else:  # after the statement's head: its first value is the parameter
            parts.append("," + ",".join(values[1:]) + ")")
        size += len(parts[-1]) + 1
    close()
    return statements


class MySQLEnqueueStatements(EnqueueStatements):
    """MySQL's enqueue statements."""

    @classmethod
    def _insert_plain(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        """Several rows on MariaDB: multi-row `INSERT ... RETURNING id` statements, their
        values escaped by the driver as its executemany would (SQLAlchemy's spent more per
        row than the statement on the server). The ids of one statement, sorted, are in the
        order of its rows: it is a simple insert (its rows known up front), so InnoDB gives
        it consecutive ids in row order (`innodb_autoinc_lock_mode` 0 or 1, MariaDB's
        default; SQLAlchemy's ordered RETURNING on MariaDB sorts them the same way)."""
        if len(todo) == 1 or not cls.sql.returning_insert:
            yield from super()._insert_plain(rows, todo, ids)
            return
        records = [_bulk_values(rows[i]) for i in todo]
        built: list[tuple[str, tuple[Any, ...], int]] = []  # still to send, the next last
        sent: list[int] = []  # how many rows each statement sent carries

        def build(driver: Any) -> tuple[str, tuple[Any, ...]]:
            if not sent:
                built.extend(reversed(_bulk_statements(records, driver.literal)))
            sql, params, count = built.pop()
            sent.append(count)
            return sql, params

        done = 0
        while done < len(todo):
            result = yield DriverSql(build)
            new_ids = sorted(result.scalars().all())
            rows_sent = todo[done : done + sent[-1]]
            if len(new_ids) != len(rows_sent):
                raise RuntimeError(f"enqueue: {len(rows_sent)} rows sent, {len(new_ids)} ids")
            for i, new_id in zip(rows_sent, new_ids, strict=True):
                ids[i] = new_id
            done += len(rows_sent)

    @classmethod
    def stmt_insert_dedup(cls) -> Insert:
        """A duplicate key is a no-op update: no error, the caller's transaction goes on."""
        stmt = mysql_insert(tasks)
        return stmt.on_duplicate_key_update(id=tasks.c.id)

    @classmethod
    def stmt_dedup_lookup(cls, keys: Sequence[str]) -> Executable:
        """A locking read: sees rows committed after this transaction's snapshot."""
        return (
            select(tasks.c.id, tasks.c.dedup_key)
            .where(tasks.c.dedup_key.in_(keys))
            .with_for_update(read=True)
        )


class MySQLClaimStatements(ClaimStatements):
    """MySQL's claims statements."""

    @staticmethod
    @functools.cache
    def stmt_rows_by_ids() -> Executable:
        """The ready rows `ids`, locked, each found by its primary key (a range of ids read
        from one end to the other locks the rows between, those other workers hold too)."""
        columns = ", ".join(f"t.{c.name}" for c in tasks.c)
        return (
            text(
                f"SELECT {columns} FROM {IDS_TABLE} STRAIGHT_JOIN txtasks_tasks AS t "
                "FORCE INDEX (PRIMARY) ON t.id = v.id WHERE t.state IN :ready FOR UPDATE"
            )
            .bindparams(
                bindparam("ids", type_=JSON),
                bindparam("ready", [s.value for s in READY_STATES], expanding=True),
            )
            .columns(*tasks.c)
        )

    @staticmethod
    @functools.cache
    def stmt_named_rows() -> Executable:
        """Of the tasks `ids`, the whole rows a claim of `queues` would take, each found by
        its primary key, locked, skipping rows others hold (see `stmt_rows_by_ids`)."""
        columns = ", ".join(f"t.{c.name}" for c in tasks.c)
        return (
            text(
                f"SELECT {columns} FROM {IDS_TABLE} STRAIGHT_JOIN txtasks_tasks AS t "
                "FORCE INDEX (PRIMARY) ON t.id = v.id WHERE t.state IN :ready "
                "AND t.queue IN :queues AND t.partition_key IS NULL AND t.run_at <= :now "
                "AND t.queue NOT IN (SELECT p.queue FROM txtasks_paused_queues AS p) "
                "ORDER BY t.priority DESC, t.run_at, t.id LIMIT :limit FOR UPDATE SKIP LOCKED"
            )
            .bindparams(
                bindparam("ids", type_=JSON),
                bindparam("ready", [s.value for s in READY_STATES], expanding=True),
                bindparam("queues", expanding=True),
                bindparam("now", type_=Timestamp),
                bindparam("limit", type_=Integer),
            )
            .columns(*tasks.c)
        )

    @classmethod
    @functools.cache
    def stmt_ready_rows(cls) -> Executable:
        """Whole ready rows, locked, skipping rows others hold (no UPDATE ... RETURNING)."""
        return cls.stmt_ready().with_only_columns(*tasks.c)  # type: ignore[no-any-return]

    @classmethod
    @functools.cache
    def stmt_claim_ids(cls) -> Executable:
        """Mark the locked rows `ids` claimed."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)))
            .values(**cls.claim_values())
        )


class MySQLKeyStatements(KeyStatements):
    """MySQL's keys statements."""

    @classmethod
    @functools.cache
    def stmt_keys_arm(cls) -> Executable:
        stmt = mysql_insert(keys).values(**keys_arm_values())
        return stmt.on_duplicate_key_update(
            ready_at=cls.armed_at(keys.c.ready_at, stmt.inserted.ready_at),
            updated_at=stmt.inserted.updated_at,
        )

    @staticmethod
    @functools.cache
    def stmt_hints_arm() -> Executable:
        """As `SqlDialect.keys.stmt_hints_arm`, the hints found by their primary key."""
        return text(
            "INSERT INTO txtasks_keys (queue, partition_key, ready_at, updated_at) "
            "SELECT h.queue, h.partition_key, min(h.run_at), :now FROM "
            f"{IDS_TABLE} STRAIGHT_JOIN txtasks_key_hints AS h FORCE INDEX (PRIMARY) ON h.id = v.id "
            "GROUP BY h.queue, h.partition_key ORDER BY h.queue, h.partition_key "
            "ON DUPLICATE KEY UPDATE ready_at = CASE WHEN txtasks_keys.ready_at IS NULL "
            "OR txtasks_keys.ready_at > VALUES(ready_at) THEN VALUES(ready_at) "
            "ELSE txtasks_keys.ready_at END, updated_at = VALUES(updated_at)"
        ).bindparams(bindparam("ids", type_=JSON), bindparam("now", type_=Timestamp))

    @staticmethod
    @functools.cache
    def stmt_hints_delete() -> Executable:
        """Hints `ids`, each found by its primary key."""
        return _delete_by_ids("txtasks_key_hints")

    @classmethod
    @functools.cache
    def stmt_hints_take(cls) -> Executable:
        return _listed(super().stmt_hints_take())

    @classmethod
    @functools.cache
    def stmt_keys_ready_ids(cls) -> Executable:
        return _listed(cls.stmt_keys_ready().with_only_columns(keys.c.id))

    @staticmethod
    @functools.cache
    def stmt_keys_lock_ids() -> Executable:
        """Keys `ids` still ready by `now`, locked, skipping those another claim holds, with
        when each became ready."""
        return _listed(
            text(
                "SELECT k.id, k.queue, k.partition_key, k.next_start_at, k.ready_at "
                f"FROM {KEYS_BY_ID} WHERE k.ready_at <= :now "
                "ORDER BY k.ready_at, k.id FOR UPDATE SKIP LOCKED"
            )
            .bindparams(bindparam("ids", type_=JSON), bindparam("now", type_=Timestamp))
            .columns(
                keys.c.id, keys.c.queue, keys.c.partition_key, keys.c.next_start_at, keys.c.ready_at
            )
        )

    @classmethod
    @functools.cache
    def stmt_keys_running(cls) -> Executable:
        return _listed(super().stmt_keys_running())

    @classmethod
    @functools.cache
    def stmt_keys_due_first(cls, count: int) -> Executable:
        return _listed(super().stmt_keys_due_first(count))

    @classmethod
    @functools.cache
    def stmt_keys_busy(cls) -> Executable:
        return _listed(super().stmt_keys_busy())

    @staticmethod
    @functools.cache
    def stmt_keys_of() -> Executable:
        """As `SqlDialect.keys.stmt_keys_of`, each key found by its unique index: MariaDB does not
        range-scan a list of (queue, key) pairs, and read every key of the table per outcome."""
        pairs = (
            "JSON_TABLE(:pairs, '$[*]' COLUMNS ("
            "queue VARCHAR(128) CHARACTER SET utf8mb4 PATH '$[0]', "
            "partition_key VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[1]')) AS v"
        )
        return _listed(
            text(
                f"SELECT k.id, k.queue, k.partition_key FROM {pairs} "
                "STRAIGHT_JOIN txtasks_keys AS k FORCE INDEX (uq_txtasks_keys) "
                "ON k.queue = CAST(v.queue AS BINARY) "
                "AND k.partition_key = CAST(v.partition_key AS BINARY) "
                "ORDER BY k.id FOR UPDATE SKIP LOCKED"
            )
            .bindparams(bindparam("pairs", type_=JSON))
            .columns(keys.c.id, keys.c.queue, keys.c.partition_key)
        )

    @staticmethod
    @functools.cache
    def stmt_keys_settle() -> Executable:
        return text(
            f"UPDATE {KEYS_BY_ID} SET k.ready_at = :ready_at, "
            "k.next_start_at = :next_start_at, k.updated_at = :now"
        ).bindparams(
            bindparam("ids", type_=JSON),
            bindparam("ready_at", type_=Timestamp),
            bindparam("next_start_at", type_=Timestamp),
            bindparam("now", type_=Timestamp),
        )

    @staticmethod
    @functools.cache
    def stmt_keys_wake() -> Executable:
        return text(
            f"UPDATE {KEYS_BY_ID} SET k.ready_at = CASE WHEN k.ready_at IS NULL "
            "OR k.ready_at > :now THEN :now ELSE k.ready_at END, k.updated_at = :now"
        ).bindparams(bindparam("ids", type_=JSON), bindparam("now", type_=Timestamp))


class MySQLOutcomeStatements(OutcomeStatements):
    """MySQL's outcomes statements."""

    @staticmethod
    @functools.cache
    def stmt_lock_keys(skip_locked: bool = False) -> Executable:
        """Lock the rows of still-current attempts, each found by its primary key. (On a small
        table the optimizer scans instead, and a scan locks, and waits for, every row it
        passes: other workers' rows, and the application's new ones.)"""
        skip = " SKIP LOCKED" if skip_locked else ""
        return (
            text(
                "SELECT t.id, t.attempt, t.queue, t.partition_key, t.cancel_requested_at "
                f"FROM {KEYS_TABLE} "
                "STRAIGHT_JOIN txtasks_tasks AS t FORCE INDEX (PRIMARY) "
                "ON t.id = k.id AND t.attempt = k.attempt "
                "WHERE t.state = :processing "
                "AND (:fence_worker IS NULL OR t.worker_id = :fence_worker) "
                "AND (:fence_expired IS NULL OR t.lease_expires_at < :fence_expired) "
                f"ORDER BY t.id FOR UPDATE{skip}"
            )
            .bindparams(
                bindparam("keys", type_=JSON),
                bindparam("processing", TaskState.PROCESSING.value, type_=String),
                bindparam("fence_worker", type_=String),
                bindparam("fence_expired", type_=Timestamp),
            )
            .columns(
                tasks.c.id,
                tasks.c.attempt,
                tasks.c.queue,
                tasks.c.partition_key,
                tasks.c.cancel_requested_at,
            )
        )

    @staticmethod
    @functools.cache
    def stmt_delete() -> Executable:
        """Remove rows `ids`, each found by its primary key (see `stmt_lock_keys`)."""
        return _delete_by_ids("txtasks_tasks")


class MySQLTopicStatements(TopicStatements):
    """MySQL's topics statements."""

    @classmethod
    def publish_insert(cls, source: Any, dedup: bool) -> Insert:
        """A live dedup key is a no-op update (MariaDB then returns the live task, which the
        publish plan tells apart by its headers)."""
        if not dedup:
            return super().publish_insert(source, dedup)
        stmt = mysql_insert(tasks).from_select(PUBLISH_COLUMNS, source)
        return stmt.on_duplicate_key_update(id=tasks.c.id)

    @classmethod
    @functools.cache
    def stmt_subscribe(cls) -> Executable:
        stmt = mysql_insert(subscriptions).values(**cls.subscribe_values())
        return stmt.on_duplicate_key_update(
            task_name=stmt.inserted.task_name,
            queue=stmt.inserted.queue,
            priority=stmt.inserted.priority,
            max_attempts=stmt.inserted.max_attempts,
            updated_at=stmt.inserted.updated_at,
        )


class MySQLControlStatements(ControlStatements):
    """MySQL's control statements."""

    @classmethod
    @functools.cache
    def stmt_pause(cls) -> Executable:
        """A queue paused already keeps its time (a no-op update)."""
        values = {"queue": bindparam("queue"), "paused_at": bindparam("now", type_=Timestamp)}
        stmt = mysql_insert(paused_queues).values(**values)
        return stmt.on_duplicate_key_update(paused_at=paused_queues.c.paused_at)


@compiles(minute_of, "mysql")
@compiles(minute_of, "mariadb")
def _minute_mysql(element: minute_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"DATE_FORMAT({compiler.process(element.clauses, **kw)}, '%%Y-%%m-%%d %%H:%%i')"


class MySQLDashboardStatements(DashboardStatements):
    """MySQL's dashboard reads: its claim index holds every row without its state, so queue
    depths go along the index of queue and state, and dead letters along their index."""

    depths_by_state: ClassVar[bool] = True

    @staticmethod
    def along_dead(stmt: Any) -> Any:
        """Along the archive's index of dead letters, which the planner would pass over for
        the index of state and finish time (reading every dead letter)."""
        return stmt.with_hint(archive, "FORCE INDEX (ix_txtasks_archive_dead)")

    @staticmethod
    def along_ids(stmt: Any) -> Any:
        """Along the primary key, which the planner would pass over for the index of queue and
        state when a queue is given (then sorting every live task of the queue by id)."""
        return stmt.with_hint(tasks, "FORCE INDEX (PRIMARY)")


class MySQLHistoryStatements(HistoryStatements):
    """MySQL's history writes."""

    @classmethod
    @functools.cache
    def stmt_history_insert(cls) -> Executable:
        """A row already there keeps its counts (a no-op update)."""
        stmt = mysql_insert(history).values(**{c: bindparam(c) for c in HISTORY_COLUMNS})
        return stmt.on_duplicate_key_update(minute=history.c.minute)


class MySQLLanes(SqlLanes):
    """A claim's rows read first, then locked or updated by their primary keys."""

    @property
    def keys_sql(self) -> type[MySQLKeyStatements]:
        return typing.cast("type[MySQLKeyStatements]", self.db.sql.keys)

    @property
    def claims_sql(self) -> type[MySQLClaimStatements]:
        return typing.cast("type[MySQLClaimStatements]", self.db.sql.claims)

    async def keys_held(self, conn: AsyncConnection, params: dict[str, Any]) -> list[Any]:
        """The ready keys read first without a lock, then locked by their primary keys (see
        `KEYS_BY_ID`), skipping those another claim holds and those no longer ready; longest
        waiting first."""
        ids = self.db.sql.rows(await conn.execute(self.keys_sql.stmt_keys_ready_ids(), params))
        if not ids:
            return []
        locked = await conn.execute(
            self.keys_sql.stmt_keys_lock_ids(), {"ids": ids, "now": params["now"]}
        )
        held = sorted(self.db.sql.rows(locked), key=lambda r: (r[4], r[0]))  # ready_at, id
        return [
            HeldKey(key_id, queue, key, None if start is None else datetime.fromisoformat(start))
            for key_id, queue, key, start, _ready_at in held
        ]

    async def claim_ids(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """No UPDATE ... RETURNING: the rows read (locked), then marked claimed."""
        found = (await conn.execute(self.claims_sql.stmt_rows_by_ids(), params)).mappings().all()
        return await self._claim_found(conn, found, params)

    async def claim(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        found = (await conn.execute(self.claims_sql.stmt_ready_rows(), params)).mappings().all()
        return await self._claim_found(conn, found, params)

    async def claim_named(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        found = (await conn.execute(self.claims_sql.stmt_named_rows(), params)).mappings().all()
        return await self._claim_found(conn, found, params)

    async def _claim_found(
        self, conn: AsyncConnection, found: Sequence[Any], params: dict[str, Any]
    ) -> list[TaskRow]:
        """Mark the locked ready rows `found` claimed; the rows as claimed."""
        if not found:
            return []
        ids = [r["id"] for r in found]
        await conn.execute(self.claims_sql.stmt_claim_ids(), {**params, "ids": ids})
        claimed = {
            "state": TaskState.PROCESSING.value,
            "lease_expires_at": params["lease_until"],
            "worker_id": params["worker_id"],
            "started_at": params["now"],
        }
        return [TaskRow.from_row({**r, **claimed, "attempt": r["attempt"] + 1}) for r in found]


class MySQLDialect(SqlDialect):
    """MySQL 8: SKIP LOCKED claims as SELECT then UPDATE, no INSERT ... RETURNING, rows found
    by primary key through JSON_TABLE."""

    capabilities: ClassVar[Capabilities] = Capabilities("mysql", local_infile=True)

    returning_insert: ClassVar[bool] = False

    returning_dedup: ClassVar[bool] = False

    enqueue = MySQLEnqueueStatements
    claims = MySQLClaimStatements
    keys = MySQLKeyStatements
    outcomes = MySQLOutcomeStatements
    topics = MySQLTopicStatements
    control = MySQLControlStatements
    dashboard = MySQLDashboardStatements
    history = MySQLHistoryStatements

    @staticmethod
    @contextlib.contextmanager
    def migration_lock(conn: Connection) -> Iterator[None]:
        """A named lock of the server (a session's, not a transaction's), waited for up to
        LOCK_WAIT seconds. DDL commits implicitly on MySQL/MariaDB, so a migration is not atomic
        there anyway: the migrating transaction is committed before the lock is released, so that
        the next holder reads the record of the last migration."""
        name = migration_lock_name(conn)
        query = text("SELECT GET_LOCK(:name, :wait)")
        got = conn.execute(query, {"name": name, "wait": schema_migrate.LOCK_WAIT}).scalar()
        if got is None:
            raise SchemaError(f"the migration lock {name!r} could not be taken (GET_LOCK failed)")
        if got != 1:
            raise schema_migrate.lock_timeout_error()
        try:
            yield
            conn.exec_driver_sql("COMMIT")
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})

    @staticmethod
    def rows(result: Result[Any]) -> list[Any]:
        """The rows of a statement `_listed` returns as one JSON array (none: NULL)."""
        value = result.scalar()
        return [] if value is None else list(json.loads(value))

    scalars = rows

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(exc, "args", ())
        return bool(args) and isinstance(args[0], int) and args[0] in TRANSIENT_ERRNOS


class MariaDBDialect(MySQLDialect):
    """MariaDB 10.6+: as MySQL, with INSERT ... RETURNING."""

    returning_insert: ClassVar[bool] = True


class MySQLDatabase(SqlDatabase):
    """MySQL 8 and MariaDB through aiomysql (async) and pymysql (sync); which of the two it
    talks to, the first connection tells (`SqlDatabase.sql`). On MariaDB without a
    connection budget, one aiomysql connection of its own is kept for the worker's named
    claims (`kept_take`)."""

    dialect_class: ClassVar[type[SqlDialect]] = MySQLDialect

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The connection kept for the named claims, its event loop and when it was opened
        #: (`time.monotonic()`, as `_stale_before`).
        self._kept: tuple[asyncio.AbstractEventLoop, Any, float] | None = None
        #: A claim is using the kept connection.
        self._kept_busy = False
        #: No kept connection: the server is MySQL, the engine's driver is not aiomysql, or
        #: a connection budget is set (every connection is then the pools', within it).
        self._kept_off = self.connections is not None

    def kept_take(self) -> Any | None:
        """The connection kept for MariaDB's named claims (`NAMED_CLAIM_SQL`), taken for a
        claim (`kept_give` gives it back), if one is open and free on this event loop; else
        None, and `kept_open` may open one.

        Held outside any pool: aiomysql's own would cost a task and a turn of the event loop
        at each acquire and release, on the path from a wake-up to the handler; the engine's
        a ROLLBACK at each return. Each use is bounded by the command timeout, past which its
        socket is cut (`DatabaseTimeout`): see `MySQLClaims.named_claim`."""
        kept = self._kept
        if kept is None or self._kept_busy:
            return None
        loop, connection, opened_at = kept
        reader = connection._reader
        if (
            loop is not asyncio.get_running_loop()
            or reader is None
            or reader.at_eof()  # the server closed it (its idle timeout, a restart)
            or opened_at < self._stale_before  # opened before a cut: likely stalled too
        ):
            self._kept_drop(connection)
            return None
        self._kept_busy = True
        return connection

    async def kept_open(self) -> Any | None:
        """A new kept connection, taken as `kept_take` takes it, opened within
        `Timeouts.checkout`; None when another claim holds the kept connection, or there is
        none to have (the server is MySQL, the engine's driver not aiomysql, a budget set): the caller
        then takes the transactional way."""
        if self._kept_off or self._kept_busy:
            return None
        self._kept_busy = True
        try:
            connection = await self._kept_connection()
        except BaseException:
            self._kept_busy = False
            raise
        if connection is None:
            self._kept_busy = False
        return connection

    def kept_give(self, connection: Any, ok: bool) -> None:
        """Give back a connection `kept_take` or `kept_open` took; one whose use failed, was
        cut or cancelled (`ok` False) is closed: its state is unknown."""
        self._kept_busy = False
        if not ok:
            self._kept_drop(connection)

    async def _kept_connection(self) -> Any | None:
        """A new kept connection for this event loop, replacing any other; None on MySQL."""
        loop = asyncio.get_running_loop()
        if self._kept is not None:
            self._kept_drop(self._kept[1])
        limit = self.timeouts.checkout
        deadline = loop.time() + limit
        try:
            new = await within(self._kept_connect(), limit)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            if loop.time() < deadline:  # a timeout of the driver's own: its error stands
                raise
            raise DatabaseTimeout(
                f"no connection from the database within {limit:g}s (the connect timeout "
                "plus the command timeout): given up"
            ) from exc
        if new is not None:
            self._kept = (loop, new, time.monotonic())
        return new

    async def _kept_connect(self) -> Any | None:
        """A new connection for the named claims: autocommit, READ COMMITTED (the subquery
        of paused queues is read without locks), no lock waits; with keepalives. None (and
        no more tries) if the server is MySQL, whose lock waits last a second at least, or
        the engine's driver is not aiomysql."""
        engine = self.engine
        if engine.dialect.driver != "aiomysql":
            self._kept_off = True
            return None
        import aiomysql

        _args, params = engine.dialect.create_connect_args(engine.url)
        params.update(self.connect_args(sync=False))
        params.update(self._engine_options.get("connect_args", {}))
        flags = params.get("client_flag", 0) | CLIENT_FOUND_ROWS | CLIENT_MULTI_STATEMENTS
        params.update(client_flag=flags, autocommit=True)
        params.setdefault("charset", "utf8mb4")
        connection = await aiomysql.connect(**params)
        try:
            if "mariadb" not in str(connection.server_version).lower():
                self._kept_off = True
                connection.close()
                return None
            keepalive_set(socket_of(connection), self.timeouts)
            async with connection.cursor() as cursor:
                await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                await cursor.execute("SET SESSION innodb_lock_wait_timeout = 0")
        except BaseException:
            connection.close()
            raise
        return connection

    def _kept_drop(self, connection: Any) -> None:
        """Close `connection` at once (no goodbye: it may be stalled) and forget it."""
        if self._kept is not None and self._kept[1] is connection:
            self._kept = None
        with contextlib.suppress(Exception):  # closed already, or its event loop is
            connection.close()

    async def close(self) -> None:
        """The kept connection too: politely, or dropped after `CLOSE_WITHIN` seconds."""
        kept, self._kept = self._kept, None
        if kept is not None:
            loop, connection, _opened = kept
            if loop is asyncio.get_running_loop() and not connection.closed:
                try:
                    await asyncio.wait_for(connection.ensure_closed(), CLOSE_WITHIN)
                except Exception:
                    self._kept_drop(connection)
            else:
                self._kept_drop(connection)
        await super().close()

    def engine_options(self) -> dict[str, Any]:
        """READ COMMITTED: the worker's and cleaner's statements lock only the rows they
        take, never the gaps between them (REPEATABLE READ's next-key locks would stall, and
        deadlock, the application's INSERTs of new tasks)."""
        return {"isolation_level": "READ COMMITTED", **super().engine_options()}

    def connect_args(self, sync: bool) -> dict[str, Any]:
        """Connect timeout; pymysql also bounds each read and write of its blocking socket.
        Keepalives are set on the socket by `engine_setup`."""
        t = self.timeouts
        args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(t.connect))}
        if sync and t.command is not None:
            args.update(read_timeout=t.command, write_timeout=t.command)
        return args

    def session_settings(self, mariadb: bool) -> dict[str, int]:
        """The server's side of the bounds: a lock wait ends within the command timeout, and
        MariaDB ends a session left idle in a transaction (its client gone) as long after, so
        the rows a vanished or stalled worker had locked are freed. (MySQL has no such setting:
        its `wait_timeout` applies to every idle connection.) And MariaDB's `JSON_ARRAYAGG`,
        which returns the rows of the keys' statements (`_listed`), may be as long as
        `max_allowed_packet` allows instead of `group_concat_max_len`'s 1 MB."""
        settings = {"group_concat_max_len": GROUP_CONCAT_MAX}
        command = self.timeouts.command
        if command is None:
            return settings
        seconds = max(1, math.ceil(command))
        settings["innodb_lock_wait_timeout"] = seconds
        if mariadb:
            settings["idle_transaction_timeout"] = seconds
        return settings

    def engine_setup(self, engine: Engine) -> None:
        super().engine_setup(engine)

        @event.listens_for(engine, "connect")
        def _session(dbapi_connection: Any, _record: Any) -> None:
            raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)
            mariadb = "mariadb" in str(getattr(raw, "server_version", "")).lower()
            settings = self.session_settings(mariadb)
            if settings:
                cursor = dbapi_connection.cursor()
                assignments = ", ".join(f"SESSION {k} = {v:d}" for k, v in settings.items())
                cursor.execute(f"SET {assignments}")
                cursor.close()


class MariaDBDatabase(MySQLDatabase):
    """A mariadb:// URL: MariaDB's SQL from the start."""

    dialect_class = MariaDBDialect


@functools.lru_cache(maxsize=64)
def _named_claim_sql(ids: int, queues: int) -> str:
    """`NAMED_CLAIM_SQL` for so many ids and queues, every value a `%s` (escaped by the
    caller: aiomysql sends a query's text, values written in)."""
    return NAMED_CLAIM_SQL.format(ids=", ".join(["%s"] * ids), queues=", ".join(["%s"] * queues))


#: Where `NAMED_CLAIM_SQL`'s rows hold their times, in `CLAIMED_COLUMNS` order.
_NAMED_TIMES = tuple(CLAIMED_COLUMNS.index(c) for c in ("run_at", "created_at", "expires_at"))
_NAMED_PAYLOAD = CLAIMED_COLUMNS.index("payload")


class MySQLClaims(SqlClaims):
    """Claims whose rows are read by primary key (`MySQLLanes`); on MariaDB, the tasks a
    wake-up named in one round trip (`NAMED_CLAIM_SQL`)."""

    db: MySQLDatabase
    lanes_class = MySQLLanes

    async def named_claim(self, claim: Claim, ids: list[int]) -> list[TaskRow]:
        """On the kept connection (`MySQLDatabase.kept_take`), bounded by the command
        timeout; the transactional way when there is none to use now, or one of the rows is
        locked."""
        db = self.db
        connection = db.kept_take() or await db.kept_open()
        if connection is None:
            return await super().named_claim(claim, ids)
        watchdog = Watchdog(db.timeouts.command, connection.close)
        ok = False
        try:
            with watchdog.armed():
                rows = await self._named_claim_kept(connection, claim, ids)
            ok = True
        finally:
            db.kept_give(connection, ok)
            if watchdog.fired:
                await db.stale_pool()
        if rows is None:
            return await super().named_claim(claim, ids)
        return rows

    @staticmethod
    async def _named_claim_kept(
        connection: Any, claim: Claim, ids: list[int]
    ) -> list[TaskRow] | None:
        """`NAMED_CLAIM_SQL` on `connection`, through aiomysql's connection itself (its
        cursors cost as much again, on this path): the rows claimed, or None if a row was
        locked (nothing claimed)."""
        escape = connection.escape
        now = escape(claim.now)
        listed = [str(int(i)) for i in ids]
        sql = _named_claim_sql(len(ids), len(claim.queues)) % (
            escape(claim.lease_until),
            escape(claim.worker_id),
            now,
            *listed,
            *[escape(q.encode()) for q in claim.queues],
            now,
            *listed,
        )
        try:
            await connection.query(sql)  # SET
            await connection.next_result()  # UPDATE
        except Exception as exc:
            if lock_wait_timed_out(exc):
                return None
            raise
        await connection.next_result()  # SELECT
        rows = []
        for payload, columns in connection._result.rows or ():
            values = json.loads(columns)
            values.insert(_NAMED_PAYLOAD, payload)
            for i in _NAMED_TIMES:
                if values[i] is not None:
                    values[i] = datetime.fromisoformat(values[i])
            rows.append(TaskRow.from_claim(values, claim.worker_id, claim.lease_until, claim.now))
        return rows


class MySQLDriver(SqlDriver):
    """MySQL 8 and MariaDB (`MySQLDatabase`)."""

    database_class: ClassVar[type[SqlDatabase]] = MySQLDatabase
    claims_class = MySQLClaims


class MariaDBDriver(MySQLDriver):
    """A mariadb:// URL: MariaDB's SQL from the start."""

    database_class = MariaDBDatabase
