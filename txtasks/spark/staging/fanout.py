"""The commit of a staged write to a topic: its rows fanned out to every subscribed group.

A write made with a topic instead of a task name (`TopicTarget`) is staged like any other; its
commit reads the topic's subscriptions under a shared lock (they cannot change or go away until
the commit ends, so every statement below sees the same groups: those subscribed at the commit),
then copies the staged rows into the hot table with one INSERT ... SELECT per queue of those
groups (whatever the number of groups in it) joining them to `txtasks_subscriptions`: one task
per row and group, of the group's task name, queue and attempts, as `publish_tx` writes them;
each statement's row count is its queue's count of new tasks. A dedup key is per group
(`<group>/<key>`), a task key leaves one hint per key and group queue, and a write whose topic
has no subscriber is dropped: one row of `txtasks_topic_drops` per staged row, as per publish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.sql import FromClause

from txtasks.driver.statements.key_hints import hints_insert, hints_query
from txtasks.schema.tables import (
    ExactString,
    byte_order,
    staged,
    subscriptions,
    tasks,
    topic_drops,
)
from txtasks.types import GROUP_HEADER, JSON_CONTENT_TYPE, MESSAGE_HEADER, TOPIC_HEADER, TaskState

#: The columns a topic commit writes, in the order its SELECT gives them.
COLUMNS = (
    "queue", "task_name", "payload", "content_type", "state", "priority", "run_at", "attempt",
    "max_attempts", "created_at", "dedup_key", "headers", "partition_key",
)  # fmt: skip


@dataclass(frozen=True)
class TopicTarget:
    """What the commit of a write to a topic adds to its staged rows: each subscribed group's
    task name, queue and attempts."""

    topic: str
    #: Whether rows may carry dedup keys (the commit applies them per group: `<group>/<key>`).
    dedup: bool = False
    #: Whether rows may carry task keys (the commit then leaves a hint per key and queue).
    keyed: bool = False
    #: Whether each row's staged priority is its tasks' (else each subscription's priority).
    ranked: bool = False


@dataclass(frozen=True)
class Group:
    """A group subscribed to the topic when the commit read the subscriptions."""

    name: str
    queue: str


def write_rows(rows_of: Any, dedup: bool, now: datetime) -> FromClause:
    """The staged rows a publish at `now` may write (`rows_of`: a condition on the staged table,
    a write's rows or a batch of them), with the staged table's columns, `run_at` due at `now`
    when the row has none, and `created_at` (`now`): all of them, or with dedup keys the first
    staged row of each key (and every row without one). One scan of the rows, numbered per key
    by a window function: no subquery per row, so the plan stays linear in rows whatever the
    statistics say."""
    at = literal(now, tasks.c.created_at.type)
    columns = [
        *(func.coalesce(c, at).label(c.name) if c.name == "run_at" else c for c in staged.c),
        at.label("created_at"),
    ]
    if not dedup:
        return select(*columns).where(rows_of).subquery("rows")
    order = (staged.c.stage, staged.c.n)
    rank = func.row_number().over(partition_by=staged.c.dedup_key, order_by=order)
    ranked = select(*columns, rank.label("key_rank")).where(rows_of).subquery("ranked")
    firsts = or_(ranked.c.dedup_key.is_(None), ranked.c.key_rank == 1)
    kept = [ranked.c[c.name] for c in columns]
    return select(*kept).where(firsts).subquery("rows")


def publish_order(rows: FromClause, dedup: bool, key: Any, *then: Any) -> list[Any]:
    """The order in which a commit inserts a write's rows (`write_rows`): staging order, or with
    dedup keys, key order (`key`: each task's dedup key, in `byte_order`), as an enqueue and a
    publish insert them. The unique index locks each key as it is inserted, so an application inserting keys
    of the write while the commit runs takes them in the same order: one waits for the other,
    neither holds a key the other waits for (a deadlock, which would fail one of them)."""
    staging = [rows.c.stage, rows.c.n]
    return [byte_order(key), *staging, *then] if dedup else [*staging, *then]


def groups_lock(conn: Connection, topic: str) -> list[Group]:
    """The topic's groups, read under a shared lock held until the commit ends (in group
    order: the order in which `txtasks subscribe` locks them)."""
    s = subscriptions.c
    query = (
        select(s.group_name, s.queue)
        .where(s.topic == topic)
        .order_by(s.group_name)
        .with_for_update(read=True)
    )
    return [Group(name, queue) for name, queue in conn.execute(query).all()]


def by_queue(groups: Sequence[Group]) -> dict[str, list[Group]]:
    """The groups read, per queue (in group order)."""
    found: dict[str, list[Group]] = {}
    for group in groups:
        found.setdefault(group.queue, []).append(group)
    return found


def _dedup_key(rows: FromClause) -> Any:
    return subscriptions.c.group_name + literal("/", ExactString(1)) + rows.c.dedup_key


def _pairs(query: Any, rows: FromClause, target: TopicTarget, groups: Sequence[Group]) -> Any:
    """`query` from the write's rows (`write_rows`) joined to the subscriptions of `groups` (of
    the topic). The topic is in the WHERE clause: in SQLite's INSERT ... SELECT ... ON CONFLICT
    a join's ON needs a WHERE after it."""
    s = subscriptions.c
    names: Any = bindparam("groups", [g.name for g in groups], expanding=True)
    return query.select_from(rows.join(subscriptions, s.group_name.in_(names))).where(
        s.topic == target.topic
    )


def _headers(rows: FromClause, message: str) -> Any:
    """Each delivery's headers, as `publish_tx` writes them (the topic, the publish's id, the
    group): a staged row's key (its attempt's number and its own) is its publish's, the same
    in every group's task."""
    topic, id_, group = (f'"{h}":"' for h in (TOPIC_HEADER, MESSAGE_HEADER, GROUP_HEADER))
    return (
        literal(f"{{{topic}", String)
        + subscriptions.c.topic
        + literal(f'",{id_}{message}.', String)
        + cast(rows.c.stage, String)
        + literal(".", String)
        + cast(rows.c.n, String)
        + literal(f'",{group}', String)
        + subscriptions.c.group_name
        + literal('"}', String)
    )


def fanout_rows(
    rows_of: Any, target: TopicTarget, groups: Sequence[Group], message: str, now: datetime
) -> Any:
    """The SELECT of the staged rows `rows_of` (see `write_rows`: published at `now`) joined to the
    subscriptions of `groups`: one pending task per row and group (with dedup keys, a repeated key
    of the write only once), in `publish_order`, in `COLUMNS` order (insert them skipping
    `<group>/<key>`s a live task holds).
    `message` is the commit's: a task's publish id is it and its staged row's key,
    `<message>.<stage>.<n>`."""
    s = subscriptions.c
    rows = write_rows(rows_of, target.dedup, now)
    query = select(
        s.queue,
        s.task_name,
        rows.c.payload,
        literal(JSON_CONTENT_TYPE, String),
        literal(TaskState.PENDING.value, String),
        rows.c.priority if target.ranked else s.priority,
        rows.c.run_at,
        literal(0, Integer),
        s.max_attempts,
        rows.c.created_at,
        _dedup_key(rows) if target.dedup else null(),
        _headers(rows, message),
        rows.c.partition_key,
    )
    order = publish_order(rows, target.dedup, _dedup_key(rows), s.group_name)
    return _pairs(query, rows, target, groups).order_by(*order)


def stmt_fanout_hints(
    rows_of: Any, target: TopicTarget, groups: Sequence[Group], now: datetime
) -> Any:
    """INSERT ... SELECT of one key hint per task key and group queue among the deliveries the
    commit writes at `now` (less those whose `<group>/<key>` a live task holds), due at the
    key's earliest run_at (run it before the fan-out)."""
    q = subscriptions.c.queue
    rows = write_rows(rows_of, target.dedup, now)
    where: list[Any] = []
    if target.dedup:
        where.append(~exists().where(tasks.c.dedup_key == _dedup_key(rows)))
    query = hints_query(q, rows.c.partition_key, rows.c.run_at, *where)
    return hints_insert(_pairs(query, rows, target, groups))


def stmt_drops(rows_of: Any, topic: str, now: datetime) -> Any:
    """INSERT ... SELECT of one drop of `topic` per staged row of `rows_of` (no group)."""
    rows = select(literal(topic, ExactString(128)), literal(now, topic_drops.c.dropped_at.type))
    rows = rows.select_from(staged).where(rows_of)
    publish = insert(topic_drops).from_select(["topic", "dropped_at"], rows)
    return publish.execution_options(preserve_rowcount=True)
