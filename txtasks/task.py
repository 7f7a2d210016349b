"""Task declaration: a task's options, its handle, and the row that enqueues one."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from txtasks._checks import check_key, check_number, check_queue_name
from txtasks.clock import Clock, seconds
from txtasks.errors import ConfigurationError
from txtasks.keys import KeyLimits
from txtasks.middleware import Middleware
from txtasks.options import NO_OPTIONS, EnqueueOptions, EnqueueSettings
from txtasks.payload import headers_encode, payload_encode
from txtasks.policy import AckPolicy, RetryPolicy
from txtasks.retry import RetryStrategy, as_strategy
from txtasks.topics import check_group_name, check_topic_name
from txtasks.tracing import headers_with_trace
from txtasks.types import NewTask

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from txtasks.app import App
    from txtasks.enqueue import AsyncExecutor, SyncExecutor

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5

Handler = Callable[..., Any]
#: A task's key from its payload (None: no key); see txtasks.keys.
KeyFunction = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class TaskOptions:
    """How one task runs. Every field has a named default."""

    name: str
    queue: str = DEFAULT_QUEUE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryStrategy | None = None
    ack_policy: AckPolicy = AckPolicy.RETRY
    priority: int = 0
    #: Seconds one attempt may run before it counts as failed; None for no limit.
    timeout: float | None = None
    #: Seconds after the task is first due past which it is dead-lettered; None: no deadline.
    deadline: float | None = None
    #: The key of each task from its payload, unless the enqueue names one; None: no key.
    key: KeyFunction | None = None
    #: Topics whose every publish gives this task's group one task (see txtasks.topics).
    subscribe: tuple[str, ...] = ()
    #: The group it subscribes as; None: the task's name.
    group: str | None = None
    #: Keep each completed attempt's return value (JSON) with the archived task.
    keep_result: bool = False
    #: Middleware around each of its attempts, inside the application's (txtasks.middleware).
    middleware: tuple[Middleware, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 255:
            raise ConfigurationError(f"task name: {self.name!r} must be 1-255 characters")
        check_queue_name(self.queue, setting=f"task {self.name}: queue")
        where = f"task {self.name}"
        check_number(f"{where}: max_attempts", self.max_attempts, minimum=1, integer=True)
        for setting in ("timeout", "deadline"):
            value = getattr(self, setting)
            if value is not None:
                check_number(f"{where}: {setting}", value, above=0)
        check_number(f"{where}: priority", self.priority, maximum=None, integer=True)
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(
                f"{where}: key must be a function of the payload, got {self.key!r}"
            )
        for topic in self.subscribe:
            check_topic_name(topic, setting=f"{where}: subscribe")
        if self.subscribe or self.group is not None:
            check_group_name(
                self.name if self.group is None else self.group,
                setting=f"{where}: group"
                + ("" if self.group else " (the task's name; give group=)"),
            )

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(as_strategy(self.retry), self.ack_policy)


class OptionSettings(TypedDict, total=False):
    """The settings `task_options` turns into a task's options."""

    #: Attempts before a failing task is dead-lettered (default 5).
    max_attempts: int
    #: The wait before each retry: a RetryStrategy, a number of seconds, or a function of the
    #: attempt (default: exponential backoff with full jitter).
    retry: RetryStrategy | Callable[[int], float] | float | None
    #: What an exception does (default: retry).
    ack_policy: AckPolicy | str
    #: Higher runs first (default 0).
    priority: int
    #: Seconds one attempt may run (default: no limit).
    timeout: float | timedelta | None
    #: Seconds after it is first due past which it is dead-lettered (default: none).
    deadline: float | timedelta | None
    #: Each task's key from its payload (default: no key); see txtasks.keys.
    key: KeyFunction | None
    #: A topic, or topics, whose every publish gives the task's group one task (default:
    #: none); see txtasks.topics.
    subscribe: str | Iterable[str]
    #: The group it subscribes as (default: the task's name).
    group: str | None
    #: Keep the return value of its completed attempt, for `App.result` (default: no).
    keep_result: bool
    #: Middleware around each of its attempts, inside the application's (default: none).
    middleware: Iterable[Middleware]


class TaskSettings(OptionSettings, total=False):
    """What `App.task` and `App.register` take, each optional (the defaults are
    `task_options`')."""

    #: The task's name (default: the handler's module.qualname).
    name: str | None
    #: Its queue (default: the App's `default_queue`).
    queue: str | None
    #: The limits of every key of the task's queue; see `App.key_limits`.
    key_limits: KeyLimits | None


def task_options(
    name: str,
    *,
    queue: str = DEFAULT_QUEUE,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    retry: RetryStrategy | Callable[[int], float] | float | None = None,
    ack_policy: AckPolicy | str = AckPolicy.RETRY,
    priority: int = 0,
    timeout: float | timedelta | None = None,
    deadline: float | timedelta | None = None,
    key: KeyFunction | None = None,
    subscribe: str | Iterable[str] = (),
    group: str | None = None,
    keep_result: bool = False,
    middleware: Iterable[Middleware] = (),
) -> TaskOptions:
    """The options of `App.register`'s arguments: strings, callables and timedeltas converted."""
    try:
        policy = AckPolicy(ack_policy)
    except ValueError:
        choices = ", ".join(p.value for p in AckPolicy)
        raise ConfigurationError(
            f"task {name}: ack_policy {ack_policy!r} is not one of {choices}"
        ) from None
    return TaskOptions(
        name=name,
        queue=queue,
        max_attempts=max_attempts,
        retry=as_strategy(retry),
        ack_policy=policy,
        priority=priority,
        timeout=None if timeout is None else seconds(timeout),
        deadline=None if deadline is None else seconds(deadline),
        key=key,
        subscribe=(subscribe,) if isinstance(subscribe, str) else tuple(dict.fromkeys(subscribe)),
        group=group,
        keep_result=bool(keep_result),
        middleware=_middleware_of(name, middleware),
    )


def _middleware_of(name: str, middleware: Iterable[Any]) -> tuple[Middleware, ...]:
    found = tuple(middleware)
    for m in found:
        if not isinstance(m, Middleware):
            raise ConfigurationError(
                f"task {name}: middleware: expected a txtasks.middleware.Middleware, got {m!r}"
            )
    return found


class Task:
    """A registered handler and its options; enqueue it with `enqueue_tx` and friends."""

    def __init__(self, app: App, handler: Handler, options: TaskOptions) -> None:
        self.app = app
        self.handler = handler
        self.options = options
        self.policy = options.retry_policy
        self.is_async = inspect.iscoroutinefunction(handler)
        self.wants_context = _takes_two_arguments(handler)

    @property
    def name(self) -> str:
        return self.options.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly, as a plain function."""
        return self.handler(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.options.queue}>"

    def new(self, payload: Any = None, **options: Unpack[EnqueueSettings]) -> NewTask:
        """A task ready to insert, for `enqueue_many_tx` (bulk)."""
        return self.app.new_task(self, payload, **options)

    def enqueue_tx(
        self, executor: SyncExecutor, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> int:
        """Insert in the caller's Connection/Session transaction; returns the task id."""
        return self.app.enqueue_many_tx(executor, [self.new(payload, **options)])[0]

    async def aenqueue_tx(
        self, executor: AsyncExecutor, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> int:
        """Insert in the caller's AsyncConnection/AsyncSession transaction; returns the id."""
        return (await self.app.aenqueue_many_tx(executor, [self.new(payload, **options)]))[0]

    def enqueue(self, payload: Any = None, **options: Unpack[EnqueueSettings]) -> int:
        """Insert in a transaction of its own (committed on return)."""
        return self.app.enqueue_many([self.new(payload, **options)])[0]

    async def aenqueue(self, payload: Any = None, **options: Unpack[EnqueueSettings]) -> int:
        """Insert in a transaction of its own (committed on return)."""
        return (await self.app.aenqueue_many([self.new(payload, **options)]))[0]


def new_row(
    task: Task,
    payload: Any,
    options: EnqueueOptions,
    *,
    clock: Clock,
    max_payload_bytes: int,
) -> NewTask:
    """Validate and encode one task of `task`; nothing is written. Errors name the bad option."""
    declared = task.options
    now = clock()
    when = now
    if options is not NO_OPTIONS:
        when = options.due("enqueue", now)
    key = options.key
    if key is None and declared.key is not None:
        key = _key_of(declared, payload)
    data, content_type = payload_encode(payload, limit=max_payload_bytes)
    return NewTask(
        queue=declared.queue if options.queue is None else check_queue_name(options.queue),
        task_name=declared.name,
        payload=data,
        content_type=content_type,
        priority=declared.priority if options.priority is None else options.priority,
        run_at=when,
        max_attempts=declared.max_attempts,
        created_at=now,
        dedup_key=options.dedup_key,
        headers=headers_encode(headers_with_trace(options.headers)),
        expires_at=None
        if declared.deadline is None
        else when + timedelta(seconds=declared.deadline),
        partition_key=key,
    )


def _key_of(options: TaskOptions, payload: Any) -> str | None:
    """The key the task's key function gives the payload; its failure names the task."""
    assert options.key is not None
    try:
        key = options.key(payload)
    except Exception as exc:
        raise ConfigurationError(
            f"task {options.name}: its key function failed on this payload: {exc!r}"
        ) from exc
    return None if key is None else check_key(key, setting=f"task {options.name}: key")


def _takes_two_arguments(handler: Handler) -> bool:
    """Handlers take `(payload)` or `(payload, ctx)`."""
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional)
