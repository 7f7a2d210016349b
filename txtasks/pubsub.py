"""Topics of an application (`app.topics`): publishing to a topic, in the caller's transaction
or one of its own, and storing the subscriptions its tasks declare. A publish takes the one
enqueue path (`app.enqueuer`); the names and rows of topics are built in `txtasks.topics`.
See docs/topics.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from txtasks.enqueue import PublishWrite
from txtasks.options import EnqueueOptions
from txtasks.publishes import new_publish
from txtasks.topics import check_group_name, check_topic_name
from txtasks.types import Delivery, NewPublish, Subscription

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from txtasks.driver.base import Driver
    from txtasks.enqueue import AsyncExecutor, Enqueuer, SyncExecutor
    from txtasks.options import EnqueueSettings

__all__ = ["Topics", "TopicsHost"]

log = logging.getLogger("txtasks.topics")


class TopicsHost(Protocol):
    """What topics read of the application, at each call."""

    def clock(self) -> datetime: ...

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def driver(self) -> Driver: ...

    @property
    def enqueuer(self) -> Enqueuer: ...

    @property
    def subscriptions(self) -> list[Subscription]: ...


class Topics:
    """Publishing to topics and storing subscriptions (`app.topics`)."""

    def __init__(self, host: TopicsHost) -> None:
        self._host = host
        #: Topics this process has seen a publish to dropped (logged once each).
        self._dropped: set[str] = set()

    # -- subscriptions ------------------------------------------------------------------------

    async def asubscribe(self, topics: Iterable[str] | None = None) -> list[Subscription]:
        """Store the subscriptions the application's tasks declare (of `topics` only, when
        given): every publish committed from then on reaches their groups. Returns those
        stored."""
        wanted = None if topics is None else {check_topic_name(t) for t in topics}
        subs = [s for s in self._host.subscriptions if wanted is None or s.topic in wanted]
        await self._host.driver.topics.subscription_set_many(subs, now=self._host.clock())
        return subs

    async def aunsubscribe(self, topic: str, group: str) -> bool:
        """Delete the subscription of `group` to `topic` (its tasks already delivered stay);
        False when there was none. A worker that declares it stores it again at its start."""
        pair = (check_topic_name(topic), check_group_name(group))
        return await self._host.driver.topics.subscription_delete_many([pair]) > 0

    # -- publishing ---------------------------------------------------------------------------

    def new_publish(
        self, topic: str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> NewPublish:
        """Validate and encode one publish, for `publish_many_tx` (bulk); nothing is written.
        Errors name the bad option (`queue` is not one: each group has its queue)."""
        return new_publish(
            topic,
            payload,
            EnqueueOptions.of("publish", options),
            clock=self._host.clock,
            max_payload_bytes=self._host.max_payload_bytes,
        )

    def publish_tx(
        self,
        executor: SyncExecutor,
        topic: str,
        payload: Any = None,
        **options: Unpack[EnqueueSettings],
    ) -> list[int]:
        """Publish to `topic` in the caller's Connection/Session transaction: one task per
        group subscribed when it runs, in one statement. Returns their ids (none: no group
        subscribed, and the drop is counted; or every group's live task held the dedup key)."""
        publish = self.new_publish(topic, payload, **options)
        return self.publish_many_tx(executor, [publish])[0]

    async def apublish_tx(
        self,
        executor: AsyncExecutor,
        topic: str,
        payload: Any = None,
        **options: Unpack[EnqueueSettings],
    ) -> list[int]:
        """`publish_tx` in the caller's AsyncConnection/AsyncSession transaction."""
        publish = self.new_publish(topic, payload, **options)
        return (await self.apublish_many_tx(executor, [publish]))[0]

    def publish_many_tx(
        self, executor: SyncExecutor, publishes: Iterable[NewPublish]
    ) -> list[list[int]]:
        """Bulk publish in the caller's sync transaction: one statement per batch of up to 256
        publishes whatever the number of groups. Each publish's task ids."""
        write = PublishWrite(publishes)
        return self._delivered(write.items, self._host.enqueuer.run_sync(write, executor))

    async def apublish_many_tx(
        self, executor: AsyncExecutor, publishes: Iterable[NewPublish]
    ) -> list[list[int]]:
        """Bulk publish in the caller's async transaction."""
        write = PublishWrite(publishes)
        return self._delivered(write.items, await self._host.enqueuer.run(write, executor))

    def publish(
        self, topic: str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> list[int]:
        """Publish in a transaction of its own (committed on return)."""
        return self.publish_many([self.new_publish(topic, payload, **options)])[0]

    async def apublish(
        self, topic: str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> list[int]:
        """Publish in a transaction of its own (committed on return)."""
        return (await self.apublish_many([self.new_publish(topic, payload, **options)]))[0]

    def publish_many(self, publishes: Iterable[NewPublish]) -> list[list[int]]:
        """Bulk publish in a transaction of its own (committed on return)."""
        write = PublishWrite(publishes)
        return self._delivered(write.items, self._host.enqueuer.run_sync(write))

    async def apublish_many(self, publishes: Iterable[NewPublish]) -> list[list[int]]:
        """Bulk publish in a transaction of its own (committed on return)."""
        write = PublishWrite(publishes)
        return self._delivered(write.items, await self._host.enqueuer.run(write))

    def _delivered(
        self, publishes: list[NewPublish], found: list[list[Delivery]]
    ) -> list[list[int]]:
        """Each publish's task ids; a publish without a dedup key that wrote none found no
        subscriber (recorded as dropped): logged once per topic."""
        for publish, delivered in zip(publishes, found, strict=True):
            dropped = not delivered and publish.dedup_key is None
            if dropped and publish.topic not in self._dropped:
                self._dropped.add(publish.topic)
                log.warning(
                    "topic %s has no subscriber: its publishes are dropped and counted "
                    "(txtasks topics)",
                    publish.topic,
                )
        return [[d.id for d in delivered] for delivered in found]
