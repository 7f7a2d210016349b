"""The stats sweep: queue depth and the age of the oldest ready task, for the metrics.

It runs only when the cleaner serves metrics (`--metrics-port`): each pass counts the live
tasks per queue and state (one grouped query on the hot table) and sets the gauges
`txtasks_queue_tasks` and `txtasks_queue_oldest_ready_seconds`, and those of the busiest keys
(`txtasks_key_tasks`, `txtasks_key_rate_limited`). It writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from cleaner.sweep import Sweep, SweepConfig, SweepResult

#: Keys shown in the metrics: the busiest, so that their labels stay few.
BUSIEST = 20


@dataclass(frozen=True)
class StatsConfig(SweepConfig):
    """Settings of the stats sweep."""

    #: Seconds between passes: how fresh the queue gauges are.
    interval: float = 15.0


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
        stats = await self.driver.queue_stats(now=self.app.clock(), archived=False)
        if self.metrics is not None:
            self.metrics.queues_seen(stats)
            self.metrics.keys_seen(await self.driver.key_stats(now=self.app.clock(), limit=BUSIEST))
        return StatsResult(queues=len(stats))
