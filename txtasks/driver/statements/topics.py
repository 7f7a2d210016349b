"""The SQL of topics, shared by every dialect (`SqlDialect` inherits it; see txtasks.topics).

A publish is one INSERT ... SELECT: the publishes of a batch as a derived table of bound values,
joined to `txtasks_subscriptions` on the topic; each joined row is a new task of the group's
task name and queue. Its dedup key, when the publish has one, is `<group>/<key>`, inserted with
the dialect's "on conflict do nothing", so the fan-out never aborts the caller's transaction.
The statement returns each new task's id, queue and headers; the headers' head names the publish
(`txtasks.topics.head_of`), which maps the rows back to their publishes.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from typing import Any, cast

from sqlalchemy import (
    Executable,
    Integer,
    LargeBinary,
    Result,
    String,
    Text,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.sql.dml import Insert

from txtasks.driver.insert_plan import Step
from txtasks.driver.statements import Statements
from txtasks.driver.statements.key_hints import hints_step
from txtasks.schema.tables import ExactString, Timestamp, subscriptions, tasks, topic_drops
from txtasks.topics import delivery_row, head_of
from txtasks.types import Delivery, NewPublish, Subscription, TaskState

#: The most publishes one statement carries, and the most payload bytes (a statement is sent
#: whole: MariaDB's max_allowed_packet).
PUBLISH_CHUNK = 256
PUBLISH_CHUNK_BYTES = 4 * 1024 * 1024
#: The columns a publish writes, in the order its SELECT gives them.
PUBLISH_COLUMNS = (
    "queue", "task_name", "payload", "content_type", "state", "priority", "run_at", "attempt",
    "max_attempts", "created_at", "dedup_key", "headers", "partition_key",
)  # fmt: skip
#: A publish plan returns, for each publish, the tasks it wrote.
PublishPlan = Generator[Step, Result[Any], list[list[Delivery]]]


def publish_chunks(publishes: Sequence[NewPublish]) -> list[tuple[int, int]]:
    """(start, size) of each statement of a batch: sizes are powers of two (so a few
    statements, each built once, serve every batch), within the byte budget."""
    chunks, start = [], 0
    while start < len(publishes):
        size = 1 << (min(len(publishes) - start, PUBLISH_CHUNK).bit_length() - 1)
        while (
            size > 1
            and sum(len(p.payload) for p in publishes[start : start + size]) > PUBLISH_CHUNK_BYTES
        ):
            size //= 2
        chunks.append((start, size))
        start += size
    return chunks


def publish_params(chunk: Sequence[NewPublish]) -> dict[str, Any]:
    """The bound values of `stmt_publish(len(chunk), ...)`."""
    params: dict[str, Any] = {}
    for i, p in enumerate(chunk):
        params.update({
            f"t{i}": p.topic, f"p{i}": p.payload, f"c{i}": p.content_type, f"r{i}": p.run_at,
            f"n{i}": p.created_at, f"d{i}": p.dedup_key, f"h{i}": p.headers_head,
            f"e{i}": p.headers_tail, f"k{i}": p.partition_key, f"o{i}": p.priority,
        })  # fmt: skip
    return params


class TopicStatements(Statements):
    """Statements of topics; a dialect overrides `publish_insert` and `stmt_subscribe` where its
    "insert or not" differs."""

    @staticmethod
    def publish_chunks(publishes: Sequence[NewPublish]) -> list[tuple[int, int]]:
        """(start, size) of each statement of a batch (see `publish_chunks`)."""
        return publish_chunks(publishes)

    @staticmethod
    def publish_params(chunk: Sequence[NewPublish]) -> dict[str, Any]:
        """The bound values of `stmt_publish` for `chunk` (see `publish_params`)."""
        return publish_params(chunk)

    @classmethod
    def publish_insert(cls, source: Any, dedup: bool) -> Insert:
        """INSERT ... `source`; with `dedup`, skipping a group's delivery whose dedup key is
        live (no error)."""
        if not dedup:
            return insert(tasks).from_select(PUBLISH_COLUMNS, source)
        stmt = cls.sql.upsert(tasks).from_select(PUBLISH_COLUMNS, source)
        skip: Insert = stmt.on_conflict_do_nothing(
            index_elements=[tasks.c.dedup_key], index_where=tasks.c.dedup_key.is_not(None)
        )
        return skip

    @classmethod
    @functools.cache
    def stmt_publish(cls, count: int, dedup: bool) -> Executable:
        """Fan `count` publishes out to their topics' groups in one INSERT ... SELECT, returning
        each new task's id, queue and headers (params: see `publish_params`)."""
        rows = [
            select(
                bindparam(f"t{i}", type_=ExactString(128)).label("topic"),
                bindparam(f"p{i}", type_=LargeBinary).label("payload"),
                bindparam(f"c{i}", type_=String).label("content_type"),
                bindparam(f"r{i}", type_=Timestamp).label("run_at"),
                bindparam(f"n{i}", type_=Timestamp).label("created_at"),
                bindparam(f"d{i}", type_=ExactString(255)).label("dedup"),
                bindparam(f"h{i}", type_=Text).label("head"),
                bindparam(f"e{i}", type_=Text).label("tail"),
                bindparam(f"k{i}", type_=ExactString(255)).label("partition_key"),
                bindparam(f"o{i}", type_=Integer).label("priority"),
                literal(i, Integer).label("i"),
            )
            for i in range(count)
        ]
        p = (rows[0] if count == 1 else union_all(*rows)).subquery("p")
        s = subscriptions.c
        dedup_key = s.group_name + literal("/", ExactString(1)) + p.c.dedup
        source = select(
            s.queue,
            s.task_name,
            p.c.payload,
            p.c.content_type,
            literal(TaskState.PENDING.value, String),
            func.coalesce(p.c.priority, s.priority),
            p.c.run_at,
            literal(0, Integer),
            s.max_attempts,
            p.c.created_at,
            dedup_key if dedup else null(),
            p.c.head + s.group_name + p.c.tail,
            p.c.partition_key,
        ).where(s.topic == p.c.topic)
        if dedup:  # keys in order: the first publish of a key wins, and transactions inserting
            source = source.order_by(dedup_key, p.c.i)  # the same keys lock them alike
        else:  # ids in publish order: a key's tasks are claimed in the order of their ids
            source = source.order_by(p.c.i, s.group_name)
        return cls.publish_insert(source, dedup).returning(
            tasks.c.id, tasks.c.queue, tasks.c.headers
        )

    @staticmethod
    @functools.cache
    def stmt_drops_add() -> Executable:
        """Record a publish to `topic` at `now` as dropped, unless the topic has a subscriber
        (a publish whose groups all held its dedup key already was not dropped)."""
        subscribed = exists().where(subscriptions.c.topic == bindparam("topic"))
        source = select(
            bindparam("topic", type_=ExactString(128)), bindparam("now", type_=Timestamp)
        ).where(~subscribed)
        return insert(topic_drops).from_select(["topic", "dropped_at"], source)

    @classmethod
    def publish_plan(cls, publishes: Sequence[NewPublish]) -> PublishPlan:
        """Write `publishes` on any connection (sync or async): one statement per chunk of up
        to PUBLISH_CHUNK publishes whatever the number of groups; then the hints of keyed
        deliveries, and the drops. Returns each publish's new deliveries."""
        if not cls.sql.returning_insert:
            return (yield from cls._publish_read_first(publishes))
        found: list[list[Delivery]] = [[] for _ in publishes]
        seen: set[int] = set()
        for start, size in cls.publish_chunks(publishes):
            chunk = publishes[start : start + size]
            dedup = any(p.dedup_key is not None for p in chunk)
            result = yield cls.stmt_publish(size, dedup), cls.publish_params(chunk)
            heads = {p.headers_head: start + i for i, p in enumerate(chunk)}
            returned = cast("list[tuple[int, str, str | None]]", result.all())
            for task_id, queue, headers in returned:
                at = heads.get(head_of(headers) or "")
                if at is not None and task_id not in seen:  # else a live task's dedup key
                    seen.add(task_id)
                    found[at].append(Delivery(task_id, queue))
        yield from cls._publish_after(publishes, found)
        return found

    @classmethod
    def _publish_after(
        cls, publishes: Sequence[NewPublish], found: list[list[Delivery]]
    ) -> Generator[Step, Result[Any], None]:
        """Hints for the keys of keyed deliveries (as a keyed enqueue leaves), and a drop for
        each publish that wrote nothing."""
        hints = hints_step(
            (d.queue, p.partition_key, p.run_at)
            for p, delivered in zip(publishes, found, strict=True)
            for d in delivered
        )
        if hints:
            yield hints
        drops = [
            {"topic": p.topic, "now": p.created_at}
            for p, delivered in zip(publishes, found, strict=True)
            if not delivered
        ]
        if drops:
            yield cls.stmt_drops_add(), drops

    @classmethod
    def _publish_read_first(cls, publishes: Sequence[NewPublish]) -> PublishPlan:
        """Without INSERT ... RETURNING (MySQL 8): the topics' subscriptions read and locked
        (shared) until the commit, then their tasks inserted as an enqueue inserts them."""
        topics = sorted({p.topic for p in publishes})
        read = yield cls.stmt_subscriptions_of().with_for_update(read=True), {"topics": topics}
        groups: dict[str, list[Subscription]] = {}
        for mapping in read.mappings().all():
            groups.setdefault(mapping["topic"], []).append(Subscription.from_row(mapping))
        rows, owners = [], []
        for at, p in enumerate(publishes):
            for sub in groups.get(p.topic, []):
                rows.append(delivery_row(p, sub))
                owners.append(at)
        ids = (yield from cls.sql.enqueue.enqueue_plan(rows)) if rows else []
        found: list[list[Delivery]] = [[] for _ in publishes]
        for at, row, task_id in zip(owners, rows, ids, strict=True):
            found[at].append(Delivery(task_id, row.queue))
        drops = [
            {"topic": p.topic, "now": p.created_at} for p in publishes if not groups.get(p.topic)
        ]
        if drops:
            yield cls.stmt_drops_add(), drops
        return found

    @staticmethod
    def subscribe_values() -> dict[str, Any]:
        return {c: bindparam(c) for c in ("topic", "group_name", "task_name", "queue")} | {
            "priority": bindparam("priority", type_=Integer),
            "max_attempts": bindparam("max_attempts", type_=Integer),
            "created_at": bindparam("now", type_=Timestamp),
            "updated_at": bindparam("now", type_=Timestamp),
        }

    @classmethod
    @functools.cache
    def stmt_subscribe(cls) -> Executable:
        """Create or update the subscription of (topic, group_name)."""
        stmt = cls.sql.upsert(subscriptions).values(**cls.subscribe_values())
        change = {c: stmt.excluded[c] for c in ("task_name", "queue", "priority", "max_attempts")}
        subscribe: Executable = stmt.on_conflict_do_update(
            index_elements=[subscriptions.c.topic, subscriptions.c.group_name],
            set_={**change, "updated_at": stmt.excluded.updated_at},
        )
        return subscribe

    @staticmethod
    @functools.cache
    def stmt_unsubscribe() -> Executable:
        """Delete the subscriptions `pairs` (topic, group_name)."""
        pairs = tuple_(subscriptions.c.topic, subscriptions.c.group_name)
        return delete(subscriptions).where(pairs.in_(bindparam("pairs", expanding=True)))

    @staticmethod
    @functools.cache
    def stmt_subscriptions_of() -> Any:
        """The subscriptions of `topics`, by topic and group."""
        return (
            select(subscriptions)
            .where(subscriptions.c.topic.in_(bindparam("topics", expanding=True)))
            .order_by(subscriptions.c.topic, subscriptions.c.group_name)
        )
