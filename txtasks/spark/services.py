"""The Spark integration's services (see `txtasks.services`), found through the entry points
of `txtasks.services` (pyproject.toml): the hosts import nothing of Spark.

- `DeferredPublisher` ("publisher", in workers and cleaners): the rows of Spark writes
  committed in deferred mode become tasks, batch after batch (`txtasks.spark.staging.publisher`);
  it also shows the backlog of such rows in `txtasks status`.
- `StagedPurge` ("staged_purge", in cleaners): staged rows no write reads any more are deleted:
  those of ended attempts at once, and those of a write that never ended, because its Spark
  driver died, after `after` seconds. No task and no write reads them, so a batch holds no lock
  anything waits for, and a larger one costs fewer statements per row.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, ClassVar

from txtasks._checks import check_number
from txtasks.services import (
    MAX_BATCHES,
    ServiceConfig,
    ServiceHost,
    ServiceResult,
    StatusSection,
    age_text,
    batches,
    check_positive_int,
)
from txtasks.spark.staging import BY_BACKEND, Backlog, purge_abandoned, staging_for
from txtasks.spark.staging.publisher import BATCH_ROWS, publish_pending

if TYPE_CHECKING:
    from txtasks.driver import Driver

__all__ = ["DeferredPublisher", "PublishResult", "PurgeResult", "StagedPurge"]


@dataclass(frozen=True)
class PublishResult(ServiceResult):
    """What a publish pass did."""

    #: Staged rows of deferred writes taken (published, skipped by dedup, or dropped).
    rows: int = 0
    #: Tasks made claimable.
    tasks: int = 0


@dataclass(frozen=True)
class DeferredPublisher(ServiceConfig):
    """Publishes the committed rows of deferred Spark writes: `batch_size` rows per
    transaction, waking the queues of each batch after it commits. Any number of workers and
    cleaners publish at once, each taking a different write attempt; a pass costs one indexed
    probe when nothing waits."""

    name: ClassVar[str] = "publisher"
    hosts: ClassVar[Collection[str]] = ("worker", "cleaner")
    activity: ClassVar[str] = "publishing deferred writes"

    #: Seconds between passes.
    interval: float = 1.0
    #: Staged rows published per transaction.
    batch_size: int = BATCH_ROWS

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self, "batch_size", self.batch_size)

    async def run_once(self, host: ServiceHost) -> PublishResult:
        done = await publish_pending(
            host.driver,
            clock=host.clock,
            wake=host.wake,
            limit=self.batch_size,
            max_batches=MAX_BATCHES,
        )
        return PublishResult(rows=done.rows, tasks=done.tasks)

    async def status(self, driver: Driver, now: datetime) -> StatusSection:
        """The rows of deferred writes no publisher took yet (`deferred` in `--json`)."""
        staged = driver.capabilities.name in BY_BACKEND
        backlog = await staging_for(driver).backlog() if staged else Backlog()
        oldest = backlog.oldest_committed_at
        age = None if oldest is None else max(0.0, (now - oldest).total_seconds())
        document = {"rows": backlog.rows, "commits": backlog.commits, "oldest_commit_age": age}
        row = (str(backlog.rows), str(backlog.commits), age_text(age or 0.0))
        return StatusSection(
            "deferred",
            document,
            "deferred Spark writes to publish",
            ("rows", "commits", "oldest commit"),
            (row,) if backlog.rows else (),
        )


@dataclass(frozen=True)
class PurgeResult(ServiceResult):
    """What a purge pass did."""

    #: Staged rows deleted: of ended attempts, and of abandoned writes.
    abandoned: int = 0


@dataclass(frozen=True)
class StagedPurge(ServiceConfig):
    """Deletes the staged rows that no write reads any more (see the module docstring); the
    rows of a deferred commit wait for a publisher however long that takes."""

    name: ClassVar[str] = "staged_purge"
    hosts: ClassVar[Collection[str]] = ("cleaner",)
    activity: ClassVar[str] = "purging staged rows"

    #: Seconds between passes.
    interval: float = 60.0
    #: Staged rows deleted per transaction.
    batch_size: int = 10_000
    #: Seconds after which a staged row is deleted: its write (a Spark job) never committed
    #: or aborted because its driver died.
    after: float = 86400.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self, "batch_size", self.batch_size)
        check_number("StagedPurge.after", self.after, above=0)

    async def run_once(self, host: ServiceHost) -> PurgeResult:
        before = host.clock() - timedelta(seconds=self.after)
        abandoned = await batches(
            lambda limit: purge_abandoned(host.driver, before=before, limit=limit),
            self.batch_size,
        )
        return PurgeResult(abandoned=abandoned)
