"""Topics: a publish in the caller's transaction becomes one task per subscribed group.

A group is subscribed to a topic by a row of `txtasks_subscriptions` (topic, group, task name,
queue, priority, attempts): a publish is one INSERT ... SELECT from that table, so every group
subscribed when the publish runs gets exactly one task, an ordinary row of its own queue, and
a publisher needs none of the subscribers' code. This module checks names and builds a publish;
the drivers write it (`SqlDialect.publish_plan`, `MemoryDriver.topic_publish_many`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from txtasks._checks import check_number
from txtasks.clock import Clock, as_utc, seconds
from txtasks.errors import ConfigurationError
from txtasks.keys import check_key
from txtasks.payload import headers_decode, headers_encode, payload_encode
from txtasks.tracing import headers_with_trace
from txtasks.types import (
    GROUP_HEADER,
    MESSAGE_HEADER,
    TOPIC_HEADER,
    TOPIC_NAME_RE,
    NewPublish,
    NewTask,
    Subscription,
    TopicStats,
)

__all__ = [
    "GROUP_MARK",
    "MAX_PUBLISH_DEDUP_BYTES",
    "check_group_name",
    "check_topic_name",
    "delivery_dedup_key",
    "delivery_note",
    "delivery_row",
    "head_of",
    "headers_of_delivery",
    "new_publish",
    "subscriptions_of",
    "topic_stats_of",
]

#: A publish's dedup key, with its group's name (up to 128) and "/", fits the 255-byte column.
MAX_PUBLISH_DEDUP_BYTES = 126
#: What ends the head of a delivery's headers: the group's name comes right after it.
GROUP_MARK = f'"{GROUP_HEADER}":"'
_RESERVED = frozenset({TOPIC_HEADER, MESSAGE_HEADER, GROUP_HEADER})


def check_topic_name(topic: object, *, setting: str = "topic") -> str:
    """Topic names: 1-128 of A-Z a-z 0-9 _ . : - (as queue names), such as `order.created`."""
    if not isinstance(topic, str) or not TOPIC_NAME_RE.match(topic):
        raise ConfigurationError(
            f"{setting}: {topic!r} is not a valid topic name (1-128 of A-Z a-z 0-9 _ . : -)"
        )
    return topic


def check_group_name(group: object, *, setting: str = "group") -> str:
    """Group names: 1-128 of A-Z a-z 0-9 _ . : - (a task's name, when it fits)."""
    if not isinstance(group, str) or not TOPIC_NAME_RE.match(group):
        raise ConfigurationError(
            f"{setting}: {group!r} is not a valid group name (1-128 of A-Z a-z 0-9 _ . : -)"
        )
    return group


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


def _headers_parts(topic: str, headers: dict[str, str] | None) -> tuple[str, str]:
    """The head and tail of every delivery's headers: JSON text of the caller's headers (and
    the trace context), the topic, a fresh message id, then the group (added per group)."""
    own = dict(headers or {})
    reserved = sorted(_RESERVED & own.keys())
    if reserved:
        raise ConfigurationError(f"publish: headers {reserved} are set by txtasks")
    own[TOPIC_HEADER] = topic
    own[MESSAGE_HEADER] = uuid.uuid4().hex
    text = headers_encode(headers_with_trace(own))
    assert text is not None and text.endswith("}")
    return f"{text[:-1]},{GROUP_MARK}", '"}'


def new_publish(
    topic: str,
    payload: Any,
    *,
    clock: Clock,
    max_payload_bytes: int,
    key: str | None = None,
    dedup_key: str | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    headers: dict[str, str] | None = None,
) -> NewPublish:
    """Validate and encode one publish; nothing is written. Errors name the bad option."""
    check_topic_name(topic, setting="publish: topic")
    if delay is not None and run_at is not None:
        raise ConfigurationError("publish: give delay or run_at, not both")
    now = clock()
    when = now
    if delay is not None:
        when = now + timedelta(seconds=check_number("publish: delay", seconds(delay), minimum=0))
    elif run_at is not None:
        when = as_utc(run_at)
    if dedup_key is not None and not (
        isinstance(dedup_key, str)
        and 0 < len(dedup_key.encode("utf-8", "surrogatepass")) <= MAX_PUBLISH_DEDUP_BYTES
        and "\x00" not in dedup_key
    ):
        raise ConfigurationError(
            f"publish: dedup_key must be 1-{MAX_PUBLISH_DEDUP_BYTES} bytes of UTF-8 without NUL "
            f"(each group's delivery adds its group's name), got {dedup_key!r}"
        )
    if priority is not None:
        check_number("publish: priority", priority, maximum=None, integer=True)
    if key is not None:
        check_key(key, setting="publish: key")
    data, content_type = payload_encode(payload, limit=max_payload_bytes)
    head, tail = _headers_parts(topic, headers)
    return NewPublish(
        topic=topic,
        payload=data,
        content_type=content_type,
        run_at=when,
        created_at=now,
        headers_head=head,
        headers_tail=tail,
        dedup_key=dedup_key,
        partition_key=key,
        priority=priority,
    )


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
