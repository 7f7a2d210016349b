"""The application object: the task registry, where tasks are stored, and the enqueue calls."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast, overload

from txtasks._checks import check_number, check_queue_name
from txtasks.clock import Clock, utcnow
from txtasks.controller import Controller
from txtasks.driver import Driver, driver_for_url
from txtasks.driver.pooling import connections_check
from txtasks.driver.timeouts import Timeouts
from txtasks.enqueue import Enqueuer, TaskWrite
from txtasks.env import ENV_BROKER_URL, ENV_DATABASE_URL, code_or_env
from txtasks.errors import (
    ConfigurationError,
    UnknownTaskError,
)
from txtasks.keys import NO_LIMITS, KeyLimits, Rate
from txtasks.middleware import Middleware
from txtasks.options import EnqueueOptions
from txtasks.payload import DEFAULT_MAX_PAYLOAD_BYTES
from txtasks.periodic import CatchUp, Schedule, schedule_from
from txtasks.pubsub import Topics
from txtasks.results import Results
from txtasks.task import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    Handler,
    Task,
    TaskOptions,
    TaskSettings,
    new_row,
    task_options,
)
from txtasks.topics import check_group_owner, subscriptions_of
from txtasks.types import NewTask, Subscription
from txtasks.wakeup import Notifier, notifier_for_url

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from txtasks.enqueue import AsyncExecutor, SyncExecutor
    from txtasks.options import EnqueueSettings
    from txtasks.task import OptionSettings

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_QUEUE",
    "ENV_BROKER_URL",
    "ENV_DATABASE_URL",
    "App",
    "Handler",
    "Task",
    "TaskOptions",
    "check_queue_name",
]


class _Moved:
    """An App method that moved to `app.<home>` (control, results, topics): it still works,
    and says where it went with a DeprecationWarning."""

    def __init__(self, home: str, name: str | None = None) -> None:
        self.home = home
        self.target = name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.target = self.target or name

    def __get__(self, app: Any, owner: type | None = None) -> Any:
        if app is None:
            return self
        warnings.warn(
            f"App.{self.name} is deprecated; use app.{self.home}.{self.target}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(getattr(app, self.home), str(self.target))


class App:
    """Holds the task registry and where tasks are stored.

    `database_url` and `broker_url` beat the TXTASKS_DATABASE_URL and TXTASKS_BROKER_URL
    environment variables (one line logged when both are set and differ); the CLI's flags
    beat both.
    """

    def __init__(
        self,
        name: str = "txtasks",
        *,
        database_url: str | None = None,
        broker_url: str | None = None,
        driver: Driver | None = None,
        notifier: Notifier | None = None,
        default_queue: str = DEFAULT_QUEUE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        clock: Clock = utcnow,
        timeouts: Timeouts | None = None,
        middleware: Iterable[Middleware] = (),
        db_connections: int | None = None,
    ) -> None:
        check_number("max_payload_bytes", max_payload_bytes, minimum=1, maximum=None, integer=True)
        if db_connections is not None:
            connections_check(db_connections)
        self.name = name
        self.database_url = database_url
        self.broker_url = broker_url
        self._notifier = notifier
        self.default_queue = check_queue_name(default_queue, setting="default_queue")
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self._driver = driver
        #: Database timeouts of the driver made from `database_url` (txtasks.driver.timeouts).
        self.timeouts = timeouts
        #: The most connections the driver made from `database_url` holds at once, below
        #: TXTASKS_DB_CONNECTIONS (txtasks.driver.pooling); None: each pool its default size.
        self.db_connections = db_connections
        self._tasks: dict[str, Task] = {}
        self._schedules: dict[str, Schedule] = {}
        self._key_limits: dict[str, KeyLimits] = {}
        self._queue_rates: dict[str, Rate] = {}
        #: Control of tasks and queues: cancel, pause, rates, inspect, list (docs/control.md).
        self.control = Controller(self)
        #: Results of tasks: `app.results.get(task_id)` waits for one to finish.
        self.results = Results(self)
        #: Middleware around every attempt and enqueue, in order (txtasks.middleware).
        self._middleware: tuple[Middleware, ...] = ()
        #: The one path every enqueue and publish takes (txtasks.enqueue).
        self.enqueuer = Enqueuer(self)
        #: Topics: publish, and store the subscriptions tasks declare (docs/topics.md).
        self.topics = Topics(self)
        for m in middleware:
            self.middleware(m)

    # -- registry -----------------------------------------------------------------------------

    @overload
    def task(self, handler: Handler) -> Task: ...

    @overload
    def task(self, **settings: Unpack[TaskSettings]) -> Callable[[Handler], Task]: ...

    def task(
        self, handler: Handler | None = None, **settings: Unpack[TaskSettings]
    ) -> Task | Callable[[Handler], Task]:
        """Register a handler: `@app.task` or `@app.task(queue=..., max_attempts=...)`; the
        settings are `TaskSettings`'."""

        def register(fn: Handler) -> Task:
            return self.register(fn, **settings)

        return register(handler) if handler is not None else register

    def register(self, handler: Handler, **settings: Unpack[TaskSettings]) -> Task:
        """Register a handler under a name (default: module.qualname), with `TaskSettings`.

        `key` is a function of the payload giving each task's key (or None), unless an enqueue
        names one; `key_limits` the limits of every key of the task's queue (see `key_limits`).
        """
        unknown = sorted(set(settings) - TaskSettings.__optional_keys__)
        if unknown:
            known = ", ".join(sorted(TaskSettings.__optional_keys__))
            raise ConfigurationError(f"task: unknown setting(s) {unknown}; known: {known}")
        name, queue = settings.get("name"), settings.get("queue")
        key_limits = settings.get("key_limits")
        task_name = f"{handler.__module__}.{handler.__qualname__}" if name is None else name
        if task_name in self._tasks:
            raise ConfigurationError(f"task {task_name!r} is already registered")
        rest = {k: v for k, v in settings.items() if k not in ("name", "queue", "key_limits")}
        options = task_options(
            task_name, queue=queue or self.default_queue, **cast("OptionSettings", rest)
        )
        if key_limits is not None:
            self.key_limits(options.queue, key_limits)
        elif options.key is not None:
            self._key_limits.setdefault(options.queue, NO_LIMITS)
        check_group_owner(
            self.subscriptions, options.name, options.group or options.name, options.subscribe
        )
        task = Task(self, handler, options)
        self._tasks[task_name] = task
        return task

    def middleware(self, middleware: Middleware) -> Middleware:
        """Add a middleware after those registered before: its hooks run around every
        attempt of every task (outside the tasks' own) and before every enqueue. Returns it."""
        if not isinstance(middleware, Middleware):
            raise ConfigurationError(
                f"middleware: expected a txtasks.middleware.Middleware, got {middleware!r}"
            )
        self._middleware = (*self._middleware, middleware)
        return middleware

    @property
    def middlewares(self) -> tuple[Middleware, ...]:
        """The application's middleware, in order."""
        return self._middleware

    def key_limits(self, queue: str, limits: KeyLimits) -> None:
        """Declare the limits of every key of `queue` (tasks without a key have none):
        concurrency, ordered, rate. Limits set at run time (`txtasks keys set`) override them
        key by key. Declaring different limits for one queue twice is an error."""
        check_queue_name(queue, setting="key_limits: queue")
        if not isinstance(limits, KeyLimits):
            raise ConfigurationError(f"key_limits: expected KeyLimits, got {limits!r}")
        known = self._key_limits.get(queue)
        if known not in (None, NO_LIMITS, limits):
            raise ConfigurationError(
                f"key_limits: queue {queue!r} already has {known}; one queue, one set of limits"
            )
        self._key_limits[queue] = limits

    def queue_rate(self, queue: str, rate: Rate) -> None:
        """Declare a rate for the whole of `queue`: at most `rate.count` starts of its tasks,
        with a key or without, per `rate.per` seconds across every worker (on top of each
        key's own limits). Declaring a different rate for one queue twice is an error."""
        check_queue_name(queue, setting="queue_rate: queue")
        if not isinstance(rate, Rate):
            raise ConfigurationError(f"queue_rate: expected a Rate, got {rate!r}")
        known = self._queue_rates.get(queue)
        if known not in (None, rate):
            raise ConfigurationError(
                f"queue_rate: queue {queue!r} already has {known}; one queue, one rate"
            )
        self._queue_rates[queue] = rate

    @property
    def declared_queue_rates(self) -> Mapping[str, Rate]:
        """The rates declared for whole queues (a read-only view)."""
        return MappingProxyType(self._queue_rates)

    @property
    def declared_key_limits(self) -> Mapping[str, KeyLimits]:
        """The key limits declared per queue (queues whose tasks have a key function included):
        a read-only view (every claim reads it)."""
        return MappingProxyType(self._key_limits)

    @property
    def tasks(self) -> Mapping[str, Task]:
        return dict(self._tasks)

    @property
    def queues(self) -> list[str]:
        """Every queue a registered task or a periodic schedule uses, sorted."""
        scheduled = {s.queue for s in self._schedules.values() if s.queue is not None}
        return sorted({t.options.queue for t in self._tasks.values()} | scheduled)

    def periodic(
        self,
        task: Task | str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        name: str | None = None,
        payload: Any = None,
        timezone: str = "UTC",
        queue: str | None = None,
        priority: int | None = None,
        catch_up: CatchUp | str = CatchUp.LATEST,
        misfire_grace: float = 60.0,
    ) -> Schedule:
        """Enqueue `task` on a cron expression or every `every` seconds (the cleaner fires it).

        `name` (default: the task's name) identifies the schedule across restarts; each fire
        time is enqueued once however many cleaners run.
        """
        definition = self._resolve(task)
        key = definition.name if name is None else name
        if not 0 < len(key.encode("utf-8", "surrogatepass")) <= 255:
            raise ConfigurationError(f"periodic: name must be 1-255 bytes, got {key!r}")
        if key in self._schedules:
            raise ConfigurationError(f"periodic {key!r} is already declared; give it a name=")
        schedule = schedule_from(
            key,
            definition.name,
            cron=cron,
            every=every,
            timezone=timezone,
            payload=payload,
            queue=queue,
            priority=priority,
            catch_up=catch_up,
            misfire_grace=misfire_grace,
        )
        self.new_task(definition, payload, queue=queue, priority=priority)  # fails now, not later
        self._schedules[key] = schedule
        return schedule

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        """Periodic schedules by name."""
        return dict(self._schedules)

    @property
    def subscriptions(self) -> list[Subscription]:
        """The subscriptions its tasks declare (`@app.task(subscribe=...)`), by topic and
        group; `app.topics.asubscribe` stores them, and so does a worker at start for the
        queues it serves."""
        return subscriptions_of(self._tasks.values())

    def get_task(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(f"no task named {name!r} is registered on {self.name}") from None

    def _resolve(self, task: Task | str) -> Task:
        return task if isinstance(task, Task) else self.get_task(task)

    # -- building rows ------------------------------------------------------------------------

    def new_task(
        self, task: Task | str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> NewTask:
        """Validate and encode one task; nothing is written. Errors name the bad option."""
        return new_row(
            self._resolve(task),
            payload,
            EnqueueOptions.of("enqueue", options),
            clock=self.clock,
            max_payload_bytes=self.max_payload_bytes,
        )

    # -- enqueue ------------------------------------------------------------------------------

    def enqueue_tx(
        self,
        executor: SyncExecutor,
        task: Task | str,
        payload: Any = None,
        **options: Unpack[EnqueueSettings],
    ) -> int:
        """Insert one task in the caller's Connection/Session transaction."""
        return self.enqueue_many_tx(executor, [self.new_task(task, payload, **options)])[0]

    async def aenqueue_tx(
        self,
        executor: AsyncExecutor,
        task: Task | str,
        payload: Any = None,
        **options: Unpack[EnqueueSettings],
    ) -> int:
        """Insert one task in the caller's AsyncConnection/AsyncSession transaction."""
        rows = [self.new_task(task, payload, **options)]
        return (await self.aenqueue_many_tx(executor, rows))[0]

    def enqueue_many_tx(self, executor: SyncExecutor, rows: Iterable[NewTask]) -> list[int]:
        """Bulk insert in the caller's sync transaction: one statement per batch.

        With a broker, a wake-up per queue goes out when that transaction commits.
        """
        return self.enqueuer.run_sync(TaskWrite(rows), executor)

    async def aenqueue_many_tx(self, executor: AsyncExecutor, rows: Iterable[NewTask]) -> list[int]:
        """Bulk insert in the caller's async transaction: one statement per batch.

        With a broker, a wake-up per queue goes out when that transaction commits.
        """
        return await self.enqueuer.run(TaskWrite(rows), executor)

    def notify(self, queue: str, ids: Iterable[int] = ()) -> None:
        """Send a wake-up for `queue` now: for callers that commit by other means."""
        self.notifier.notify(check_queue_name(queue), list(ids))

    def enqueue(
        self, task: Task | str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> int:
        """Insert one task in a transaction of its own."""
        return self.enqueue_many([self.new_task(task, payload, **options)])[0]

    async def aenqueue(
        self, task: Task | str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> int:
        """Insert one task in a transaction of its own."""
        return (await self.aenqueue_many([self.new_task(task, payload, **options)]))[0]

    def enqueue_many(self, rows: Iterable[NewTask]) -> list[int]:
        """Insert in a transaction of its own (committed on return)."""
        return self.enqueuer.run_sync(TaskWrite(rows))

    async def aenqueue_many(self, rows: Iterable[NewTask]) -> list[int]:
        """Insert in a transaction of its own (committed on return)."""
        return await self.enqueuer.run(TaskWrite(rows))

    # -- control, results, topics (their own objects; these names forward, deprecated) -------

    cancel = _Moved("control")
    acancel = _Moved("control")
    acancel_many = _Moved("control")
    pause = _Moved("control")
    apause = _Moved("control")
    resume = _Moved("control")
    aresume = _Moved("control")
    aset_queue_rate = _Moved("control")
    aclear_queue_rate = _Moved("control")
    inspect = _Moved("control")
    ainspect = _Moved("control")
    task_list = _Moved("control")
    atasks = _Moved("control", "atask_list")
    result = _Moved("results", "get")
    aresult = _Moved("results", "aget")
    asubscribe = _Moved("topics")
    aunsubscribe = _Moved("topics")
    new_publish = _Moved("topics")
    publish_tx = _Moved("topics")
    apublish_tx = _Moved("topics")
    publish_many_tx = _Moved("topics")
    apublish_many_tx = _Moved("topics")
    publish = _Moved("topics")
    apublish = _Moved("topics")
    publish_many = _Moved("topics")
    apublish_many = _Moved("topics")

    def tasks_finished(self, ids: Iterable[int]) -> None:
        """Wake the `results.aget` calls of this process waiting for tasks `ids` (a worker
        calls it once their outcomes are stored)."""
        self.results.finished(ids)

    # -- storage ------------------------------------------------------------------------------

    def resolve_database_url(self, override: str | None = None) -> str | None:
        """Flag, then the app's own setting, then TXTASKS_DATABASE_URL."""
        return override or code_or_env("database_url", self.database_url, ENV_DATABASE_URL)

    @property
    def driver(self) -> Driver:
        """The driver tasks are stored with, created on first use from the database URL."""
        if self._driver is None:
            url = self.resolve_database_url()
            if not url:
                raise ConfigurationError(
                    f"database_url: not set; pass App(database_url=...), --database-url, "
                    f"or set {ENV_DATABASE_URL}"
                )
            self._driver = self.driver_for(url)
        return self._driver

    def driver_for(self, url: str) -> Driver:
        """A driver for `url` with the app's database settings (timeouts, connections)."""
        return driver_for_url(url, timeouts=self.timeouts, connections=self.db_connections)

    def resolve_broker_url(self, override: str | None = None) -> str | None:
        """Flag, then the app's own setting, then TXTASKS_BROKER_URL; None: polling only."""
        return override or code_or_env("broker_url", self.broker_url, ENV_BROKER_URL)

    @property
    def notifier(self) -> Notifier:
        """Wake-ups: RabbitMQ when a broker URL is set, else none (workers poll)."""
        if self._notifier is None:
            self._notifier = notifier_for_url(self.resolve_broker_url())
        return self._notifier

    def use_notifier(self, notifier: Notifier) -> None:
        """Send and receive wake-ups with this notifier from now on."""
        self._notifier = notifier

    def use_driver(self, driver: Driver) -> None:
        """Store tasks with this driver from now on (the CLI and tests use it)."""
        self._driver = driver

    async def amigrate(self) -> list[int]:
        """Create or upgrade txtasks' tables where this app stores tasks, as `txtasks migrate`
        does; return the schema versions applied (none when up to date, or with a
        `MemoryDriver`). Sync code uses `txtasks.migrate(url)`."""
        return await self.driver.migrate()

    async def aclose(self) -> None:
        """Close the driver's connections and the notifier's."""
        if self._notifier is not None:
            await self._notifier.close()
        if self._driver is not None:
            await self._driver.close()
