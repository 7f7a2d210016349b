"""The commit of a staged write to a topic: its rows fanned out to every subscribed group.

A write made with a topic instead of a task name (`TopicTarget`) is staged like any other; its
commit reads the topic's subscriptions under a shared lock (they cannot change or go away until
the commit ends, so every statement below sees the same groups: those subscribed at the commit),
then copies the staged rows into the hot table with one INSERT ... SELECT joining them to
`txtasks_subscriptions`, whatever the number of groups: one task per row and group, of the
group's task name, queue and attempts, as `publish_tx` writes them. A dedup key is per group
(`<group>/<key>`), a task key leaves one hint per key and group queue, and a write whose topic
has no subscriber is dropped: one row of `txtasks_topic_drops` per staged row, as per publish.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    and_,
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

from txtasks.schema.tables import ExactString, key_hints, staged, subscriptions, tasks, topic_drops
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


def first_of_keys(write_key: str) -> Any:
    """The first staged row of each dedup key of a write (a repeated key: its first row)."""
    return (
        select(func.min(staged.c.id))
        .where(staged.c.write_key == write_key, staged.c.dedup_key.is_not(None))
        .group_by(staged.c.dedup_key)
    )


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


def _dedup_key() -> Any:
    return subscriptions.c.group_name + literal("/", ExactString(1)) + staged.c.dedup_key


def _pairs(target: TopicTarget, groups: Sequence[Group]) -> Any:
    """The staged rows joined to the subscriptions of the groups read (those of the topic)."""
    s = subscriptions.c
    names: Any = bindparam("groups", [g.name for g in groups], expanding=True)
    return staged.join(subscriptions, and_(s.topic == target.topic, s.group_name.in_(names)))


def _deliveries(write_key: str, target: TopicTarget) -> Any:
    """The condition on (staged row, subscription) pairs the commit writes as tasks: every row
    of the write for every group, less (with dedup keys) a row repeating a key of the write,
    or whose `<group>/<key>` a live task holds."""
    mine = staged.c.write_key == write_key
    if not target.dedup:
        return mine
    live = exists().where(tasks.c.dedup_key == _dedup_key())
    first = staged.c.id.in_(first_of_keys(write_key))
    return and_(mine, or_(staged.c.dedup_key.is_(None), and_(first, ~live)))


def _headers(message: str) -> Any:
    """Each delivery's headers, as `publish_tx` writes them (the topic, the publish's id, the
    group): a staged row's id is its publish's, the same in every group's task."""
    topic, id_, group = (f'"{h}":"' for h in (TOPIC_HEADER, MESSAGE_HEADER, GROUP_HEADER))
    return (
        literal(f"{{{topic}", String)
        + subscriptions.c.topic
        + literal(f'",{id_}{message}.', String)
        + cast(staged.c.id, String)
        + literal(f'",{group}', String)
        + subscriptions.c.group_name
        + literal('"}', String)
    )


def stmt_fanout(write_key: str, target: TopicTarget, groups: Sequence[Group]) -> Any:
    """INSERT ... SELECT of a write's staged rows joined to the topic's subscriptions: one
    pending task per row and group, in staging order."""
    s = subscriptions.c
    message = uuid.uuid4().hex[:24]
    rows = select(
        s.queue,
        s.task_name,
        staged.c.payload,
        literal(JSON_CONTENT_TYPE, String),
        literal(TaskState.PENDING.value, String),
        staged.c.priority if target.ranked else s.priority,
        staged.c.run_at,
        literal(0, Integer),
        s.max_attempts,
        staged.c.created_at,
        _dedup_key() if target.dedup else null(),
        _headers(message),
        staged.c.partition_key,
    )
    rows = rows.select_from(_pairs(target, groups)).where(_deliveries(write_key, target))
    publish = insert(tasks).from_select(COLUMNS, rows.order_by(staged.c.id, s.group_name))
    return publish.execution_options(preserve_rowcount=True)


def stmt_fanout_hints(write_key: str, target: TopicTarget, groups: Sequence[Group]) -> Any:
    """INSERT ... SELECT of one key hint per task key and group queue among the deliveries the
    commit writes, due at the key's earliest run_at (run it before `stmt_fanout`)."""
    q = subscriptions.c.queue
    rows = (
        select(q, staged.c.partition_key, func.min(staged.c.run_at))
        .select_from(_pairs(target, groups))
        .where(_deliveries(write_key, target), staged.c.partition_key.is_not(None))
        .group_by(q, staged.c.partition_key)
    )
    return insert(key_hints).from_select(["queue", "partition_key", "run_at"], rows)


def fanout_counts(
    conn: Connection,
    write_key: str,
    target: TopicTarget,
    groups: Sequence[Group],
    rows: int,
) -> Counter[str]:
    """How many tasks the fan-out will write per queue: `rows` per group without dedup keys,
    counted by the database with them (run it before `stmt_fanout`)."""
    if not target.dedup:
        found: Counter[str] = Counter()
        for group in groups:
            found[group.queue] += rows
        return found
    q = subscriptions.c.queue
    query = (
        select(q, func.count())
        .select_from(_pairs(target, groups))
        .where(_deliveries(write_key, target))
        .group_by(q)
    )
    return Counter({queue: int(n) for queue, n in conn.execute(query).all()})


def stmt_drops(write_key: str, topic: str, now: datetime) -> Any:
    """INSERT ... SELECT of one drop of `topic` per staged row of a write (no group)."""
    rows = select(literal(topic, ExactString(128)), literal(now, topic_drops.c.dropped_at.type))
    rows = rows.select_from(staged).where(staged.c.write_key == write_key)
    publish = insert(topic_drops).from_select(["topic", "dropped_at"], rows)
    return publish.execution_options(preserve_rowcount=True)
