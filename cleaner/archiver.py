"""The archiver: finished rows still in the hot table move to the archive.

Workers move a task to the archive in the same transaction that records its outcome, so the
hot table normally holds live tasks only. Rows in a finished state can still appear there
(written by hand, by another tool, or by an older version); the archiver moves them, in
batches, so the claim index stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

from cleaner.sweep import MAX_BATCHES, Sweep, SweepConfig, SweepResult


@dataclass(frozen=True)
class ArchiverConfig(SweepConfig):
    """Settings of the archiver."""

    #: Seconds between passes.
    interval: float = 60.0
    #: Rows moved per transaction.
    batch_size: int = 1000


@dataclass(frozen=True)
class ArchiveResult(SweepResult):
    """What an archive pass did."""

    #: Finished rows moved from the hot table to the archive.
    archived: int = 0


class Archiver(Sweep[ArchiverConfig, ArchiveResult]):
    """Moves finished rows out of the hot table."""

    name = "archiver"

    async def run_once(self) -> ArchiveResult:
        archived = 0
        for _ in range(MAX_BATCHES):
            moved = await self.driver.finished_archive_many(
                now=self.app.clock(), limit=self.config.batch_size
            )
            archived += moved
            if moved < self.config.batch_size:
                break
        return ArchiveResult(archived=archived)
