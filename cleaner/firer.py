"""The periodic sweep: enqueues each fire time of the application's schedules exactly once.

Each schedule has a row in `txtasks_periodic` holding its next fire time. A pass that finds
that time due moves it on with a conditional UPDATE (`WHERE next_fire_at = <what it read>`)
and inserts the fire's tasks in the same transaction. Of several cleaners only one UPDATE
matches; the others change nothing. Every fire time still on time is enqueued, a batch per
transaction, however many came due since the previous pass: on time is at most the schedule's
`misfire_grace` late, and never less than ON_TIME_INTERVALS intervals between passes. Only the
older fire times, missed while no cleaner ran, follow the schedule's catch-up rule (all, latest,
or skip). A changed schedule starts over from the next fire time after now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cleaner.sweep import MAX_BATCHES, Sweep, SweepConfig, SweepResult
from txtasks.enqueue import TaskWrite
from txtasks.periodic import Schedule
from txtasks.types import NewTask, PeriodicRow

#: A fire time at most this many intervals (between passes) late is on time, whatever the
#: schedule's misfire_grace: cleaners passing about every interval, jittered or slowed down,
#: enqueue every fire time, and only longer gaps leave fires to the catch-up rule.
ON_TIME_INTERVALS = 5


@dataclass(frozen=True)
class PeriodicConfig(SweepConfig):
    """Settings of the periodic sweep."""

    #: Seconds between passes: how late a fire may be enqueued.
    interval: float = 1.0


@dataclass(frozen=True)
class PeriodicResult(SweepResult):
    """What a periodic pass did."""

    #: Tasks enqueued for fire times.
    fired: int = 0
    #: Schedules stored for the first time, or restarted because they changed.
    registered: int = 0
    #: Schedules another cleaner moved on first (nothing written here).
    lost: int = 0


class Periodic(Sweep[PeriodicConfig, PeriodicResult]):
    """Fires the application's periodic schedules."""

    name = "periodic"

    async def run_once(self) -> PeriodicResult:
        schedules = self.app.schedules
        if not schedules:
            return PeriodicResult()
        stored = await self.driver.sweeps.periodic_list()
        fired = registered = lost = 0
        for schedule in schedules.values():
            row = stored.get(schedule.name)
            now = self.app.clock()
            if row is None or row.schedule != schedule.spec:
                done = await self._register(schedule, row, now)
                registered += done
                lost += not done
                continue
            ids = await self._fire(schedule, row, now)
            if ids is None:
                lost += 1
            else:
                fired += len(ids)
        return PeriodicResult(fired=fired, registered=registered, lost=lost)

    async def _register(self, schedule: Schedule, row: PeriodicRow | None, now: datetime) -> bool:
        ids = await self.driver.sweeps.periodic_advance(
            schedule.name,
            schedule=schedule.spec,
            expected=None if row is None else row.next_fire_at,
            next_fire_at=schedule.next_after(now),
            fires=[],
            now=now,
        )
        return ids is not None

    async def _fire(self, schedule: Schedule, row: PeriodicRow, now: datetime) -> list[int] | None:
        """Enqueue the due fire times, a batch at a time until none on time is left; the ids
        ([] when none was due), or None when another cleaner moved the schedule first."""
        on_time = ON_TIME_INTERVALS * self.config.interval
        expected, ids = row.next_fire_at, list[int]()
        for _ in range(MAX_BATCHES):
            times, following = schedule.due(expected, now, on_time=on_time)
            if following == expected:
                break
            batch = await self._advance(schedule, expected, following, times, now)
            if batch is None:
                return ids or None
            ids += batch
            if following > now or following < schedule.on_time_from(now, on_time):
                break  # all done, or missed fires the next passes catch up (catch_up="all")
            expected = following
        return ids

    async def _advance(
        self,
        schedule: Schedule,
        expected: datetime,
        following: datetime,
        times: list[datetime],
        now: datetime,
    ) -> list[int] | None:
        """Move the schedule from `expected` to `following` and enqueue `times`, in one
        transaction; their ids, or None when another cleaner moved it first."""
        write = self.app.enqueuer.prepare(TaskWrite(self._task(schedule, t) for t in times))
        ids = await self.driver.sweeps.periodic_advance(
            schedule.name,
            schedule=schedule.spec,
            expected=expected,
            next_fire_at=following,
            fires=write.items,
            now=now,
        )
        if ids:
            self.app.enqueuer.committed(write, ids)
        return ids

    def _task(self, schedule: Schedule, fire_time: datetime) -> NewTask:
        return self.app.new_task(
            schedule.task_name,
            schedule.payload,
            run_at=fire_time,
            queue=schedule.queue,
            priority=schedule.priority,
            headers={
                "txtasks-periodic": schedule.name,
                "txtasks-fire-time": fire_time.isoformat(),
            },
        )
