"""Periodic schedules: what an application declares with `app.periodic(...)`.

A schedule only computes fire times; the cleaner's periodic sweep enqueues each fire time once,
guarded by a row per schedule in `txtasks_periodic` (see `cleaner/firer.py`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from txtasks._checks import check_number
from txtasks.clock import as_utc, seconds
from txtasks.errors import ConfigurationError

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger

EPOCH = datetime(1970, 1, 1)
#: Fire times enqueued at most per transaction; and per pass, of those missed (catch-up "all").
MAX_FIRES_PER_SWEEP = 100
ONE_MICROSECOND = timedelta(microseconds=1)
LOOKBACK_WINDOWS = tuple(
    timedelta(seconds=s) for s in (1, 60, 3600, 86400, 31 * 86400, 366 * 86400, 3660 * 86400)
)


class CatchUp(str, enum.Enum):
    """What to do with fire times missed while no cleaner ran (the ones no longer on time)."""

    ALL = "all"  # enqueue every missed fire time (at most MAX_FIRES_PER_SWEEP per sweep)
    LATEST = "latest"  # enqueue the latest missed fire time once
    SKIP = "skip"  # enqueue none of them


@dataclass(frozen=True)
class Schedule:
    """When to enqueue a task: a cron expression (in `timezone`) or a fixed interval.

    Interval fire times are multiples of the interval since the Unix epoch, so every cleaner
    computes the same ones. A fire time no more than `misfire_grace` seconds late (or, when
    that is longer, than what the cleaner's passes cover) is on time: it is enqueued, once.
    `catch_up` decides what happens to the older ones, missed while no cleaner ran.
    """

    name: str
    task_name: str
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    catch_up: CatchUp = CatchUp.LATEST
    misfire_grace: float = 60.0
    _trigger: CronTrigger | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"periodic {self.name!r}"
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(f"{where}: give exactly one of cron= or every=")
        if self.every is not None:
            if not (math.isfinite(self.every) and self.every > 0):
                raise ConfigurationError(f"{where}: every must be > 0 seconds, got {self.every!r}")
            object.__setattr__(self, "every", float(self.every))
        check_number(f"{where}: misfire_grace", self.misfire_grace, minimum=0)
        try:
            object.__setattr__(self, "catch_up", CatchUp(self.catch_up))
        except ValueError:
            choices = ", ".join(c.value for c in CatchUp)
            raise ConfigurationError(
                f"{where}: catch_up {self.catch_up!r} is not one of {choices}"
            ) from None
        if self.cron is not None:
            try:
                from apscheduler.triggers.cron import CronTrigger  # on first use: not at import

                trigger = CronTrigger.from_crontab(crontab(self.cron), timezone=self.timezone)
            except Exception as exc:  # ValueError, or an unknown time zone
                raise ConfigurationError(f"{where}: cron {self.cron!r}: {exc}") from None
            object.__setattr__(self, "_trigger", trigger)

    @property
    def spec(self) -> str:
        """The schedule as text; a changed spec restarts the schedule from now."""
        if self.cron is not None:
            return f"cron {self.cron} {self.timezone}"
        return f"every {self.every!r}s"

    def next_after(self, moment: datetime) -> datetime:
        """The first fire time strictly after `moment` (naive UTC in and out)."""
        if self._trigger is None:
            assert self.every is not None
            step = timedelta(seconds=self.every)
            count = math.floor((moment - EPOCH) / step) + 1
            return EPOCH + count * step
        start = (moment + ONE_MICROSECOND).replace(tzinfo=timezone.utc)
        fire = self._trigger.get_next_fire_time(None, start)
        return datetime.max if fire is None else as_utc(fire)

    def on_time_from(self, now: datetime, on_time: float = 0.0) -> datetime:
        """The oldest fire time still on time at `now`: at most `misfire_grace` seconds late,
        or `on_time` seconds (what the cleaner's passes cover) when that is longer."""
        return now - timedelta(seconds=max(self.misfire_grace, on_time))

    def due(
        self, first: datetime, now: datetime, *, on_time: float = 0.0
    ) -> tuple[list[datetime], datetime]:
        """Fire times to enqueue now, given the first not yet enqueued, and the next one after.

        Every fire time that is on time (see `on_time_from`) is enqueued, whatever `catch_up`
        says; the older ones were missed while no cleaner ran, and `catch_up` decides. At most
        MAX_FIRES_PER_SWEEP at a time: the next one after is then still due at `now`. When
        `first` is later than `now`, nothing is due.
        """
        if first > now:
            return [], first
        horizon = self.on_time_from(now, on_time)
        missed: list[datetime] = []
        start = first
        if first < horizon and self.catch_up is not CatchUp.ALL:
            start = self.next_after(horizon - ONE_MICROSECOND)
            if self.catch_up is CatchUp.LATEST:
                missed = [max(first, self._latest_before(horizon - ONE_MICROSECOND))]
        times = missed + self._between(start, now, MAX_FIRES_PER_SWEEP - len(missed))
        return times, self.next_after(times[-1]) if times else start

    def _between(self, start: datetime, now: datetime, limit: int) -> list[datetime]:
        """The fire times from `start` (one of them) to `now`, at most `limit`."""
        times: list[datetime] = []
        while start <= now and len(times) < limit:
            times.append(start)
            start = self.next_after(start)
        return times

    def _latest_before(self, now: datetime) -> datetime:
        """The last fire time at or before `now` (for a schedule far behind)."""
        if self._trigger is None:
            assert self.every is not None
            step = timedelta(seconds=self.every)
            return EPOCH + math.floor((now - EPOCH) / step) * step
        # Widen the window until it holds a fire time; then it holds only a few to walk.
        for window in LOOKBACK_WINDOWS:
            latest = self.next_after(now - window)
            if latest <= now:
                while (later := self.next_after(latest)) <= now:
                    latest = later
                return latest
        return now


def schedule_from(
    name: str,
    task_name: str,
    *,
    cron: str | None,
    every: float | timedelta | None,
    **options: Any,
) -> Schedule:
    """A validated schedule; `every` may be seconds or a timedelta."""
    interval = None if every is None else seconds(every)
    return Schedule(name, task_name, cron=cron, every=interval, **options)


DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def crontab(expression: str) -> str:
    """The expression with crontab(5) day-of-week numbers (0 or 7 = Sunday) as day names.

    APScheduler's own day-of-week numbers start at Monday = 0; names mean the same to both.
    """
    fields = expression.split()
    if len(fields) == 5:
        fields[4] = ",".join(_weekdays(part) for part in fields[4].split(","))
    return " ".join(fields)


def _weekdays(part: str) -> str:
    """One comma-separated element of the day-of-week field, numbers turned into names."""
    span, _, step_text = part.partition("/")
    start_text, dash, end_text = span.partition("-")
    numbers = start_text.isdigit() and (not dash or end_text.isdigit())
    if span == "*" and step_text.isdigit():
        start, end = 0, 6
    elif numbers:
        start = int(start_text)
        end = int(end_text) if dash else (6 if step_text else start)
    else:
        return part  # names, "*", or something the cron parser will reject with its message
    if not (0 <= start <= 7 and 0 <= end <= 7 and start <= end):
        return part
    step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else 1
    return ",".join(dict.fromkeys(DAY_NAMES[d % 7] for d in range(start, end + 1, step)))
