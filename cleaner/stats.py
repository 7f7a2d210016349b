"""The stats sweep: queue depth, backlog, rates and the oldest ready task, for the metrics.

It runs only when the cleaner serves metrics (`--metrics-port`): each pass counts the live
tasks per queue and state and sets the gauges `txtasks_queue_tasks`,
`txtasks_queue_ready_tasks` and `txtasks_queue_oldest_ready_seconds`; counts the tasks
enqueued and finished over the last `window` seconds (`txtasks_queue_enqueued_per_second`,
`txtasks_queue_finished_per_second`); and sets those of the busiest keys
(`txtasks_key_tasks`, `txtasks_key_rate_limited`). It writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from cleaner.sweep import Sweep, SweepConfig, SweepResult
from txtasks.errors import ConfigurationError

#: Keys shown in the metrics: the busiest, so that their labels stay few.
BUSIEST = 20


@dataclass(frozen=True)
class StatsConfig(SweepConfig):
    """Settings of the stats sweep."""

    #: Seconds between passes: how fresh the queue gauges are.
    interval: float = 15.0
    #: Seconds over which arrival and finish rates are counted.
    window: float = 60.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.window > 0:
            raise ConfigurationError(f"StatsConfig.window must be > 0, got {self.window!r}")


@dataclass(frozen=True)
class StatsResult(SweepResult):
    """What a stats pass saw."""

    #: Queues with live tasks.
    queues: int = 0

    @property
    def busy(self) -> bool:
        return False  # it changes nothing: its passes log at debug


class Stats(Sweep[StatsConfig, StatsResult]):
    """Refreshes the queue gauges of the cleaner's metrics."""

    name = "stats"

    async def run_once(self) -> StatsResult:
        now = self.app.clock()
        stats = await self.driver.admin.queue_stats(now=now, archived=False)
        if self.metrics is not None:
            self.metrics.queues_seen(stats)
            window = self.config.window
            self.metrics.rates_seen(await self.driver.admin.queue_rates(now=now, window=window))
            self.metrics.keys_seen(await self.driver.admin.key_stats(now=now, limit=BUSIEST))
        return StatsResult(queues=len(stats))
