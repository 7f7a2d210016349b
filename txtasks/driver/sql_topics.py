"""Topics on a SQL database: the `Topics` role of `SqlDriver`. The SQL is the dialect's
(`statements/topics.py`).
"""

from __future__ import annotations

from collections.abc import (
    Sequence,
)
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    func,
    select,
    tuple_,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.database import SqlDatabase
from txtasks.driver.dialect import (
    dialect_for,
)
from txtasks.driver.insert_plan import plan_run_async, plan_run_sync
from txtasks.schema.tables import (
    subscriptions,
    tasks,
    topic_drops,
)
from txtasks.topics import topic_stats_of
from txtasks.types import (
    Delivery,
    NewPublish,
    Subscription,
    TopicStats,
)


def subscribe_params(subs: Sequence[Subscription], now: datetime) -> list[dict[str, Any]]:
    """The parameters of `stmt_subscribe`, in (topic, group) order (a consistent lock order)."""
    return [
        {
            "topic": s.topic, "group_name": s.group, "task_name": s.task_name, "queue": s.queue,
            "priority": s.priority, "max_attempts": s.max_attempts, "now": now,
        }
        for s in sorted(subs, key=lambda s: (s.topic, s.group))
    ]  # fmt: skip


class SqlTopics:
    """Topics on a SQL database: publishes in a transaction of the driver's own,
    subscriptions, and what `txtasks topics` shows."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def topic_publish_many(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        if not publishes:
            return []
        return await self.db.in_transaction(
            lambda conn: plan_run_async(conn, self.db.sql.topics.publish_plan(publishes))
        )

    def topic_publish_many_sync(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        if not publishes:
            return []

        with self.db.sync_engine.begin() as conn:
            return plan_run_sync(conn, dialect_for(conn.dialect).topics.publish_plan(publishes))

    async def subscription_set_many(self, subs: Sequence[Subscription], *, now: datetime) -> None:
        if not subs:
            return

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(self.db.sql.topics.stmt_subscribe(), subscribe_params(subs, now))

        await self.db.in_transaction(work)

    async def subscription_delete_many(self, pairs: Sequence[tuple[str, str]]) -> int:
        if not pairs:
            return 0

        async def work(conn: AsyncConnection) -> int:
            params = {"pairs": sorted(set(pairs))}
            return int((await conn.execute(self.db.sql.topics.stmt_unsubscribe(), params)).rowcount)

        return await self.db.in_transaction(work)

    async def subscription_list(self, topics: Sequence[str] | None = None) -> list[Subscription]:
        stmt = select(subscriptions).order_by(subscriptions.c.topic, subscriptions.c.group_name)
        if topics is not None:
            stmt = stmt.where(subscriptions.c.topic.in_(list(topics)))
        async with self.db.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [Subscription.from_row(r) for r in rows]

    async def topic_stats(self) -> list[TopicStats]:
        subs = await self.subscription_list()
        pairs = sorted({(s.queue, s.task_name) for s in subs})
        counts: dict[tuple[str, str], dict[str, int]] = {}
        drops = select(topic_drops.c.topic, func.count(), func.max(topic_drops.c.dropped_at))
        async with self.db.connect() as conn:
            if pairs:
                live = (
                    select(tasks.c.queue, tasks.c.task_name, tasks.c.state, func.count())
                    .where(tuple_(tasks.c.queue, tasks.c.task_name).in_(pairs))
                    .group_by(tasks.c.queue, tasks.c.task_name, tasks.c.state)
                )
                for queue, name, state, n in (await conn.execute(live)).all():
                    counts.setdefault((queue, name), {})[state] = int(n)
            dropped = (await conn.execute(drops.group_by(topic_drops.c.topic))).all()
        return topic_stats_of(subs, counts, {t: (int(n), at) for t, n, at in dropped})

    async def topic_drops_forget_many(self, *, before: datetime, limit: int) -> int:
        pick = (
            select(topic_drops.c.id)
            .where(topic_drops.c.dropped_at < before)
            .order_by(topic_drops.c.dropped_at)
            .limit(limit)
        )

        async def work(conn: AsyncConnection) -> int:
            ids = list((await conn.execute(pick)).scalars())
            if not ids:
                return 0
            return int(
                (await conn.execute(delete(topic_drops).where(topic_drops.c.id.in_(ids)))).rowcount
            )

        return await self.db.in_transaction(work)
