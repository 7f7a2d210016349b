"""The re-announcer: ready tasks that no worker claimed in time get a fresh wake-up.

A wake-up is a hint sent after commit; when it is lost (broker down, publisher buffer full,
a task that became due later) workers still find the task by polling. The re-announcer makes
that delay short even when workers poll slowly: every pass it wakes each queue that has tasks
ready for longer than `after` seconds. A paused queue gets no wake-up (no worker may claim from
it); resuming it sends one, and the next pass wakes it again if its tasks are still overlooked.
Without a broker it does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from cleaner.sweep import BatchedConfig, Sweep, SweepResult
from txtasks.app import check_queue_name
from txtasks.errors import ConfigurationError
from txtasks.wakeup import NullNotifier


@dataclass(frozen=True)
class ReannouncerConfig(BatchedConfig):
    """Settings of the re-announcer."""

    #: Seconds between passes.
    interval: float = 5.0
    #: Task ids one wake-up carries at most.
    batch_size: int = 100
    #: Seconds a task may stay ready and unclaimed before its queue is woken again.
    after: float = 5.0
    #: Queues to watch besides those of the application's tasks.
    queues: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.after >= 0:
            raise ConfigurationError(f"ReannouncerConfig.after must be >= 0, got {self.after!r}")
        object.__setattr__(self, "queues", tuple(self.queues))
        for queue in self.queues:
            check_queue_name(queue, setting="ReannouncerConfig.queues")


@dataclass(frozen=True)
class ReannounceResult(SweepResult):
    """What a re-announce pass did."""

    #: Wake-ups sent, one per queue with overlooked tasks.
    wakeups: int = 0
    #: Overlooked task ids carried by those wake-ups.
    tasks: int = 0


class Reannouncer(Sweep[ReannouncerConfig, ReannounceResult]):
    """Wakes queues whose ready tasks were overlooked."""

    name = "reannouncer"

    @property
    def queues(self) -> list[str]:
        return sorted({*self.app.queues, *self.config.queues})

    async def run_once(self) -> ReannounceResult:
        if isinstance(self.app.notifier, NullNotifier):
            return ReannounceResult()  # polling only: workers find the tasks themselves
        due_before = self.app.clock() - timedelta(seconds=self.config.after)
        paused = await self.driver.control.queue_paused_list()
        wakeups = tasks = 0
        for queue in self.queues:
            if queue in paused:
                continue
            ids = await self.driver.sweeps.ready_list(
                queue, due_before=due_before, limit=self.config.batch_size
            )
            if ids:
                self.app.notify(queue, ids)
                wakeups += 1
                tasks += len(ids)
        return ReannounceResult(wakeups=wakeups, tasks=tasks)
