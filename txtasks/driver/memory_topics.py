"""The in-memory driver's topics: publishes, subscriptions and their statistics (the `Topics`
role)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from txtasks.driver.memory_store import MemoryStore
from txtasks.topics import delivery_row, topic_stats_of
from txtasks.types import Delivery, NewPublish, Subscription, TopicStats


class MemoryTopics:
    """Publishes and subscriptions in the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def topic_publish_many(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        return self.topic_publish_many_sync(publishes)

    def topic_publish_many_sync(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        """Each publish: one task per group subscribed now, all under one lock hold (a
        subscription changes before or after, never during)."""
        with self.store.lock:
            return [self._publish(p) for p in publishes]

    def _publish(self, publish: NewPublish) -> list[Delivery]:
        groups = sorted(
            (s for (topic, _), s in self.store.subscriptions.items() if topic == publish.topic),
            key=lambda s: s.group,
        )
        if not groups:
            self.store.topic_drops.append((publish.topic, publish.created_at))
        live_keys = {r.dedup_key for r in self.store.live.values() if r.dedup_key is not None}
        found = []
        for sub in groups:
            row = delivery_row(publish, sub)
            if row.dedup_key not in live_keys:
                found.append(Delivery(self.store.insert(row), row.queue))
        return found

    async def subscription_set_many(self, subs: Sequence[Subscription], *, now: datetime) -> None:
        with self.store.lock:
            for sub in subs:
                known = self.store.subscriptions.get((sub.topic, sub.group))
                created = now if known is None else known.created_at
                self.store.subscriptions[(sub.topic, sub.group)] = replace(sub, created_at=created)

    async def subscription_delete_many(self, pairs: Sequence[tuple[str, str]]) -> int:
        with self.store.lock:
            return sum(self.store.subscriptions.pop(pair, None) is not None for pair in set(pairs))

    async def subscription_list(self, topics: Sequence[str] | None = None) -> list[Subscription]:
        with self.store.lock:
            found = [
                s for s in self.store.subscriptions.values() if topics is None or s.topic in topics
            ]
        return sorted(found, key=lambda s: (s.topic, s.group))

    async def topic_stats(self) -> list[TopicStats]:
        subs = await self.subscription_list()
        with self.store.lock:
            counts: dict[tuple[str, str], dict[str, int]] = {}
            for row in self.store.live.values():
                by_state = counts.setdefault((row.queue, row.task_name), {})
                by_state[row.state.value] = by_state.get(row.state.value, 0) + 1
            dropped: dict[str, tuple[int, datetime | None]] = {}
            for topic, at in self.store.topic_drops:
                n, last = dropped.get(topic, (0, at))
                dropped[topic] = (n + 1, max(at, last or at))
        return topic_stats_of(subs, counts, dropped)

    async def topic_drops_forget_many(self, *, before: datetime, limit: int) -> int:
        with self.store.lock:
            old = [d for d in self.store.topic_drops if d[1] < before][:limit]
            for drop in old:
                self.store.topic_drops.remove(drop)
            return len(old)
