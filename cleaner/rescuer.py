"""The rescuer: tasks whose worker died (lease expired) get the retry / dead-letter policy.

A worker extends the leases of its in-flight tasks with a heartbeat, so a lease runs out only
when its worker stopped (killed, machine gone, cut off from the database). The rescuer then
decides the attempt exactly as a worker decides a failed one (`policy.outcome_for_exception`
with a `LeaseExpired` error): under the default ack policy, retry after the task's backoff while
attempts remain, else dead-letter. A task whose cancel was asked for is archived as cancelled
instead, never retried. The write is fenced on
(id, attempt, processing) and on the lease still being expired, so a task whose heartbeat
arrived meanwhile, or that another cleaner rescued first, is left alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from cleaner.sweep import MAX_BATCHES, BatchedConfig, Sweep, SweepResult
from txtasks.errors import ConfigurationError, LeaseExpired
from txtasks.policy import RetryPolicy, outcome_for_exception, sanitized
from txtasks.retry import as_strategy
from txtasks.types import Outcome, OutcomeKind, TaskRow


@dataclass(frozen=True)
class RescuerConfig(BatchedConfig):
    """Settings of the rescuer."""

    #: Seconds between passes.
    interval: float = 5.0
    #: Expired tasks rescued per statement.
    batch_size: int = 500
    #: Extra seconds a lease must be expired by (tolerates clock skew between hosts).
    grace: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.grace >= 0:
            raise ConfigurationError(f"RescuerConfig.grace must be >= 0, got {self.grace!r}")


@dataclass(frozen=True)
class RescueResult(SweepResult):
    """What a rescue pass did."""

    #: Expired tasks sent back to retryable.
    retried: int = 0
    #: Expired tasks dead-lettered (attempts or deadline exhausted, or ack policy dead_letter).
    dead: int = 0
    #: Expired tasks finished by their ack policy instead (discard or complete).
    finished: int = 0
    #: Expired tasks left alone: a heartbeat or another cleaner got there first.
    skipped: int = 0
    #: Expired tasks whose cancel was asked for: archived as cancelled, never retried.
    cancelled: int = 0


class Rescuer(Sweep[RescuerConfig, RescueResult]):
    """Applies the retry / dead-letter policy to tasks whose lease expired."""

    name = "rescuer"

    async def run_once(self) -> RescueResult:
        retried = dead = finished = skipped = cancelled = 0
        for _ in range(MAX_BATCHES):
            now = self.app.clock()
            cutoff = now - timedelta(seconds=self.config.grace)
            rows = await self.driver.sweeps.lease_expired_list(
                now=cutoff, limit=self.config.batch_size
            )
            outcomes = [self.outcome(row, now) for row in rows]
            written = await self.driver.claims.outcome_write_many(
                outcomes, now=now, expired_before=cutoff
            )
            stale = set(written.stale)
            applied = [o for o in outcomes if o.key not in stale]
            retried += sum(o.kind is OutcomeKind.RETRY for o in applied)
            dead += sum(o.kind is OutcomeKind.DEAD for o in applied)
            finished += sum(o.kind in (OutcomeKind.DISCARD, OutcomeKind.COMPLETE) for o in applied)
            skipped += len(stale)
            cancelled += sum(o.kind is OutcomeKind.CANCEL for o in applied)
            self._wake(rows, applied, now)
            if len(rows) < self.config.batch_size:
                break
        return RescueResult(
            retried=retried, dead=dead, finished=finished, skipped=skipped, cancelled=cancelled
        )

    def outcome(self, row: TaskRow, now: datetime) -> Outcome:
        """The outcome of an attempt whose worker stopped: a failure with `LeaseExpired`,
        under the task's own ack policy and retry strategy (as a worker decides a failure).
        A task whose cancel was asked for is archived as cancelled instead (and if the cancel
        arrives after this read, the database records the retry as cancelled all the same)."""
        if row.cancel_requested_at is not None:
            reason = (
                f"cancelled: worker {row.worker_id} stopped heartbeating before it stopped the "
                "task (rescued by the cleaner)"
            )
            return Outcome(row.key, OutcomeKind.CANCEL, error=reason)
        task = self.app.tasks.get(row.task_name)
        policy = task.policy if task is not None else RetryPolicy(as_strategy(None))
        error = LeaseExpired(
            f"lease expired at {row.lease_expires_at:%Y-%m-%d %H:%M:%S.%f} UTC: worker "
            f"{row.worker_id} stopped heartbeating (rescued by the cleaner)"
        )
        outcome = outcome_for_exception(
            row.key,
            policy,
            error,
            now=now,
            expires_at=row.expires_at,
            max_attempts=row.max_attempts,
        )
        return sanitized(outcome)

    def _wake(self, rows: list[TaskRow], applied: list[Outcome], now: datetime) -> None:
        """Wake workers for rescued tasks that are due again at once."""
        queue_of = {row.id: row.queue for row in rows}
        due: dict[str, list[int]] = defaultdict(list)
        for o in applied:
            if o.kind is OutcomeKind.RETRY and o.run_at is not None and o.run_at <= now:
                due[queue_of[o.key.id]].append(o.key.id)
        for queue, ids in due.items():
            self.app.notify(queue, ids)
