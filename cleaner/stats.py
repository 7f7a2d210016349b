"""The stats sweep: the queues' history for the dashboard, and queue gauges for the metrics.

It runs in every cleaner. Each pass writes the history (table `txtasks_history`): the tasks
enqueued, completed, failed and dead-lettered per queue in each minute that is over (by
`settle` seconds) since the last minute written (at most `history_backfill` seconds back, so a
pass after a long stop stays cheap: those minutes are not recorded), one row per minute and
queue that had any, inserted only where no row of that minute and queue is: a rerun or a second
cleaner at the same time finds it written and counts nothing twice. It deletes the minutes
older than `history_keep` (a week). The dashboard's queue page charts the last day and week
from it.

When the cleaner serves metrics (`--metrics-port`), each pass also counts the live tasks per
queue and state and sets the gauges `txtasks_queue_tasks`, `txtasks_queue_ready_tasks` and
`txtasks_queue_oldest_ready_seconds`; counts the tasks enqueued and finished over the last
`window` seconds (`txtasks_queue_enqueued_per_second`, `txtasks_queue_finished_per_second`);
and sets those of the busiest keys (`txtasks_key_tasks`, `txtasks_key_rate_limited`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from cleaner.sweep import Sweep, SweepConfig, SweepResult
from txtasks.driver.history import minute_at, minute_number
from txtasks.errors import ConfigurationError

#: Keys shown in the metrics: the busiest, so that their labels stay few.
BUSIEST = 20
#: Seconds in a week: how long the history keeps a minute by default.
WEEK = 7 * 86400.0


@dataclass(frozen=True)
class StatsConfig(SweepConfig):
    """Settings of the stats sweep."""

    #: Seconds between passes: how fresh the queue gauges are.
    interval: float = 15.0
    #: Seconds over which arrival and finish rates are counted.
    window: float = 60.0
    #: Seconds the history keeps a minute.
    history_keep: float = WEEK
    #: Seconds after a minute ends before it is written (a task finishing at its end commits
    #: a little later; a minute written is not written again).
    history_settle: float = 30.0
    #: Seconds back a pass counts at most (the first pass, or one after a long stop).
    history_backfill: float = 3600.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("window", "history_keep", "history_backfill"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(
                    f"StatsConfig.{name} must be > 0, got {getattr(self, name)!r}"
                )
        if not self.history_settle >= 0:
            raise ConfigurationError(
                f"StatsConfig.history_settle must be >= 0, got {self.history_settle!r}"
            )


@dataclass(frozen=True)
class StatsResult(SweepResult):
    """What a stats pass saw and wrote."""

    #: Queues with live tasks (0 when the cleaner serves no metrics: not counted).
    queues: int = 0
    #: Rows of the history written (minutes and queues with tasks), and purged.
    minutes: int = 0
    purged: int = 0

    @property
    def busy(self) -> bool:
        return False  # a row per queue and minute: its passes log at debug


class Stats(Sweep[StatsConfig, StatsResult]):
    """Writes the queues' history and refreshes the queue gauges of the cleaner's metrics."""

    name = "stats"

    async def run_once(self) -> StatsResult:
        minutes, purged = await self.history_once()
        if self.metrics is None:
            return StatsResult(minutes=minutes, purged=purged)
        now = self.app.clock()
        stats = await self.driver.admin.queue_stats(now=now, archived=False)
        self.metrics.queues_seen(stats)
        window = self.config.window
        self.metrics.rates_seen(await self.driver.admin.queue_rates(now=now, window=window))
        self.metrics.keys_seen(await self.driver.admin.key_stats(now=now, limit=BUSIEST))
        return StatsResult(queues=len(stats), minutes=minutes, purged=purged)

    async def history_once(self) -> tuple[int, int]:
        """Write the minutes over since the last one written; delete those past keeping."""
        config, sweeps = self.config, self.driver.sweeps
        now = self.app.clock()
        until = minute_number(now - timedelta(seconds=config.history_settle))
        first = minute_number(now - timedelta(seconds=config.history_backfill))
        last = await sweeps.history_last()
        if last is not None:
            first = max(first, last + 1)
        written = 0
        if first < until:
            rows = await sweeps.history_count(since=minute_at(first), until=minute_at(until))
            await sweeps.history_write(rows)
            written = len(rows)
        keep = minute_number(now - timedelta(seconds=config.history_keep))
        return written, await sweeps.history_purge(before=keep)
