"""The archiver: finished rows still in the hot table move to the archive, and staged rows
of abandoned writes are deleted.

Workers move a task to the archive in the same transaction that records its outcome, so the
hot table normally holds live tasks only. Rows in a finished state can still appear there
(written by hand, by another tool, or by an older version); the archiver moves them, in
batches, so the claim index stays small. Staged rows (a Spark write not yet committed) whose
write never ended, because its Spark driver died, are deleted after `staged_after` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from cleaner.sweep import BatchedConfig, Sweep, SweepResult
from txtasks.errors import ConfigurationError
from txtasks.spark.staging import purge_abandoned


@dataclass(frozen=True)
class ArchiverConfig(BatchedConfig):
    """Settings of the archiver."""

    #: Seconds between passes.
    interval: float = 60.0
    #: Rows moved per transaction.
    batch_size: int = 1000
    #: Seconds after which a staged row is deleted: its write (a Spark job) never committed
    #: or aborted because its driver died.
    staged_after: float = 86400.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.staged_after > 0:
            raise ConfigurationError(
                f"ArchiverConfig.staged_after must be > 0 seconds, got {self.staged_after!r}"
            )


@dataclass(frozen=True)
class ArchiveResult(SweepResult):
    """What an archive pass did."""

    #: Finished rows moved from the hot table to the archive.
    archived: int = 0
    #: Staged rows deleted: of ended attempts, and of abandoned writes.
    abandoned: int = 0


class Archiver(Sweep[ArchiverConfig, ArchiveResult]):
    """Moves finished rows out of the hot table."""

    name = "archiver"

    async def run_once(self) -> ArchiveResult:
        driver = self.driver
        archived = await self.batches(
            lambda limit: driver.finished_archive_many(now=self.app.clock(), limit=limit),
            self.config.batch_size,
        )
        before = self.app.clock() - timedelta(seconds=self.config.staged_after)
        abandoned = await self.batches(
            lambda limit: purge_abandoned(driver, before=before, limit=limit),
            self.config.batch_size,
        )
        return ArchiveResult(archived=archived, abandoned=abandoned)
