"""The in-memory driver's claims: the worker's loop (claims in key turns and within rates,
leases, outcomes fenced on the attempt, cancels asked for), the `Claims` role."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime
from typing import Any

from txtasks.control import cancel_wins
from txtasks.driver.base import AttemptFinish, WriteResult
from txtasks.driver.memory_store import MemoryStore
from txtasks.errors import ConfigurationError
from txtasks.keys import (
    KeyLimits,
    KeySlot,
    Rate,
    limits_for,
    rate_after,
    rate_allowance,
    round_robin,
)
from txtasks.types import (
    READY_STATES,
    Outcome,
    OutcomeKind,
    TaskKey,
    TaskRow,
    TaskState,
    claim_order,
)


def no_transactions() -> ConfigurationError:
    return ConfigurationError(
        "ctx.transaction(): the in-memory driver has no database to open a transaction on; "
        "run this handler's tests on SQLite (see txtasks.testing)"
    )


#: The states of a key's tasks that hold its place (staged rows are not committed yet).
_KEY_LIVE = (TaskState.PENDING, TaskState.RETRYABLE, TaskState.PROCESSING)


class MemoryClaims:
    """Claims atomic like SKIP LOCKED on one host: each one holds the store's lock."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def task_claim_many(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        now: datetime,
        lease_until: datetime,
        worker_id: str,
        keys: Mapping[str, KeyLimits] | None = None,
        queue_rates: Mapping[str, Rate] | None = None,
    ) -> list[TaskRow]:
        """Tasks without a key in claim order, and tasks with one by their keys' limits and in
        turn (as the SQL drivers: see txtasks.keys); which lane goes first alternates. A queue
        with a rate of its own is claimed on its own, at most what its rate allows."""
        with self.store.lock:
            queues = [q for q in queues if q not in self.store.paused]
            self.store.keys_first = not self.store.keys_first
            for queue in queues:
                if self.store.keys_wake.get(queue, now) <= now:
                    self.store.keys_wake.pop(queue, None)
            rates = queue_rates or {}
            free = [q for q in queues if q not in rates]
            groups = [[q] for q in queues if q in rates] + ([free] if free else [])
            picked: list[TaskRow] = []
            for group in groups:
                rate = rates.get(group[0])
                allowed = limit - len(picked)
                if rate is not None:
                    start = self.store.key_next_start.get((group[0], ""))
                    allowed = min(allowed, rate_allowance(rate, start, now))
                got = self._lanes_ready(group, now, allowed, keys or {})
                if rate is not None:
                    after = rate_after(rate, start, now, len(got))
                    if after is not None:
                        self.store.key_next_start[(group[0], "")] = after
                        if len(got) == allowed and after > now:  # more may wait for the rate
                            self._keys_wake_note(group[0], after)
                picked += got
            return self._claimed(picked, now, lease_until, worker_id)

    async def task_claim_ids(
        self,
        queues: Sequence[str],
        ids: Sequence[int],
        *,
        now: datetime,
        lease_until: datetime,
        worker_id: str,
    ) -> list[TaskRow]:
        """Those of the tasks `ids` a claim of `queues` without a key would take."""
        with self.store.lock:
            wanted = [q for q in queues if q not in self.store.paused]
            picked = []
            for task_id in dict.fromkeys(ids):
                row = self.store.live.get(task_id)
                if row is None or row.queue not in wanted or row.partition_key is not None:
                    continue
                if row.state in READY_STATES and row.run_at <= now:
                    picked.append(row)
            return self._claimed(picked, now, lease_until, worker_id)

    def _claimed(
        self, picked: list[TaskRow], now: datetime, lease_until: datetime, worker_id: str
    ) -> list[TaskRow]:
        """The rows `picked`, claimed by `worker_id` (stored), in claim order."""
        claimed = []
        for row in picked:
            new = row._replace(
                state=TaskState.PROCESSING,
                attempt=row.attempt + 1,
                lease_expires_at=lease_until,
                worker_id=worker_id,
                started_at=now,
            )
            self.store.live[row.id] = new
            claimed.append(new)
        claimed.sort(key=claim_order)
        return claimed

    def _lanes_ready(
        self, queues: Sequence[str], now: datetime, limit: int, keys: Mapping[str, KeyLimits]
    ) -> list[TaskRow]:
        picked: list[TaskRow] = []
        for lane in ("keys", "plain") if self.store.keys_first else ("plain", "keys"):
            left = limit - len(picked)
            if left <= 0:
                break
            if lane == "plain":
                picked += self._plain_ready(queues, now)[:left]
            else:
                picked += self._keyed_ready(queues, now, left, keys)
        return picked

    def _keys_wake_note(self, queue: str, when: datetime) -> None:
        noted = self.store.keys_wake.get(queue)
        self.store.keys_wake[queue] = when if noted is None else min(noted, when)

    def _plain_ready(self, queues: Sequence[str], now: datetime) -> list[TaskRow]:
        return sorted(
            (
                r
                for r in self.store.live.values()
                if r.queue in queues
                and r.partition_key is None
                and r.state in READY_STATES
                and r.run_at <= now
            ),
            key=claim_order,
        )

    def _keyed_ready(
        self, queues: Sequence[str], now: datetime, limit: int, declared: Mapping[str, KeyLimits]
    ) -> list[TaskRow]:
        """Up to `limit` tasks with a key, one per key per round, keys longest unserved first."""
        live: dict[tuple[str, str], list[TaskRow]] = {}
        for row in self.store.live.values():
            if row.queue in queues and row.partition_key is not None and row.state in _KEY_LIVE:
                live.setdefault((row.queue, row.partition_key), []).append(row)
        order = sorted(
            live,
            key=lambda pair: (self.store.key_turns.get(pair, 0), min(r.id for r in live[pair])),
        )
        found: list[list[TaskRow]] = []
        waiting: list[int] = []
        slots: list[KeySlot] = []
        for queue, key in order:
            rows = live[(queue, key)]
            limits = limits_for(queue, key, declared, self.store.key_overrides)
            running = sum(1 for r in rows if r.state is TaskState.PROCESSING)
            slot = KeySlot(queue, key, limits, running, self.store.key_next_start.get((queue, key)))
            want = slot.want(now)
            if limits.ordered:
                head = min(rows, key=lambda r: r.id)
                due = [head] if head.state in READY_STATES and head.run_at <= now else []
            else:
                due = sorted(
                    (r for r in rows if r.state in READY_STATES and r.run_at <= now),
                    key=claim_order,
                )
            found.append(due[:want])
            waiting.append(len(due))
            slots.append(slot)
        given = round_robin([len(f) for f in found], limit)
        picked = []
        for slot, rows, due_count, n in zip(slots, found, waiting, given, strict=True):
            pair = (slot.queue, slot.key)
            if n:
                picked += rows[:n]
                self.store.key_turns[pair] = next(self.store.turns)
                self.store.key_touched[pair] = now
                after = rate_after(slot.limits.rate, slot.next_start_at, now, n)
                if after is not None:
                    self.store.key_next_start[pair] = after
            next_start = self.store.key_next_start.get(pair)
            if next_start is not None and next_start > now and due_count > n:
                self._keys_wake_note(slot.queue, next_start)  # due tasks wait for the rate
        return picked

    def keys_wake_at(self, queues: Sequence[str], now: datetime) -> datetime | None:
        noted = [self.store.keys_wake[q] for q in queues if q in self.store.keys_wake]
        return min(noted) if noted else None

    async def lease_extend_many(
        self,
        keys: Sequence[TaskKey],
        *,
        lease_until: datetime | Callable[[], datetime],
        worker_id: str | None = None,
        progress: Mapping[TaskKey, str] | None = None,
        left_out: set[TaskKey] | None = None,
        wait_locked: bool = False,
    ) -> int:
        count = 0  # no row locks here: `wait_locked` changes nothing
        until = lease_until() if callable(lease_until) else lease_until
        with self.store.lock:
            for key in keys:
                row = self._current(key, worker_id)
                if row is not None:
                    report = progress.get(key, row.progress) if progress else row.progress
                    self.store.live[key.id] = row._replace(lease_expires_at=until, progress=report)
                    count += 1
                elif left_out is not None:
                    left_out.add(key)
        return count

    async def cancel_requested_list(self, keys: Sequence[TaskKey]) -> list[TaskKey]:
        with self.store.lock:
            return [
                k
                for k in keys
                if (r := self.store.live.get(k.id)) is not None
                and r.attempt == k.attempt
                and r.cancel_requested_at is not None
            ]

    async def outcome_write_many(
        self,
        outcomes: Sequence[Outcome],
        *,
        now: datetime,
        archive_completed: bool = True,
        worker_id: str | None = None,
        expired_before: datetime | None = None,
    ) -> WriteResult:
        stale: list[TaskKey] = []
        with self.store.lock:
            for outcome in outcomes:
                row = self._current(outcome.key, worker_id, expired_before)
                if row is None:
                    stale.append(outcome.key)
                    continue
                self._apply(row, outcome, now, archive_completed)
        return WriteResult(len(outcomes) - len(stale), tuple(stale))

    def _current(
        self, key: TaskKey, worker_id: str | None = None, expired_before: datetime | None = None
    ) -> TaskRow | None:
        row = self.store.live.get(key.id)
        if row is None or row.attempt != key.attempt or row.state is not TaskState.PROCESSING:
            return None
        if worker_id is not None and row.worker_id != worker_id:
            return None
        if expired_before is not None and not (
            row.lease_expires_at is not None and row.lease_expires_at < expired_before
        ):
            return None
        return row

    def _apply(self, row: TaskRow, outcome: Outcome, now: datetime, archive: bool) -> None:
        outcome = cancel_wins(outcome, row.cancel_requested_at is not None)
        kind = outcome.kind
        if kind.finishes:
            del self.store.live[row.id]
            if kind is not OutcomeKind.COMPLETE or archive or outcome.result is not None:
                self.store.archived[row.id] = row._replace(
                    state=TaskState(kind.value),
                    last_error=outcome.error or row.last_error,
                    lease_expires_at=None,
                    finished_at=now,
                    result=outcome.result,
                )
        elif kind is OutcomeKind.RETRY:
            assert outcome.run_at is not None
            self.store.live[row.id] = row._replace(
                state=TaskState.RETRYABLE,
                run_at=outcome.run_at,
                last_error=outcome.error,
                checkpoint=outcome.checkpoint or row.checkpoint,
                lease_expires_at=None,
                worker_id=None,
            )
        else:
            self.store.live[row.id] = row._replace(
                state=TaskState.PENDING,
                attempt=row.attempt - 1,
                lease_expires_at=None,
                worker_id=None,
            )

    def attempt_transaction(
        self, key: TaskKey, *, worker_id: str, finish: AttemptFinish
    ) -> AbstractAsyncContextManager[Any]:
        raise no_transactions()

    def attempt_transaction_sync(
        self, key: TaskKey, *, worker_id: str, finish: AttemptFinish
    ) -> AbstractContextManager[Any]:
        raise no_transactions()
