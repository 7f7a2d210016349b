"""The archiver: finished rows still in the hot table move to the archive, and staged rows
of abandoned writes are deleted.

Workers move a task to the archive in the same transaction that records its outcome, so the
hot table normally holds live tasks only. Rows in a finished state can still appear there
(written by hand, by another tool, or by an older version); the archiver moves them, in
batches, so the claim index stays small. Staged rows that no write reads any more are deleted,
in batches of their own size: those of ended attempts at once, and those of a write that never
ended, because its Spark driver died, after `staged_after` seconds.
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
    #: Staged rows deleted per transaction: no task and no write reads them, so a batch holds
    #: no lock anything waits for, and a larger one costs fewer statements per row.
    staged_batch_size: int = 10_000
    #: Seconds after which a staged row is deleted: its write (a Spark job) never committed
    #: or aborted because its driver died.
    staged_after: float = 86400.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.staged_batch_size, int) and self.staged_batch_size > 0):
            raise ConfigurationError(
                "ArchiverConfig.staged_batch_size must be an integer > 0, "
                f"got {self.staged_batch_size!r}"
            )
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
            lambda limit: driver.sweeps.finished_archive_many(now=self.app.clock(), limit=limit),
            self.config.batch_size,
        )
        before = self.app.clock() - timedelta(seconds=self.config.staged_after)
        abandoned = await self.batches(
            lambda limit: purge_abandoned(driver, before=before, limit=limit),
            self.config.staged_batch_size,
        )
        return ArchiveResult(archived=archived, abandoned=abandoned)
