"""The key hint rule, in one place: a task with a key that becomes ready leaves a hint.

A claim looks only at keys that are armed (`txtasks_keys`); a write that makes a keyed task
ready (an enqueue, a publish, a re-drive, "run now", a Spark commit) leaves a row in
`txtasks_key_hints` (queue, key, when due) in its own transaction, one per key at its
earliest time, and the next claim of the queue arms those keys (`SqlLanes.hints_take`). An
outcome that frees a key's slot leaves one for the keys a claim held (`keys_wake_plan`).

Two builders, one rule: `hints_step` for rows the caller has in hand, `hints_insert` for rows
a SELECT gives (INSERT ... SELECT, the rows never travel). Both return statements and never
touch a connection. (The PostgreSQL driver's finish statement, `FINISH_SQL` in
txtasks/driver/postgresql.py, mirrors `keys_wake_plan` in one round trip, hints included.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Executable, Insert, Select, func, insert, select

from txtasks.driver.insert_plan import Statement
from txtasks.schema.tables import key_hints

__all__ = ["HINT_COLUMNS", "hints_insert", "hints_of", "hints_query", "hints_step"]

#: A hint's columns, in the order `hints_query` selects them.
HINT_COLUMNS = ("queue", "partition_key", "run_at")


def hints_of(rows: Iterable[tuple[str, str | None, datetime]]) -> list[dict[str, Any]]:
    """One hint per key among `rows` (queue, key, when its task is due), at the earliest time,
    in key order; none for rows without a key."""
    earliest: dict[tuple[str, str], datetime] = {}
    for queue, key, when in rows:
        if key is not None:
            earliest[(queue, key)] = min(when, earliest.get((queue, key), when))
    return [
        {"queue": q, "partition_key": k, "run_at": when}
        for (q, k), when in sorted(earliest.items())
    ]


@functools.cache
def _stmt_add() -> Executable:
    return insert(key_hints)


def hints_step(rows: Iterable[tuple[str, str | None, datetime]]) -> Statement | None:
    """The statement (executemany) that leaves the hints of `rows`; None when no row has a
    key (nothing to send)."""
    hints = hints_of(rows)
    return (_stmt_add(), hints) if hints else None


def hints_query(
    queue: ColumnElement[Any],
    key: ColumnElement[Any],
    run_at: ColumnElement[Any],
    *where: ColumnElement[Any],
    one_queue: bool = False,
) -> Select[Any]:
    """The SELECT of the rule for rows a query gives: one hint per queue and key among those
    with a key (and `where`), at the earliest `run_at`. `one_queue`: `queue` is the same
    value in every row (a literal), so the rows are grouped by key alone. A caller adds its
    FROM clause (and joins) to it."""
    group = (key,) if one_queue else (queue, key)
    return select(queue, key, func.min(run_at)).where(key.is_not(None), *where).group_by(*group)


def hints_insert(query: Select[Any]) -> Insert:
    """INSERT ... SELECT of the hints `query` (a `hints_query`) gives."""
    return insert(key_hints).from_select(list(HINT_COLUMNS), query)
