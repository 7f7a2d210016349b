"""The publisher: rows of Spark writes committed in deferred mode become tasks.

A Spark write with option `publish` = "deferred" commits by recording which staged rows it
committed; this sweep (and every worker, unless turned off) moves them into the hot table in
batches of `batch_size` rows, one transaction each, sending the wake-ups of each batch after it
commits. Several cleaners and workers publish in parallel, each taking a different write
attempt; one killed mid-batch leaves its batch to the next. A pass costs one indexed probe when
nothing waits. See `txtasks.spark.staging.publisher`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cleaner.sweep import MAX_BATCHES, BatchedConfig, Sweep, SweepResult
from txtasks.spark.staging.publisher import BATCH_ROWS, publish_pending


@dataclass(frozen=True)
class PublisherConfig(BatchedConfig):
    """Settings of the publisher."""

    #: Seconds between passes.
    interval: float = 1.0
    #: Staged rows published per transaction.
    batch_size: int = BATCH_ROWS


@dataclass(frozen=True)
class PublishResult(SweepResult):
    """What a publish pass did."""

    #: Staged rows of deferred writes taken (published, skipped by dedup, or dropped).
    rows: int = 0
    #: Tasks made claimable.
    tasks: int = 0


class Publisher(Sweep[PublisherConfig, PublishResult]):
    """Publishes the committed rows of deferred Spark writes."""

    name = "publisher"

    async def run_once(self) -> PublishResult:
        done = await publish_pending(
            self.driver,
            clock=self.app.clock,
            wake=self.app.notify,
            limit=self.config.batch_size,
            max_batches=MAX_BATCHES,
        )
        return PublishResult(rows=done.rows, tasks=done.tasks)
