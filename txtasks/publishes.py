"""Building a publish: the one row a middleware sees of it (`publish_row`), the publish as the
middleware left that row (`publish_of_row`), and a publish checked and encoded from what the
application gives (`new_publish`). The names and delivery rows of topics are `txtasks.topics`.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from txtasks.clock import Clock
from txtasks.errors import ConfigurationError
from txtasks.options import EnqueueOptions
from txtasks.payload import headers_decode, headers_encode, payload_encode
from txtasks.topics import GROUP_MARK, MAX_PUBLISH_DEDUP_BYTES, check_topic_name, split_headers
from txtasks.tracing import headers_with_trace
from txtasks.types import GROUP_HEADER, MESSAGE_HEADER, TOPIC_HEADER, NewPublish, NewTask

_RESERVED = frozenset({TOPIC_HEADER, MESSAGE_HEADER, GROUP_HEADER})


def _headers_parts(topic: str, headers: dict[str, str] | None) -> tuple[str, str]:
    """The head and tail of every delivery's headers: JSON text of the caller's headers (and
    the trace context), the topic, a fresh message id, then the group (added per group)."""
    own = dict(headers or {})
    reserved = sorted(_RESERVED & own.keys())
    if reserved:
        raise ConfigurationError(f"publish: headers {reserved} are set by txtasks")
    own[TOPIC_HEADER] = topic
    own[MESSAGE_HEADER] = uuid.uuid4().hex
    return split_headers(headers_encode(headers_with_trace(own)))


def _own_headers(publish: NewPublish) -> str:
    """A publish's headers without its group (JSON text): its head, closed."""
    return publish.headers_head[: -len(GROUP_MARK) - 1] + "}"


def publish_row(publish: NewPublish) -> NewTask:
    """What `Middleware.before_enqueue` is given for a publish: one row that stands for the
    task of every group, `topic` set, `task_name` and `queue` empty and `max_attempts` 0 (each
    group's come from its subscription), `priority` the publish's (0: the subscriptions')."""
    return NewTask(
        queue="",
        task_name="",
        payload=publish.payload,
        content_type=publish.content_type,
        priority=publish.priority or 0,
        run_at=publish.run_at,
        max_attempts=0,
        created_at=publish.created_at,
        dedup_key=publish.dedup_key,
        headers=_own_headers(publish),
        partition_key=publish.partition_key,
        topic=publish.topic,
    )


def publish_of_row(publish: NewPublish, row: NewTask) -> NewPublish:
    """The publish as a middleware left its row (`publish_row`): payload, headers, due time,
    priority, dedup key and key may change; its topic, task and queue may not."""
    if (row.topic, row.task_name, row.queue) != (publish.topic, "", ""):
        raise ConfigurationError(
            f"before_enqueue: the row of a publish to {publish.topic!r} came back with topic "
            f"{row.topic!r}, task {row.task_name!r}, queue {row.queue!r}; a middleware may "
            "change its payload, headers, run_at, priority, dedup_key and key only"
        )
    headers = headers_decode(row.headers)
    kept = headers_decode(_own_headers(publish))
    headers.update({name: kept[name] for name in (TOPIC_HEADER, MESSAGE_HEADER)})
    headers.pop(GROUP_HEADER, None)
    head, tail = split_headers(headers_encode(headers))
    options = EnqueueOptions(
        dedup_key=row.dedup_key, key=row.partition_key, priority=row.priority
    ).checked("before_enqueue: publish", dedup_bytes=MAX_PUBLISH_DEDUP_BYTES)
    changed_priority = row.priority != (publish.priority or 0)
    return dataclasses.replace(
        publish,
        payload=row.payload,
        content_type=row.content_type,
        run_at=row.run_at,
        headers_head=head,
        headers_tail=tail,
        dedup_key=options.dedup_key,
        partition_key=options.key,
        priority=row.priority if changed_priority else publish.priority,
    )


def new_publish(
    topic: str,
    payload: Any,
    options: EnqueueOptions,
    *,
    clock: Clock,
    max_payload_bytes: int,
) -> NewPublish:
    """Validate and encode one publish; nothing is written. Errors name the bad option."""
    check_topic_name(topic, setting="publish: topic")
    if options.queue is not None:
        raise ConfigurationError(
            "publish: queue is not an option of a publish (each group's task goes to the "
            "queue of its subscription)"
        )
    now = clock()
    when = options.due("publish", now, dedup_bytes=MAX_PUBLISH_DEDUP_BYTES)
    data, content_type = payload_encode(payload, limit=max_payload_bytes)
    head, tail = _headers_parts(topic, options.headers)
    return NewPublish(
        topic=topic,
        payload=data,
        content_type=content_type,
        run_at=when,
        created_at=now,
        headers_head=head,
        headers_tail=tail,
        dedup_key=options.dedup_key,
        partition_key=options.key,
        priority=options.priority,
    )
