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
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Integer,
    Result,
    Select,
    String,
    Table,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.dml import Insert

from txtasks.driver.base import Capabilities
from txtasks.driver.dialect_control import ControlDialect
from txtasks.driver.dialect_topics import TopicsDialect
from txtasks.driver.insert_plan import Plan, Statement, Step, plan_run_async, task_values
from txtasks.driver.key_hints import hints_step
from txtasks.errors import ConfigurationError
from txtasks.keys import HINTS_PER_CLAIM
from txtasks.schema.tables import (
    IS_READY,
    TASK_COLUMNS,
    Timestamp,
    archive,
    key_hints,
    key_limits,
    keys,
    tasks,
)
from txtasks.types import READY_STATES, NewTask, TaskKey, TaskRow, TaskState

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

PROCESSING = TaskState.PROCESSING.value
_PENDING = TaskState.PENDING
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


class HeldKey(NamedTuple):
    """A key a claim of the keys' lane locked."""

    id: int
    queue: str
    partition_key: str
    next_start_at: datetime | None


class KeyHead(NamedTuple):
    """The first live task of an ordered key."""

    id: int
    state: str
    run_at: datetime


@dataclass
class KeysLook:
    """What the keys a claim holds have (see `SqlDialect.keys_look`), by (queue, key)."""

    #: Tasks processing, of the keys that have some.
    running: dict[tuple[str, str], int] = field(default_factory=dict)
    #: The first live task (id, state, run_at) of each ordered key that has one.
    heads: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: Due ready tasks of the other keys, in claim order.
    due: dict[tuple[str, str], list[int]] = field(default_factory=dict)


def keys_param(
    keys: Sequence[TaskKey], worker_id: str | None = None, expired_before: datetime | None = None
) -> dict[str, Any]:
    """The parameters of `keys_match`: keys in id order (a consistent lock order)."""
    return {
        "keys": sorted((k.id, k.attempt) for k in keys),
        "fence_worker": worker_id,
        "fence_expired": expired_before,
    }


def keys_arm_values() -> dict[str, Any]:
    """The values of a key armed by a hint (params: queue, partition_key, ready_at, now)."""
    return {
        "queue": bindparam("queue"),
        "partition_key": bindparam("partition_key"),
        "ready_at": bindparam("ready_at", type_=Timestamp),
        "updated_at": bindparam("now", type_=Timestamp),
    }


#: Keys asking for at most this many due tasks are read by `SqlDialect.stmt_keys_due_first`
#: (a column per task), the others by `stmt_keys_due` (a subquery per key): a key with a slot
#: asks for two (one to start, one to tell whether more are due).
DUE_FIRST = 2


def _key_probe(index: str) -> Select[Any]:
    """The ids of the tasks of a key of `txtasks_keys` (correlated to it), read along `index`
    (forced on MySQL and MariaDB, see `_force_index`); callers add filters, order and limit."""
    same_key = (tasks.c.queue == keys.c.queue) & (tasks.c.partition_key == keys.c.partition_key)
    return _force_index(select(tasks.c.id), index).where(same_key).correlate(keys)


def _force_index(stmt: Select[Any], name: str, table: Table = tasks) -> Select[Any]:
    """`stmt` reading `table` along index `name` on MySQL and MariaDB. Their optimizer picks
    the lease index for a key's probe when the statistics are stale (the state is its first
    column), and then reads every ready task of the queue for each key; and it reads the keys
    of a claim or an outcome, given by their ids or names, with a scan of every key of the
    table, on statistics taken while the table was empty."""
    hint = f"FORCE INDEX ({name})"
    return stmt.with_hint(table, hint, "mysql").with_hint(table, hint, "mariadb")


def _union(parts: Sequence[Any]) -> Executable:
    """UNION ALL of subqueries, each with its own ORDER BY and LIMIT (which every database
    accepts inside a subquery)."""
    selects = [select(*p.c) for p in parts]
    return selects[0] if len(selects) == 1 else union_all(*selects)


class SqlDialect(TopicsDialect, ControlDialect):
    """The SQL every dialect shares; a subclass per database overrides what differs (the SQL of
    topics is in dialect_topics.py, of cancel, pause and inspection in dialect_control.py)."""

    capabilities: ClassVar[Capabilities] = Capabilities("sql")

    @staticmethod
    def upsert(table: Table) -> Any:
        """The dialect's INSERT ... ON CONFLICT (PostgreSQL's and SQLite's share one API), used
        by the dedup insert and the arming of keys; a dialect without it overrides those two."""
        raise NotImplementedError

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
    #: `keys_lock` puts the keys it locks aside (`ready_at` NULL) in the same statement, so
    #: that a claim's settle writes only the keys it looks at again (or whose rate moved).
    keys_lock_clears: ClassVar[bool] = False

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
        dedup: Insert = (
            cls.upsert(tasks)
            .on_conflict_do_nothing(
                index_elements=[tasks.c.dedup_key], index_where=tasks.c.dedup_key.is_not(None)
            )
            .returning(tasks.c.id, tasks.c.dedup_key)
        )
        return dedup

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
        hints = hints_step(
            (r.queue, r.partition_key, r.run_at) for r in rows if r.state is _PENDING
        )
        if hints:
            yield hints
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
        """Ready task ids of `queues` (those not paused), in claim order, up to `limit`,
        locked, skipping locked."""
        return (
            select(tasks.c.id)
            .where(
                tasks.c.queue.in_(bindparam("queues", expanding=True)),
                tasks.c.queue.not_in(ControlDialect.paused_queue_names()),
                tasks.c.partition_key.is_(None),
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

    # -- keys (see txtasks.keys) ------------------------------------------------------------------

    @staticmethod
    @functools.cache
    def stmt_hints_take() -> Executable:
        """The ids of up to `limit` hints of `queues`, oldest first, locked, skipping locked
        ones."""
        return (
            select(key_hints.c.id)
            .where(key_hints.c.queue.in_(bindparam("queues", expanding=True)))
            .order_by(key_hints.c.id)
            .limit(bindparam("limit", type_=Integer))
            .with_for_update(skip_locked=True)
        )

    @staticmethod
    @functools.cache
    def stmt_hints_delete() -> Executable:
        return delete(key_hints).where(key_hints.c.id.in_(bindparam("ids", expanding=True)))

    @classmethod
    @functools.cache
    def stmt_hints_arm(cls) -> Executable:
        """Create or arm the keys of hints `ids` (params ids, now), each for its earliest hint,
        in key order, in the database: the hints never travel to the worker and back."""
        hinted = (
            select(
                key_hints.c.queue,
                key_hints.c.partition_key,
                func.min(key_hints.c.run_at),
                bindparam("now", type_=Timestamp),
            )
            .where(key_hints.c.id.in_(bindparam("ids", expanding=True)))
            .group_by(key_hints.c.queue, key_hints.c.partition_key)
            .order_by(key_hints.c.queue, key_hints.c.partition_key)
        )
        columns = ["queue", "partition_key", "ready_at", "updated_at"]
        return cls.keys_armed(cls.upsert(keys).from_select(columns, hinted))

    @staticmethod
    def rows(result: Result[Any]) -> list[Any]:
        """The rows of one of the statements that read keys or hints (MySQL/MariaDB return
        them as one JSON value: `MySQLDialect.rows`), as tuples."""
        return list(result)

    @staticmethod
    def scalars(result: Result[Any]) -> list[Any]:
        """The values of such a statement of one column."""
        return list(result.scalars())

    async def hints_take(self, conn: AsyncConnection, queues: list[str], now: datetime) -> None:
        """Turn up to HINTS_PER_CLAIM hints of `queues` into armed keys, deleting them: their
        ids read and locked, the keys armed from them and the hints deleted, in the database."""
        params = {"queues": queues, "limit": HINTS_PER_CLAIM}
        ids = self.scalars(await conn.execute(self.stmt_hints_take(), params))
        if not ids:
            return
        await conn.execute(self.stmt_hints_arm(), {"ids": ids, "now": now})
        await conn.execute(self.stmt_hints_delete(), {"ids": ids})

    async def keys_wake(
        self, conn: AsyncConnection, pairs: Sequence[tuple[str, str]], now: datetime
    ) -> None:
        """`keys_wake_plan` on `conn`."""
        await plan_run_async(conn, self.keys_wake_plan(pairs, now))

    @classmethod
    def keys_wake_plan(
        cls, pairs: Sequence[tuple[str, str]], now: datetime
    ) -> Generator[Statement, Result[Any], None]:
        """Arm the keys (queue, key) of attempts that just ended (a slot freed, a head moved
        on or was retried) and that have a ready task left (read after this transaction's
        own changes; a task enqueued later brings its own hint): their rows at once, unless a
        claim holds one; a hint for those, taken by a later claim. An outcome never waits for
        a claim."""
        wanted = set(pairs)
        rows = cls.rows((yield cls.stmt_keys_of(), {"pairs": sorted(wanted)}))
        if rows:
            busy = yield cls.stmt_keys_busy(), {"ids": [key_id for key_id, _q, _k in rows]}
            ids = cls.scalars(busy)
            if ids:
                yield cls.stmt_keys_wake(), {"ids": ids, "now": now}
        locked = {(queue, key) for _id, queue, key in rows}
        hints = hints_step((q, k, now) for q, k in wanted - locked)
        if hints:
            yield hints

    @staticmethod
    @functools.cache
    def stmt_keys_busy() -> Executable:
        """Which of the keys of rows `ids` have a ready task (one probe of the claim index per
        key, from its far end: a busy key's first entries are those of its claimed and
        finished tasks, left there until the database cleans them; read without a lock)."""
        ready = (
            _key_probe("ix_txtasks_tasks_claim")
            .where(IS_READY)
            .order_by(tasks.c.priority, tasks.c.run_at.desc(), tasks.c.id.desc())
            .limit(1)
            .scalar_subquery()
            .is_not(None)
        )
        by_id = select(keys.c.id).where(keys.c.id.in_(bindparam("ids", expanding=True)), ready)
        return _force_index(by_id, "PRIMARY", keys)

    @staticmethod
    @functools.cache
    def stmt_keys_of() -> Executable:
        """The rows of keys `pairs` (queue, key), in id order, locked, skipping those a claim
        holds."""
        pairs = tuple_(keys.c.queue, keys.c.partition_key).in_(bindparam("pairs", expanding=True))
        return _force_index(
            select(keys.c.id, keys.c.queue, keys.c.partition_key)
            .where(pairs)
            .order_by(keys.c.id)
            .with_for_update(skip_locked=True),
            "uq_txtasks_keys",
            keys,
        )

    @classmethod
    @functools.cache
    def stmt_keys_wake(cls) -> Executable:
        """Keys `ids` armed for `now` (or left at an earlier time)."""
        now = bindparam("now", type_=Timestamp)
        return (
            update(keys)
            .where(keys.c.id.in_(bindparam("ids", expanding=True)))
            .values(ready_at=cls.armed_at(keys.c.ready_at, now), updated_at=now)
        )

    async def keys_settle(self, conn: AsyncConnection, params: list[dict[str, Any]]) -> None:
        """Write each key's next look and rate start (params b_id, b_ready_at,
        b_next_start_at, now): one statement per distinct pair of times, which most keys of a
        claim share (an UPDATE per key is a round trip per key where the driver does not batch
        them)."""
        settled: dict[tuple[Any, Any, Any], list[int]] = {}
        for p in params:
            settled.setdefault((p["b_ready_at"], p["b_next_start_at"], p["now"]), []).append(
                p["b_id"]
            )
        for (ready_at, next_start_at, now), ids in settled.items():
            values = {"ready_at": ready_at, "next_start_at": next_start_at, "now": now}
            await conn.execute(self.stmt_keys_settle(), {"ids": sorted(ids), **values})

    @classmethod
    @functools.cache
    def stmt_keys_arm(cls) -> Executable:
        """Create or arm keys (params: queue, partition_key, ready_at, now): a key's `ready_at`
        becomes the earlier of its own and the hint's."""
        return cls.keys_armed(cls.upsert(keys).values(**keys_arm_values()))

    @classmethod
    def keys_armed(cls, stmt: Any) -> Executable:
        """`stmt`, an INSERT ... ON CONFLICT into `txtasks_keys`, arming a key that exists:
        its `ready_at` becomes the earlier of its own and the new row's."""
        arm: Executable = stmt.on_conflict_do_update(
            index_elements=[keys.c.queue, keys.c.partition_key],
            set_={
                "ready_at": cls.armed_at(keys.c.ready_at, stmt.excluded.ready_at),
                "updated_at": stmt.excluded.updated_at,
            },
        )
        return arm

    @staticmethod
    def armed_at(current: Any, hinted: Any) -> Any:
        """The `ready_at` of a key armed by a hint (SQL expressions of both)."""
        return case(
            ((current.is_(None)) | (current > hinted), hinted),
            else_=current,
        )

    @staticmethod
    @functools.cache
    def stmt_keys_ready() -> Select[Any]:
        """Keys of `queues` (those not paused) ready by `now`, longest waiting first, up to
        `limit`: id, queue, partition_key, next_start_at."""
        return (
            select(keys.c.id, keys.c.queue, keys.c.partition_key, keys.c.next_start_at)
            .where(
                keys.c.queue.in_(bindparam("queues", expanding=True)),
                keys.c.queue.not_in(ControlDialect.paused_queue_names()),
                keys.c.ready_at <= bindparam("now", type_=Timestamp),
            )
            .order_by(keys.c.ready_at, keys.c.id)
            .limit(bindparam("limit", type_=Integer))
        )

    @classmethod
    @functools.cache
    def stmt_keys_lock(cls) -> Executable:
        """`stmt_keys_ready`'s keys, locked, skipping those another claim holds."""
        return cls.stmt_keys_ready().with_for_update(skip_locked=True)

    @staticmethod
    @functools.cache
    def stmt_queue_rate_lock() -> Executable:
        """The row of `queue`'s own rate (the key ''), locked, unless another claim holds it."""
        return (
            select(keys.c.id, keys.c.next_start_at)
            .where(keys.c.queue == bindparam("queue"), keys.c.partition_key == "")
            .with_for_update(skip_locked=True)
        )

    @staticmethod
    @functools.cache
    def stmt_keys_settle() -> Executable:
        """When to look at keys `ids` again, and their rates' next start (params ready_at,
        next_start_at, now)."""
        return (
            update(keys)
            .where(keys.c.id.in_(bindparam("ids", expanding=True)))
            .values(
                ready_at=bindparam("ready_at", type_=Timestamp),
                next_start_at=bindparam("next_start_at", type_=Timestamp),
                updated_at=bindparam("now", type_=Timestamp),
            )
        )

    async def keys_lock(
        self, conn: AsyncConnection, params: dict[str, Any]
    ) -> tuple[list[Any], list[Any]]:
        """The keys a claim serves (`keys_held`) and the `txtasks_key_limits` rows stored for
        them."""
        held = await self.keys_held(conn, params)
        if not held or (await conn.execute(self.stmt_key_limits_any())).first() is None:
            return held, []  # no limits stored at all, as usual: no names sent to look for
        return held, await self.key_overrides(conn, sorted({h.partition_key for h in held}))

    @staticmethod
    @functools.cache
    def stmt_key_limits_any() -> Executable:
        """A row if any limits are stored (`txtasks_key_limits`)."""
        return select(key_limits.c.partition_key).limit(1)

    async def keys_held(self, conn: AsyncConnection, params: dict[str, Any]) -> list[Any]:
        """The keys a claim serves, locked, longest waiting first (params as
        `stmt_keys_lock`'s)."""
        return list(await conn.execute(self.stmt_keys_lock(), params))

    async def key_overrides(self, conn: AsyncConnection, names: list[str]) -> list[Any]:
        """The `txtasks_key_limits` rows of keys `names` (mappings)."""
        return list((await conn.execute(self.stmt_key_overrides(), {"names": names})).mappings())

    async def keys_running(
        self, conn: AsyncConnection, pairs: list[tuple[str, str]]
    ) -> list[tuple[str, str, int]]:
        """(queue, key, tasks processing) of the keys `pairs` (queue, key) that have some."""
        names = sorted({k for _q, k in pairs})
        result = await conn.execute(self.stmt_keys_running(), {"names": names})
        return [(q, k, int(n)) for q, k, n in self.rows(result)]

    @staticmethod
    @functools.cache
    def stmt_key_overrides() -> Executable:
        """The limits set at run time for `names` (in these queues or '*')."""
        return select(key_limits).where(
            key_limits.c.partition_key.in_(bindparam("names", expanding=True))
        )

    @staticmethod
    @functools.cache
    def stmt_keys_running() -> Executable:
        """How many tasks of each key of `names` are processing (read along the lease index,
        which holds only what runs)."""
        return (
            select(tasks.c.queue, tasks.c.partition_key, func.count())
            .where(
                tasks.c.state == PROCESSING,
                tasks.c.partition_key.in_(bindparam("names", expanding=True)),
            )
            .group_by(tasks.c.queue, tasks.c.partition_key)
        )

    @staticmethod
    @functools.cache
    def stmt_keys_heads() -> Executable:
        """The first live task (by id) of each key of the rows `ids` of `txtasks_keys`: the
        head of an ordered key. Each key's head is found by one probe of its key's tasks."""
        live = tasks.c.state.in_([PROCESSING, *(s.value for s in READY_STATES)])
        head = (
            _key_probe("ix_txtasks_tasks_keyed")
            .where(live)
            .order_by(tasks.c.id)
            .limit(1)
            .scalar_subquery()
        )
        heads = (
            select(tasks.c.id, tasks.c.queue, tasks.c.partition_key, tasks.c.state, tasks.c.run_at)
            .select_from(keys.join(tasks, tasks.c.id == head))
            .where(keys.c.id.in_(bindparam("ids", expanding=True)))
        )
        return _force_index(heads, "PRIMARY", keys)

    @staticmethod
    @functools.cache
    def stmt_keys_due_first(count: int) -> Executable:
        """Each key of the rows `ids` of `txtasks_keys` (its id) with its first `count` due
        ready tasks (columns d0, d1, ...; NULL past the last; params ids, now), in claim order:
        one probe of the claim index per key and task, in one small statement whatever the
        number of keys."""

        def due(offset: int) -> Any:
            return (
                _key_probe("ix_txtasks_tasks_claim")
                .where(IS_READY, tasks.c.run_at <= bindparam("now", type_=Timestamp))
                .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
                .limit(1)
                .offset(offset)
                .scalar_subquery()
                .label(f"d{offset}")
            )

        by_id = select(keys.c.id, *map(due, range(count))).where(
            keys.c.id.in_(bindparam("ids", expanding=True))
        )
        return _force_index(by_id, "PRIMARY", keys)

    @staticmethod
    @functools.cache
    def stmt_keys_due(count: int) -> Executable:
        """Up to `n{i}` due ready tasks of each of `count` keys (params q_i, k_i, n_i, now), in
        claim order."""
        parts = [
            select(tasks.c.id, tasks.c.queue, tasks.c.partition_key)
            .where(
                tasks.c.queue == bindparam(f"q{i}"),
                tasks.c.partition_key == bindparam(f"k{i}"),
                IS_READY,
                tasks.c.run_at <= bindparam("now", type_=Timestamp),
            )
            .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
            .limit(bindparam(f"n{i}", type_=Integer))
            .subquery()
            for i in range(count)
        ]
        return _union(parts)

    async def keys_look(
        self,
        conn: AsyncConnection,
        *,
        counted: list[tuple[str, str]],
        ordered: list[tuple[str, str]],
        asked: list[tuple[str, str, int]],
        key_ids: Mapping[tuple[str, str], int],
        now: datetime,
    ) -> KeysLook:
        """The running counts of the keys `counted`, the heads of the keys `ordered`, and up to
        n due ready tasks of each (queue, key, n) `asked` (`key_ids`: each key's row): one
        statement each, and one more for keys asking for more than `DUE_FIRST` tasks."""
        look = KeysLook()
        if counted:
            look.running = {(q, k): n for q, k, n in await self.keys_running(conn, counted)}
        if ordered:
            heads = await self.keys_heads(conn, [key_ids[pair] for pair in ordered])
            look.heads = {(r.queue, r.partition_key): r for r in heads}
        few = [(q, k, n) for q, k, n in asked if n <= DUE_FIRST]
        if few:
            count = max(n for _q, _k, n in few)
            wanted = {(q, k): n for q, k, n in few}
            params = {"ids": [key_ids[(q, k)] for q, k, _n in few], "now": now}
            pairs = {key_id: pair for pair, key_id in key_ids.items()}
            due_first = await conn.execute(self.stmt_keys_due_first(count), params)
            for key_id, *first in self.rows(due_first):
                pair = pairs[key_id]
                due = [task_id for task_id in first[: wanted[pair]] if task_id is not None]
                if due:
                    look.due[pair] = due
        many = [(q, k, n) for q, k, n in asked if n > DUE_FIRST]
        if many:
            for task_id, queue, key in await self.keys_due(conn, many, now):
                look.due.setdefault((queue, key), []).append(task_id)
        return look

    async def keys_heads(self, conn: AsyncConnection, ids: list[int]) -> list[Any]:
        """The first live task (id, queue, partition_key, state, run_at) of the keys of rows
        `ids`."""
        return list(await conn.execute(self.stmt_keys_heads(), {"ids": ids}))

    async def keys_due(
        self, conn: AsyncConnection, asked: list[tuple[str, str, int]], now: datetime
    ) -> list[Any]:
        """Up to n due ready tasks (id, queue, partition_key) of each (queue, key, n)."""
        params: dict[str, Any] = {"now": now}
        for i, (queue, key, n) in enumerate(asked):
            params.update({f"q{i}": queue, f"k{i}": key, f"n{i}": n})
        return list(await conn.execute(self.stmt_keys_due(len(asked)), params))

    @staticmethod
    @functools.cache
    def stmt_keys_next_due() -> Executable:
        """When the next ready task of each key of `names` is due."""
        return (
            select(tasks.c.queue, tasks.c.partition_key, func.min(tasks.c.run_at))
            .where(tasks.c.partition_key.in_(bindparam("names", expanding=True)), IS_READY)
            .group_by(tasks.c.queue, tasks.c.partition_key)
        )

    @classmethod
    @functools.cache
    def stmt_claim_rows(cls) -> Executable:
        """Claim the ready rows `ids`: UPDATE ... RETURNING them."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)), IS_READY)
            .values(**cls.claim_values())
            .returning(*tasks.c)
        )

    async def claim_ids(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """Claim the ready rows `ids` (params as `stmt_claim`'s, with `ids`)."""
        result = await conn.execute(self.stmt_claim_rows(), params)
        return [TaskRow.from_row(r) for r in result.mappings().all()]

    # -- outcomes and leases -------------------------------------------------------------------

    @staticmethod
    @functools.cache
    def stmt_lock_keys(skip_locked: bool = False) -> Executable:
        """Lock the rows of still-current attempts, in id order; with `skip_locked`, leaving out
        the rows another transaction holds instead of waiting for them."""
        return (
            select(
                tasks.c.id,
                tasks.c.attempt,
                tasks.c.queue,
                tasks.c.partition_key,
                tasks.c.cancel_requested_at,
            )
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
    def stmt_archive_result() -> Executable:
        """Record each completed attempt's result on its archived row."""
        return (
            update(archive)
            .where(archive.c.id == bindparam("b_id"))
            .values(result=bindparam("b_result"))
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
    def stmt_progress_set() -> Executable:
        """Store each attempt's last progress report (rows locked by the caller)."""
        return (
            update(tasks)
            .where(tasks.c.id == bindparam("b_id"))
            .values(progress=bindparam("b_progress"))
        )

    @staticmethod
    @functools.cache
    def stmt_lease_set() -> Executable:
        """Push the leases of rows `ids` (locked by the caller) to `lease_until`."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)))
            .values(lease_expires_at=bindparam("lease_until", type_=Timestamp))
        )
