"""Retention: archived rows older than their retention are deleted, in batches; so are the
rows of keys idle for `keys_idle` (their scheduling state, see txtasks.keys), and the records
of publishes dropped for want of a subscriber older than `topic_drops` (see txtasks.topics).

Retention is per outcome (completed, failed, discarded, dead), with per-queue overrides.
Dead letters are kept until re-driven (`txtasks dlq requeue`) or purged (`txtasks dlq purge`)
unless a retention is set for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from types import MappingProxyType

from cleaner.sweep import BatchedConfig, Sweep, SweepResult
from txtasks._checks import MAX_SECONDS
from txtasks.app import check_queue_name
from txtasks.clock import seconds
from txtasks.errors import ConfigurationError
from txtasks.types import FINISHED_STATES, TaskState

DAY = 86400.0


@dataclass(frozen=True)
class Keep:
    """How long archived rows are kept, per final state: seconds or a timedelta; None keeps
    them until deleted by hand."""

    completed: float | timedelta | None = 7 * DAY
    failed: float | timedelta | None = 30 * DAY
    discarded: float | timedelta | None = 7 * DAY
    dead: float | timedelta | None = None
    cancelled: float | timedelta | None = 7 * DAY

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            try:
                value = seconds(value)
            except (TypeError, ValueError):
                value = -1.0
            if not 0 <= value <= MAX_SECONDS:
                raise ConfigurationError(
                    f"retention {f.name}: expected seconds >= 0 (100 years at most), a timedelta "
                    f"or None, got {getattr(self, f.name)!r}"
                )
            object.__setattr__(self, f.name, value)

    def seconds_for(self, state: TaskState) -> float | None:
        value = getattr(self, state.value)
        return None if value is None else float(value)


@dataclass(frozen=True)
class RetentionConfig(BatchedConfig):
    """Settings of the retention sweep."""

    #: Seconds between passes.
    interval: float = 300.0
    #: Rows deleted per transaction.
    batch_size: int = 1000
    #: Retention of every queue without an override.
    keep: Keep = field(default_factory=Keep)
    #: Per-queue overrides: queue name -> Keep.
    queues: Mapping[str, Keep] = field(default_factory=dict)
    #: Seconds after which the scheduling state of a key with no task left (its row in
    #: `txtasks_keys`) is forgotten; None keeps it. A key that gets a task again starts afresh.
    keys_idle: float | None = DAY
    #: Seconds the record of a publish dropped for want of a subscriber is kept (what
    #: `txtasks topics` counts); None keeps them.
    topic_drops: float | None = 7 * DAY

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("keys_idle", "topic_drops"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= MAX_SECONDS:
                raise ConfigurationError(
                    f"RetentionConfig.{name} must be seconds > 0 (100 years at most) or None, "
                    f"got {value!r}"
                )
        for queue, keep in self.queues.items():
            check_queue_name(queue, setting="RetentionConfig.queues")
            if not isinstance(keep, Keep):
                raise ConfigurationError(f"RetentionConfig.queues[{queue!r}] must be a Keep")
        object.__setattr__(self, "queues", MappingProxyType(dict(self.queues)))


@dataclass(frozen=True)
class RetentionResult(SweepResult):
    """What a retention pass did."""

    #: Archived rows deleted, per final state.
    purged: dict[str, int] = field(default_factory=dict)
    #: Rows of idle keys deleted.
    keys_forgotten: int = 0
    #: Records of dropped publishes deleted.
    topic_drops_forgotten: int = 0


ORDER = sorted(FINISHED_STATES, key=lambda s: s.value)


class Retention(Sweep[RetentionConfig, RetentionResult]):
    """Deletes archived rows past their retention."""

    name = "retention"

    async def run_once(self) -> RetentionResult:
        purged: dict[str, int] = {}
        overridden = sorted(self.config.queues)
        for state in ORDER:
            count = await self._purge(state, self.config.keep, None, overridden)
            for queue in overridden:
                count += await self._purge(state, self.config.queues[queue], [queue], ())
            if count:
                purged[state.value] = count
        return RetentionResult(
            purged=purged,
            keys_forgotten=await self._forget_keys(),
            topic_drops_forgotten=await self._forget_drops(),
        )

    async def _forget_drops(self) -> int:
        if self.config.topic_drops is None:
            return 0
        before = self.app.clock() - timedelta(seconds=self.config.topic_drops)
        driver = self.driver
        return await self.batches(
            lambda size: driver.topics.topic_drops_forget_many(before=before, limit=size),
            self.config.batch_size,
        )

    async def _forget_keys(self) -> int:
        if self.config.keys_idle is None:
            return 0
        idle_before = self.app.clock() - timedelta(seconds=self.config.keys_idle)
        driver = self.driver
        return await self.batches(
            lambda size: driver.sweeps.keys_forget_many(idle_before=idle_before, limit=size),
            self.config.batch_size,
        )

    async def _purge(
        self,
        state: TaskState,
        keep: Keep,
        queues: list[str] | None,
        exclude: list[str] | tuple[()],
    ) -> int:
        limit = keep.seconds_for(state)
        if limit is None:
            return 0
        before = self.app.clock() - timedelta(seconds=limit)
        driver = self.driver
        return await self.batches(
            lambda size: driver.sweeps.archive_purge_many(
                state=state, before=before, limit=size, queues=queues, exclude=exclude
            ),
            self.config.batch_size,
        )
