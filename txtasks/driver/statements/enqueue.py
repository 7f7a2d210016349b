"""The insert plan of an enqueue: one statement per batch, dedup keys resolved, key hints left."""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from typing import Any

from sqlalchemy import (
    Executable,
    Result,
    insert,
    select,
)
from sqlalchemy.sql.dml import Insert

from txtasks.driver.insert_plan import Plan, Step, task_values
from txtasks.driver.statements import Statements
from txtasks.driver.statements.key_hints import hints_step
from txtasks.schema.tables import (
    tasks,
)
from txtasks.types import NewTask, TaskState

_PENDING = TaskState.PENDING


DEDUP_RETRIES = 3


class EnqueueStatements(Statements):
    """Inserting new tasks, on any connection (sync or async)."""

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
            cls.sql.upsert(tasks)
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
        if cls.sql.returning_insert and len(todo) == 1:  # one row: no executemany machinery,
            values = {k: v for k, v in task_values(rows[todo[0]]).items() if v is not None}
            result = yield cls.stmt_insert_one(), values  # and no unused NULL parameters
            ids[todo[0]] = result.scalar_one()
            return
        if cls.sql.returning_insert:
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
        if cls.sql.returning_dedup:
            found.update({row[1]: row[0] for row in result.all()})  # type: ignore[misc]
        unresolved = {rows[i].dedup_key for i in todo} - found.keys()
        if unresolved:
            lookup = yield cls.stmt_dedup_lookup(sorted(k for k in unresolved if k)), None
            found.update({row[1]: row[0] for row in lookup.all()})  # type: ignore[misc]
        for i in todo:
            ids[i] = found.get(rows[i].dedup_key or "")
