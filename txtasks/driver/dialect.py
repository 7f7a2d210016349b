"""The SQL of one database: its statements, its insert plan, its error rules, its migration lock.

A `SqlDialect` is picked once per database (`txtasks.driver.dialect_for`) and is all the core
knows of that database's SQL: the driver runs its statements on the connections it owns, and an
enqueue in the caller's transaction runs its insert plan on the caller's connection. Dialect
subclasses (in postgresql.py, mysql.py, sqlite.py) override only what their SQL lacks or does
better; each statement is a small named builder, built once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Generator, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Integer,
    Result,
    String,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.dml import Insert

from txtasks.driver.base import Capabilities
from txtasks.driver.insert_plan import Plan, Step, task_values
from txtasks.errors import ConfigurationError
from txtasks.schema.tables import IS_READY, TASK_COLUMNS, Timestamp, archive, tasks
from txtasks.types import NewTask, TaskKey, TaskRow, TaskState

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

PROCESSING = TaskState.PROCESSING.value
DEDUP_RETRIES = 3

#: Each database's dialect, as (module, class name), by SQLAlchemy's name for it.
DIALECTS: dict[str, tuple[str, str]] = {
    "postgresql": ("txtasks.driver.postgresql", "PostgresDialect"),
    "mysql": ("txtasks.driver.mysql", "MySQLDialect"),
    "mariadb": ("txtasks.driver.mysql", "MariaDBDialect"),
    "sqlite": ("txtasks.driver.sqlite", "SQLiteDialect"),
}


def dialect_for(dialect: Dialect) -> SqlDialect:
    """The SQL of a connection's database (MariaDB told apart from MySQL once connected); one
    object per database, shared by its drivers and by every enqueue in a caller's transaction."""
    name = "mariadb" if getattr(dialect, "is_mariadb", False) else dialect.name
    if name not in DIALECTS:
        raise ConfigurationError(
            f"connection: unsupported database dialect {dialect.name!r}; "
            "txtasks supports postgresql, mysql/mariadb and sqlite"
        )
    return _dialect(name)


@functools.cache
def _dialect(name: str) -> SqlDialect:
    module, cls = DIALECTS[name]
    made: SqlDialect = getattr(importlib.import_module(module), cls)()
    return made


def claim_order(row: TaskRow) -> tuple[int, datetime, int]:
    """The order tasks are handed out in: priority (high first), then due time, then id."""
    return (-row.priority, row.run_at, row.id)


def keys_match() -> Any:
    """WHERE clause fencing a batch of attempts (param `keys`): pairs still processing, held by
    the worker `fence_worker` and with a lease expired before `fence_expired` (each unless that
    parameter is NULL)."""
    pairs = tuple_(tasks.c.id, tasks.c.attempt).in_(bindparam("keys", expanding=True))
    holder = bindparam("fence_worker", type_=String)
    expiry = bindparam("fence_expired", type_=Timestamp)
    return (
        pairs
        & (tasks.c.state == PROCESSING)
        & (holder.is_(None) | (tasks.c.worker_id == holder))
        & (expiry.is_(None) | (tasks.c.lease_expires_at < expiry))
    )


def keys_param(
    keys: Sequence[TaskKey], worker_id: str | None = None, expired_before: datetime | None = None
) -> dict[str, Any]:
    """The parameters of `keys_match`: keys in id order (a consistent lock order)."""
    return {
        "keys": sorted((k.id, k.attempt) for k in keys),
        "fence_worker": worker_id,
        "fence_expired": expired_before,
    }


class SqlDialect:
    """The SQL every dialect shares; a subclass per database overrides what differs."""

    capabilities: ClassVar[Capabilities] = Capabilities("sql")

    @staticmethod
    @contextlib.contextmanager
    def migration_lock(conn: Connection) -> Iterator[None]:
        """What concurrent `migrate` runs queue on, held from before the schema version is
        read until the migrations are committed; each dialect has its own."""
        yield

    #: INSERT ... RETURNING is available (all but MySQL proper).
    returning_insert: ClassVar[bool] = True
    #: The dedup-insert returns the ids of the rows it inserted.
    returning_dedup: ClassVar[bool] = True

    @staticmethod
    def connection_setup(engine: Engine) -> None:
        """What every engine on this database needs, txtasks' own and the application's
        (`txtasks.create_engine`); nothing by default."""

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        """A deadlock or lock timeout that a fresh transaction may not meet again."""
        return False

    # -- enqueue ------------------------------------------------------------------------------

    @classmethod
    def stmt_insert(cls) -> Insert:
        """Insert new tasks, returning their ids in parameter order."""
        return insert(tasks).returning(tasks.c.id, sort_by_parameter_order=True)

    @staticmethod
    @functools.cache
    def stmt_insert_one() -> Insert:
        """Insert one new task, returning its id."""
        return insert(tasks).returning(tasks.c.id)

    @classmethod
    def stmt_insert_dedup(cls) -> Insert:
        """Insert tasks that carry a dedup key, skipping keys already live (no error)."""
        raise NotImplementedError

    @classmethod
    def stmt_dedup_lookup(cls, keys: Sequence[str]) -> Executable:
        """The ids of live tasks holding these dedup keys."""
        return select(tasks.c.id, tasks.c.dedup_key).where(tasks.c.dedup_key.in_(keys))

    @classmethod
    def enqueue_plan(cls, rows: Sequence[NewTask]) -> Plan:
        """Insert `rows` on any connection (sync or async): one statement per batch."""
        ids: list[int | None] = [None] * len(rows)
        plain = [i for i, r in enumerate(rows) if r.dedup_key is None]
        # in key order: two transactions inserting overlapping keys lock them in the same order
        keyed = sorted(
            (i for i, r in enumerate(rows) if r.dedup_key is not None),
            key=lambda i: rows[i].dedup_key or "",
        )
        if plain:
            yield from cls._insert_plain(rows, plain, ids)
        for _ in range(DEDUP_RETRIES):
            missing = [i for i in keyed if ids[i] is None]
            if not missing:
                break
            yield from cls._insert_keyed(rows, missing, ids)
        if any(i is None for i in ids):
            raise RuntimeError("enqueue: a dedup key kept conflicting with finishing tasks")
        return [i for i in ids if i is not None]

    @classmethod
    def _insert_plain(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        if cls.returning_insert and len(todo) == 1:  # one row: no executemany machinery,
            values = {k: v for k, v in task_values(rows[todo[0]]).items() if v is not None}
            result = yield cls.stmt_insert_one(), values  # and no unused NULL parameters
            ids[todo[0]] = result.scalar_one()
            return
        if cls.returning_insert:
            result = yield cls.stmt_insert(), [task_values(rows[i]) for i in todo]
            for i, new_id in zip(todo, result.scalars().all(), strict=True):
                ids[i] = new_id
            return
        for i in todo:  # MySQL has no RETURNING: one statement a row, lastrowid each
            result = yield insert(tasks), task_values(rows[i])
            ids[i] = result.inserted_primary_key[0]  # type: ignore[attr-defined]

    @classmethod
    def _insert_keyed(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        result = yield cls.stmt_insert_dedup(), [task_values(rows[i]) for i in todo]
        found: dict[str, int] = {}
        if cls.returning_dedup:
            found.update({row[1]: row[0] for row in result.all()})  # type: ignore[misc]
        unresolved = {rows[i].dedup_key for i in todo} - found.keys()
        if unresolved:
            lookup = yield cls.stmt_dedup_lookup(sorted(k for k in unresolved if k)), None
            found.update({row[1]: row[0] for row in lookup.all()})  # type: ignore[misc]
        for i in todo:
            ids[i] = found.get(rows[i].dedup_key or "")

    # -- claim --------------------------------------------------------------------------------

    @staticmethod
    @functools.cache
    def stmt_ready() -> Any:
        """Ready task ids of `queues`, in claim order, up to `limit`, locked, skipping locked."""
        return (
            select(tasks.c.id)
            .where(
                tasks.c.queue.in_(bindparam("queues", expanding=True)),
                IS_READY,
                tasks.c.run_at <= bindparam("now", type_=Timestamp),
            )
            .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
            .limit(bindparam("limit", type_=Integer))
            .with_for_update(skip_locked=True)
        )

    @staticmethod
    def claim_values() -> dict[str, Any]:
        """What a claim writes: processing, one more attempt, leased to the worker."""
        return {
            "state": PROCESSING,
            "attempt": tasks.c.attempt + 1,
            "lease_expires_at": bindparam("lease_until", type_=Timestamp),
            "worker_id": bindparam("worker_id"),
            "started_at": bindparam("now", type_=Timestamp),
        }

    @classmethod
    @functools.cache
    def stmt_claim(cls) -> Executable:
        """Claim a batch in one statement: UPDATE ... WHERE id IN (ready) RETURNING *."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(cls.stmt_ready().scalar_subquery()))
            .values(**cls.claim_values())
            .returning(*tasks.c)
        )

    async def claim(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """Claim a batch on `conn`, in its transaction (`params` as `stmt_claim`'s)."""
        result = await conn.execute(self.stmt_claim(), params)
        return [TaskRow.from_row(r) for r in result.mappings().all()]

    # -- outcomes and leases -------------------------------------------------------------------

    @staticmethod
    @functools.cache
    def stmt_lock_keys(skip_locked: bool = False) -> Executable:
        """Lock the rows of still-current attempts, in id order; with `skip_locked`, leaving out
        the rows another transaction holds instead of waiting for them."""
        return (
            select(tasks.c.id, tasks.c.attempt)
            .where(keys_match())
            .order_by(tasks.c.id)
            .with_for_update(skip_locked=skip_locked)
        )

    @staticmethod
    @functools.cache
    def stmt_archive_copy() -> Executable:
        """Copy rows `ids` into the archive with their final `state`, finished at `now`."""
        cols = [c for c in TASK_COLUMNS if c not in ("state", "lease_expires_at")]
        source = select(
            *[tasks.c[c] for c in cols],
            bindparam("state", type_=String).label("state"),
            literal(None, Timestamp).label("lease_expires_at"),
            bindparam("now", type_=Timestamp).label("finished_at"),
        ).where(tasks.c.id.in_(bindparam("ids", expanding=True)))
        target = [*cols, "state", "lease_expires_at", "finished_at"]
        return insert(archive).from_select(target, source)

    @staticmethod
    @functools.cache
    def stmt_delete() -> Executable:
        """Remove rows `ids` from the hot table."""
        return delete(tasks).where(tasks.c.id.in_(bindparam("ids", expanding=True)))

    @staticmethod
    @functools.cache
    def stmt_archive_error() -> Executable:
        """Record each finished attempt's error on its archived row."""
        return (
            update(archive)
            .where(archive.c.id == bindparam("b_id"))
            .values(last_error=bindparam("b_error"))
        )

    @staticmethod
    @functools.cache
    def stmt_retry() -> Executable:
        """Schedule the next attempt of a failed one (fenced)."""
        return (
            update(tasks)
            .where(
                tasks.c.id == bindparam("b_id"),
                tasks.c.attempt == bindparam("b_attempt"),
                tasks.c.state == PROCESSING,
            )
            .values(
                state=TaskState.RETRYABLE.value,
                run_at=bindparam("b_run_at", type_=Timestamp),
                last_error=bindparam("b_error"),
                checkpoint=func.coalesce(bindparam("b_checkpoint"), tasks.c.checkpoint),
                lease_expires_at=None,
                worker_id=None,
            )
        )

    @staticmethod
    @functools.cache
    def stmt_release() -> Executable:
        """Claimed but never started: back to pending, the attempt not counted (fenced)."""
        return (
            update(tasks)
            .where(keys_match())
            .values(
                state=TaskState.PENDING.value,
                attempt=tasks.c.attempt - 1,
                lease_expires_at=None,
                worker_id=None,
            )
        )

    @staticmethod
    @functools.cache
    def stmt_count_keys() -> Executable:
        """How many of the attempts `keys` are still current (a plain read: no lock)."""
        return select(func.count()).select_from(tasks).where(keys_match())

    @staticmethod
    @functools.cache
    def stmt_lease_set() -> Executable:
        """Push the leases of rows `ids` (locked by the caller) to `lease_until`."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)))
            .values(lease_expires_at=bindparam("lease_until", type_=Timestamp))
        )
