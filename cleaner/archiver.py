"""The archiver: finished rows still in the hot table move to the archive.

Workers move a task to the archive in the same transaction that records its outcome, so the
hot table normally holds live tasks only. Rows in a finished state can still appear there
(written by hand, by another tool, or by an older version); the archiver moves them, in
batches, so the claim index stays small. (Staged rows of Spark writes no write reads any more
are deleted by the service `staged_purge` of txtasks.spark.)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from cleaner.sweep import BatchedConfig, Sweep, SweepResult
from txtasks._checks import check_number
from txtasks.services import check_positive_int


@dataclass(frozen=True)
class ArchiverConfig(BatchedConfig):
    """Settings of the archiver."""

    #: Seconds between passes.
    interval: float = 60.0
    #: Rows moved per transaction.
    batch_size: int = 1000
    #: Deprecated: the service staged_purge's `batch_size` (the cleaner hands it over).
    staged_batch_size: int | None = None
    #: Deprecated: the service staged_purge's `after` (the cleaner hands it over).
    staged_after: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.staged_batch_size is not None:
            check_positive_int(self, "staged_batch_size", self.staged_batch_size)
        if self.staged_after is not None:
            check_number("ArchiverConfig.staged_after", self.staged_after, above=0)
        if self.staged_settings():
            warnings.warn(
                "ArchiverConfig.staged_batch_size and staged_after are deprecated: the purge of "
                "staged rows is the service 'staged_purge' (txtasks.spark.StagedPurge); set "
                "CleanerConfig(services={'staged_purge': StagedPurge(batch_size=..., "
                "after=...)}) or --set staged_purge.after=...",
                DeprecationWarning,
                stacklevel=3,
            )

    def staged_settings(self) -> dict[str, Any]:
        """The deprecated settings given, by their names in the service staged_purge."""
        given = {"batch_size": self.staged_batch_size, "after": self.staged_after}
        return {name: value for name, value in given.items() if value is not None}


@dataclass(frozen=True)
class ArchiveResult(SweepResult):
    """What an archive pass did."""

    #: Finished rows moved from the hot table to the archive.
    archived: int = 0


class Archiver(Sweep[ArchiverConfig, ArchiveResult]):
    """Moves finished rows out of the hot table."""

    name = "archiver"

    async def run_once(self) -> ArchiveResult:
        driver = self.driver
        archived = await self.batches(
            lambda limit: driver.sweeps.finished_archive_many(now=self.app.clock(), limit=limit),
            self.config.batch_size,
        )
        return ArchiveResult(archived=archived)
