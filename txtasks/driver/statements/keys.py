"""The statements of tasks with a key (see txtasks.keys): key hints armed into keys, the keys a
claim locks, what their tasks hold (running, heads, due), and keys armed again by outcomes.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    Executable,
    Integer,
    Result,
    Select,
    Table,
    bindparam,
    case,
    delete,
    func,
    select,
    tuple_,
    union_all,
    update,
)

from txtasks.driver.insert_plan import Statement
from txtasks.driver.statements import Statements
from txtasks.driver.statements.control import ControlStatements
from txtasks.driver.statements.key_hints import hints_step
from txtasks.schema.tables import (
    IS_READY,
    PROCESSING,
    Timestamp,
    key_hints,
    key_limits,
    keys,
    tasks,
)
from txtasks.types import READY_STATES


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
    """What the keys a claim holds have (see `SqlLanes.keys_look`), by (queue, key)."""

    #: Tasks processing, of the keys that have some.
    running: dict[tuple[str, str], int] = field(default_factory=dict)
    #: The first live task (id, state, run_at) of each ordered key that has one.
    heads: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: Due ready tasks of the other keys, in claim order.
    due: dict[tuple[str, str], list[int]] = field(default_factory=dict)


def keys_arm_values() -> dict[str, Any]:
    """The values of a key armed by a hint (params: queue, partition_key, ready_at, now)."""
    return {
        "queue": bindparam("queue"),
        "partition_key": bindparam("partition_key"),
        "ready_at": bindparam("ready_at", type_=Timestamp),
        "updated_at": bindparam("now", type_=Timestamp),
    }


#: Keys asking for at most this many due tasks are read by `stmt_keys_due_first`
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


class KeyStatements(Statements):
    """Keys and key hints."""

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
        return cls.keys_armed(cls.sql.upsert(keys).from_select(columns, hinted))

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
        rows = cls.sql.rows((yield cls.stmt_keys_of(), {"pairs": sorted(wanted)}))
        if rows:
            busy = yield cls.stmt_keys_busy(), {"ids": [key_id for key_id, _q, _k in rows]}
            ids = cls.sql.scalars(busy)
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

    @classmethod
    @functools.cache
    def stmt_keys_arm(cls) -> Executable:
        """Create or arm keys (params: queue, partition_key, ready_at, now): a key's `ready_at`
        becomes the earlier of its own and the hint's."""
        return cls.keys_armed(cls.sql.upsert(keys).values(**keys_arm_values()))

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
                keys.c.queue.not_in(ControlStatements.paused_queue_names()),
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

    @staticmethod
    @functools.cache
    def stmt_key_limits_any() -> Executable:
        """A row if any limits are stored (`txtasks_key_limits`)."""
        return select(key_limits.c.partition_key).limit(1)

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

    @staticmethod
    @functools.cache
    def stmt_keys_next_due() -> Executable:
        """When the next ready task of each key of `names` is due."""
        return (
            select(tasks.c.queue, tasks.c.partition_key, func.min(tasks.c.run_at))
            .where(tasks.c.partition_key.in_(bindparam("names", expanding=True)), IS_READY)
            .group_by(tasks.c.queue, tasks.c.partition_key)
        )
