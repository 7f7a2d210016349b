"""Worker settings and the counts of what a worker did."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from txtasks._checks import check_number, check_queue_name
from txtasks.errors import ConfigurationError
from txtasks.services import Service
from txtasks.types import Outcome, TaskKey

#: How many tasks at once a worker runs when `WorkerConfig.concurrency` is not given: at
#: first, and always when some of its handlers are sync (they run in threads).
CONCURRENCY_START = 10
#: The most tasks at once a worker whose `concurrency` is not given, and whose handlers are
#: all async, grows to while its claims find a backlog (`txtasks.worker.worker.Slots`).
CONCURRENCY_AUTO_MAX = 200


@dataclass(frozen=True)
class WorkerConfig:
    """Worker settings; every one has a named default and is checked at start."""

    #: Queues to take tasks from; None means every queue a registered task uses.
    queues: tuple[str, ...] | None = None
    #: Tasks run at once by this worker (async handlers as tasks, sync ones in threads). None
    #: (the default): `CONCURRENCY_START`, and for a worker whose handlers are all async up to
    #: `CONCURRENCY_AUTO_MAX` while a backlog lasts (see `txtasks.worker.worker.Slots`).
    concurrency: int | None = None
    #: Seconds a claim holds a task before the cleaner may rescue it.
    lease: float = 30.0
    #: Seconds between lease extensions; default a third of the lease.
    heartbeat: float | None = None
    #: Seconds between polls when idle (jittered by +-10%).
    poll_interval: float = 1.0
    #: Seconds outcomes may wait in the buffer to be written together.
    flush_interval: float = 0.005
    #: Most outcomes written in one statement.
    flush_batch: int = 500
    #: Seconds in-flight tasks get to finish after a stop request.
    shutdown_grace: float = 30.0
    #: Keep completed tasks in the archive table (False: delete them).
    archive_completed: bool = True
    #: Exit when the queues hold no task due within `burst_horizon` seconds.
    burst: bool = False
    burst_horizon: float = 10.0
    #: Identifies this worker in the task rows; default host:pid:random.
    worker_id: str | None = None
    #: Serve /livez and /readyz on this port (0: any free port); None: no HTTP endpoint.
    health_port: int | None = None
    #: Address the health endpoint listens on.
    health_host: str = "0.0.0.0"
    #: Seconds between two writes of handlers' progress reports (`ctx.progress`): a report is
    #: stored within this, and the worker writes progress at most once per interval, however
    #: many reports its handlers make (the latest of each attempt is kept).
    progress_interval: float = 1.0
    #: Deprecated: `services={"publisher": None}` turns the deferred publisher off.
    publish_deferred: bool | None = None
    #: Seconds a loop (claims, heartbeat, outcome writes) may overrun its interval, stuck in
    #: a database call, before /livez fails.
    stall_after: float = 60.0
    #: The services it hosts (txtasks.services), by name, over those installed packages
    #: contribute for workers (txtasks.spark's "publisher"): a service of its own or a
    #: configured one, or None to turn one off.
    services: Mapping[str, Service | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.publish_deferred is not None:
            self._publish_deferred_fold()
        if self.concurrency is not None:
            check_number("concurrency", self.concurrency, minimum=1, maximum=None, integer=True)
        check_number("flush_batch", self.flush_batch, minimum=1, maximum=None, integer=True)
        for name in ("lease", "poll_interval", "flush_interval", "progress_interval"):
            check_number(name, getattr(self, name), above=0)
        for name in ("shutdown_grace", "burst_horizon"):
            check_number(name, getattr(self, name), minimum=0)
        check_number("stall_after", self.stall_after, above=0)
        if self.health_port is not None:
            check_number("health_port", self.health_port, minimum=0, maximum=65535, integer=True)
        if self.heartbeat is not None:
            check_number("heartbeat", self.heartbeat, above=0)
            if not self.heartbeat < self.lease:
                raise ConfigurationError(
                    f"heartbeat must be shorter than the lease ({self.lease}s), "
                    f"got {self.heartbeat!r}"
                )
        for queue in self.queues or ():
            check_queue_name(queue, setting="queues")
        if self.worker_id is not None and not 0 < len(self.worker_id) <= 128:
            raise ConfigurationError(f"worker_id must be 1-128 characters, got {self.worker_id!r}")

    def _publish_deferred_fold(self) -> None:
        """The deprecated `publish_deferred`, as the `services` entry that replaces it."""
        warnings.warn(
            "WorkerConfig.publish_deferred is deprecated: the deferred publisher is a service; "
            "turn it off with WorkerConfig(services={'publisher': None})",
            DeprecationWarning,
            stacklevel=4,
        )
        if not self.publish_deferred:
            object.__setattr__(self, "services", {"publisher": None, **self.services})
        object.__setattr__(self, "publish_deferred", None)

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3


@dataclass
class WorkerStats:
    """What a worker did; returned by `run()`."""

    claimed: int = 0
    #: The most tasks it allowed itself to run at once (`Slots`: its `concurrency`, or what
    #: an adaptive worker grew to).
    concurrency_peak: int = 0
    #: Of `claimed`, the tasks taken by the ids their wake-ups named (`Worker.wake`).
    claimed_named: int = 0
    started: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    stale: int = 0
    claim_errors: int = 0
    #: Ordinary wake-ups received (each makes the worker claim now).
    wakeups: int = 0
    #: Cancel wake-ups received, and looks for cancels of running tasks (each a database read:
    #: after a heartbeat, or after a cancel wake-up while tasks run).
    cancel_wakeups: int = 0
    cancel_looks: int = 0
    #: Sync handlers that ran past their timeout (their thread kept the slot until it ended).
    overruns: int = 0

    def count(self, outcomes: Sequence[Outcome], stale: Sequence[TaskKey]) -> None:
        counts = self.outcomes
        for outcome in outcomes:
            kind = outcome.kind._value_  # a plain attribute, unlike the `value` property
            counts[kind] = counts.get(kind, 0) + 1
        self.stale += len(stale)
