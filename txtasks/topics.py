"""Topics: a publish in the caller's transaction becomes one task per subscribed group.

A group is subscribed to a topic by a row of `txtasks_subscriptions` (topic, group, task name,
queue, priority, attempts): a publish is one INSERT ... SELECT from that table, so every group
subscribed when the publish runs gets exactly one task, an ordinary row of its own queue, and
a publisher needs none of the subscribers' code. This module checks names and builds a publish;
the drivers write it (`SqlDialect.topics.publish_plan`, `MemoryTopics.topic_publish_many`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from txtasks._checks import check_name
from txtasks.errors import ConfigurationError
from txtasks.payload import headers_decode
from txtasks.types import (
    GROUP_HEADER,
    TOPIC_HEADER,
    NewPublish,
    NewTask,
    Subscription,
    TopicStats,
)

__all__ = [
    "GROUP_MARK",
    "MAX_PUBLISH_DEDUP_BYTES",
    "check_group_name",
    "check_group_owner",
    "check_topic_name",
    "delivery_dedup_key",
    "delivery_note",
    "delivery_row",
    "head_of",
    "headers_of_delivery",
    "split_headers",
    "subscriptions_of",
    "topic_stats_of",
]

#: A publish's dedup key, with its group's name (up to 128) and "/", fits the 255-byte column.
MAX_PUBLISH_DEDUP_BYTES = 126
#: What ends the head of a delivery's headers: the group's name comes right after it.
GROUP_MARK = f'"{GROUP_HEADER}":"'


def check_topic_name(topic: object, *, setting: str = "topic") -> str:
    """Topic names: 1-128 of A-Z a-z 0-9 _ . : - (as queue names), such as `order.created`."""
    return check_name(topic, kind="topic", setting=setting)


def check_group_name(group: object, *, setting: str = "group") -> str:
    """Group names: 1-128 of A-Z a-z 0-9 _ . : - (a task's name, when it fits)."""
    return check_name(group, kind="group", setting=setting)


def delivery_dedup_key(group: str, dedup_key: str) -> str:
    """The dedup key of a group's delivery of a publish made with `dedup_key`."""
    return f"{group}/{dedup_key}"


def head_of(headers: str | None) -> str | None:
    """The head of a delivery's headers (all but its group and the closing characters): the
    same in every group's delivery of one publish, and only in those."""
    if not headers:
        return None
    at = headers.rfind(GROUP_MARK)
    return None if at < 0 else headers[: at + len(GROUP_MARK)]


def split_headers(text: str | None) -> tuple[str, str]:
    """Head and tail of the headers JSON text of a publish (without its group)."""
    assert text is not None and text.endswith("}")
    return f"{text[:-1]},{GROUP_MARK}", '"}'


def subscriptions_of(app_tasks: Iterable[Any]) -> list[Subscription]:
    """The subscriptions the tasks of an application declare (`@app.task(subscribe=...)`), in
    (topic, group) order."""
    found = [
        Subscription(
            topic=topic,
            group=task.options.group or task.name,
            task_name=task.name,
            queue=task.options.queue,
            priority=task.options.priority,
            max_attempts=task.options.max_attempts,
        )
        for task in app_tasks
        for topic in task.options.subscribe
    ]
    return sorted(found, key=lambda s: (s.topic, s.group))


def check_group_owner(
    subscriptions: Iterable[Subscription], task_name: str, group: str, topics: Iterable[str]
) -> None:
    """One group of a topic is one task: task `task_name` subscribing to `topics` as `group`
    when another task of `subscriptions` is that group of one of them is an error."""
    wanted = set(topics)
    for sub in subscriptions:
        if sub.group == group and sub.topic in wanted and sub.task_name != task_name:
            raise ConfigurationError(
                f"task {task_name}: group {group!r} of topic {sub.topic!r} is already "
                f"task {sub.task_name}'s; give one of them another group="
            )


def delivery_note(headers: str | None) -> str:
    """For the dead letter of a task whose handler no worker of its queue has: which topic
    and group delivered it, when a publish did ("" otherwise)."""
    if head_of(headers) is None:
        return ""
    try:
        values = headers_decode(headers)
    except ValueError:
        return ""
    topic, group = values.get(TOPIC_HEADER), values.get(GROUP_HEADER)
    return (
        f"; delivered by topic {topic!r} to group {group!r}, whose handler is not deployed on "
        f"this queue's workers (unsubscribe it with `txtasks unsubscribe {topic} {group}`)"
    )


def headers_of_delivery(head: str, group: str, tail: str) -> str:
    """A group's delivery's headers (JSON text), as the publish statement builds them."""
    return f"{head}{group}{tail}"


def delivery_row(publish: NewPublish, sub: Subscription) -> NewTask:
    """The task a publish gives one group (what the publish statement writes for it)."""
    return NewTask(
        queue=sub.queue,
        task_name=sub.task_name,
        payload=publish.payload,
        content_type=publish.content_type,
        priority=sub.priority if publish.priority is None else publish.priority,
        run_at=publish.run_at,
        max_attempts=sub.max_attempts,
        created_at=publish.created_at,
        dedup_key=None
        if publish.dedup_key is None
        else delivery_dedup_key(sub.group, publish.dedup_key),
        headers=headers_of_delivery(publish.headers_head, sub.group, publish.headers_tail),
        partition_key=publish.partition_key,
    )


def topic_stats_of(
    subs: Sequence[Subscription],
    counts: dict[tuple[str, str], dict[str, int]],
    dropped: dict[str, tuple[int, datetime | None]],
) -> list[TopicStats]:
    """Every topic with a subscriber or a drop, by name: its groups with the live tasks of each
    group's task in its queue (by state), and its drops."""
    by_topic: dict[str, list[tuple[Subscription, dict[str, int]]]] = {}
    for s in subs:
        by_topic.setdefault(s.topic, []).append((s, dict(counts.get((s.queue, s.task_name), {}))))
    return [
        TopicStats(topic, tuple(by_topic.get(topic, ())), *dropped.get(topic, (0, None)))
        for topic in sorted(by_topic.keys() | dropped.keys())
    ]
