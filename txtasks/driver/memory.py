"""An in-memory driver for unit tests: the same contract as the SQL drivers, no database."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

from txtasks.control import CANCELLABLE, TaskFilter, cancel_wins, cancels_of, task_list_order
from txtasks.driver.base import (
    AttemptFinish,
    Capabilities,
    WriteResult,
    queue_stats_list,
    requeue_choice,
)
from txtasks.errors import ConfigurationError
from txtasks.keys import (
    KeyLimits,
    KeyOverride,
    KeySlot,
    Rate,
    limits_for,
    rate_after,
    rate_allowance,
    round_robin,
)
from txtasks.topics import delivery_row, topic_stats_of
from txtasks.types import (
    FINISHED_STATES,
    LIVE_STATES,
    READY_STATES,
    Cancel,
    Delivery,
    KeyStats,
    NewPublish,
    NewTask,
    Outcome,
    OutcomeKind,
    PeriodicRow,
    ProcessRow,
    QueueRates,
    QueueStats,
    Subscription,
    TaskKey,
    TaskRow,
    TaskState,
    TopicStats,
)


def no_transactions() -> ConfigurationError:
    return ConfigurationError(
        "ctx.transaction(): the in-memory driver has no database to open a transaction on; "
        "run this handler's tests on SQLite (see txtasks.testing)"
    )


def _matches(row: TaskRow, where: TaskFilter) -> bool:
    return (
        (where.queue is None or row.queue == where.queue)
        and (where.task_name is None or row.task_name == where.task_name)
        and (where.key is None or row.partition_key == where.key)
    )


#: The states of a key's tasks that hold its place (staged rows are not committed yet).
_KEY_LIVE = (TaskState.PENDING, TaskState.RETRYABLE, TaskState.PROCESSING)


class MemoryDriver:
    """Tasks in a dict, guarded by a lock; claims are atomic like SKIP LOCKED on one host."""

    capabilities: ClassVar[Capabilities] = Capabilities("memory", shared=False, transactions=False)

    def __init__(self) -> None:
        self.live: dict[int, TaskRow] = {}
        self.archived: dict[int, TaskRow] = {}
        self.periodic: dict[str, PeriodicRow] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._keys_first = False
        #: Per key: when it was last served (for the turns), its rate's next start, and the
        #: limits set at run time.
        self._turns = itertools.count(1)
        self._key_turns: dict[tuple[str, str], int] = {}
        self._keys_wake: dict[str, datetime] = {}
        self._key_next_start: dict[tuple[str, str], datetime] = {}
        #: Per key: when a claim last served it (`keys_forget_many`).
        self._key_touched: dict[tuple[str, str], datetime] = {}
        self._key_overrides: dict[tuple[str | None, str], KeyOverride] = {}
        self._queue_rates: dict[str, Rate] = {}
        #: Subscriptions by (topic, group), and the times of publishes that found none.
        self.subscriptions: dict[tuple[str, str], Subscription] = {}
        self.topic_drops: list[tuple[str, datetime]] = []
        #: Paused queues, with when each was paused.
        self.paused: dict[str, datetime] = {}
        #: Heartbeat rows of workers and cleaners, by id.
        self.beats: dict[str, ProcessRow] = {}
        self.tasks = self.claims = self.topics = self.control = self.admin = self.sweeps = (
            self.processes
        ) = self

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def migrate(self) -> list[int]:
        return []

    async def ping(self) -> None:
        """Always reachable: it lives in this process."""

    # -- enqueue ------------------------------------------------------------------------------

    def task_insert_many_sync(self, rows: Sequence[NewTask]) -> list[int]:
        with self._lock:
            return [self._insert(row) for row in rows]

    async def task_insert_many(self, rows: Sequence[NewTask]) -> list[int]:
        return self.task_insert_many_sync(rows)

    def _insert(self, row: NewTask) -> int:
        if row.dedup_key is not None:
            for existing in self.live.values():
                if existing.dedup_key == row.dedup_key:
                    return existing.id
        task_id = next(self._ids)
        self.live[task_id] = TaskRow(
            id=task_id,
            queue=row.queue,
            task_name=row.task_name,
            payload=row.payload,
            content_type=row.content_type,
            state=row.state,
            priority=row.priority,
            run_at=row.run_at,
            attempt=0,
            max_attempts=row.max_attempts,
            created_at=row.created_at,
            dedup_key=row.dedup_key,
            headers=row.headers,
            expires_at=row.expires_at,
            stage_id=row.stage_id,
            partition_key=row.partition_key,
        )
        return task_id

    # -- topics -------------------------------------------------------------------------------

    def topic_publish_many_sync(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        """Each publish: one task per group subscribed now, all under one lock hold (a
        subscription changes before or after, never during)."""
        with self._lock:
            return [self._publish(p) for p in publishes]

    async def topic_publish_many(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        return self.topic_publish_many_sync(publishes)

    def _publish(self, publish: NewPublish) -> list[Delivery]:
        groups = sorted(
            (s for (topic, _), s in self.subscriptions.items() if topic == publish.topic),
            key=lambda s: s.group,
        )
        if not groups:
            self.topic_drops.append((publish.topic, publish.created_at))
        live_keys = {r.dedup_key for r in self.live.values() if r.dedup_key is not None}
        found = []
        for sub in groups:
            row = delivery_row(publish, sub)
            if row.dedup_key not in live_keys:
                found.append(Delivery(self._insert(row), row.queue))
        return found

    async def subscription_set_many(self, subs: Sequence[Subscription], *, now: datetime) -> None:
        with self._lock:
            for sub in subs:
                known = self.subscriptions.get((sub.topic, sub.group))
                created = now if known is None else known.created_at
                self.subscriptions[(sub.topic, sub.group)] = replace(sub, created_at=created)

    async def subscription_delete_many(self, pairs: Sequence[tuple[str, str]]) -> int:
        with self._lock:
            return sum(self.subscriptions.pop(pair, None) is not None for pair in set(pairs))

    async def subscription_list(self, topics: Sequence[str] | None = None) -> list[Subscription]:
        with self._lock:
            found = [s for s in self.subscriptions.values() if topics is None or s.topic in topics]
        return sorted(found, key=lambda s: (s.topic, s.group))

    async def topic_stats(self) -> list[TopicStats]:
        subs = await self.subscription_list()
        with self._lock:
            counts: dict[tuple[str, str], dict[str, int]] = {}
            for row in self.live.values():
                by_state = counts.setdefault((row.queue, row.task_name), {})
                by_state[row.state.value] = by_state.get(row.state.value, 0) + 1
            dropped: dict[str, tuple[int, datetime | None]] = {}
            for topic, at in self.topic_drops:
                n, last = dropped.get(topic, (0, at))
                dropped[topic] = (n + 1, max(at, last or at))
        return topic_stats_of(subs, counts, dropped)

    async def topic_drops_forget_many(self, *, before: datetime, limit: int) -> int:
        with self._lock:
            old = [d for d in self.topic_drops if d[1] < before][:limit]
            for drop in old:
                self.topic_drops.remove(drop)
            return len(old)

    # -- claim and outcomes -------------------------------------------------------------------

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
        with self._lock:
            queues = [q for q in queues if q not in self.paused]
            self._keys_first = not self._keys_first
            for queue in queues:
                if self._keys_wake.get(queue, now) <= now:
                    self._keys_wake.pop(queue, None)
            rates = queue_rates or {}
            free = [q for q in queues if q not in rates]
            groups = [[q] for q in queues if q in rates] + ([free] if free else [])
            picked: list[TaskRow] = []
            for group in groups:
                rate = rates.get(group[0])
                allowed = limit - len(picked)
                if rate is not None:
                    start = self._key_next_start.get((group[0], ""))
                    allowed = min(allowed, rate_allowance(rate, start, now))
                got = self._lanes_ready(group, now, allowed, keys or {})
                if rate is not None:
                    after = rate_after(rate, start, now, len(got))
                    if after is not None:
                        self._key_next_start[(group[0], "")] = after
                        if len(got) == allowed and after > now:  # more may wait for the rate
                            self._keys_wake_note(group[0], after)
                picked += got
            claimed = []
            for row in picked:
                new = row._replace(
                    state=TaskState.PROCESSING,
                    attempt=row.attempt + 1,
                    lease_expires_at=lease_until,
                    worker_id=worker_id,
                    started_at=now,
                )
                self.live[row.id] = new
                claimed.append(new)
            claimed.sort(key=lambda r: (-r.priority, r.run_at, r.id))
            return claimed

    def _lanes_ready(
        self, queues: Sequence[str], now: datetime, limit: int, keys: Mapping[str, KeyLimits]
    ) -> list[TaskRow]:
        picked: list[TaskRow] = []
        for lane in ("keys", "plain") if self._keys_first else ("plain", "keys"):
            left = limit - len(picked)
            if left <= 0:
                break
            if lane == "plain":
                picked += self._plain_ready(queues, now)[:left]
            else:
                picked += self._keyed_ready(queues, now, left, keys)
        return picked

    def _keys_wake_note(self, queue: str, when: datetime) -> None:
        noted = self._keys_wake.get(queue)
        self._keys_wake[queue] = when if noted is None else min(noted, when)

    def _plain_ready(self, queues: Sequence[str], now: datetime) -> list[TaskRow]:
        return sorted(
            (
                r
                for r in self.live.values()
                if r.queue in queues
                and r.partition_key is None
                and r.state in READY_STATES
                and r.run_at <= now
            ),
            key=lambda r: (-r.priority, r.run_at, r.id),
        )

    def _keyed_ready(
        self, queues: Sequence[str], now: datetime, limit: int, declared: Mapping[str, KeyLimits]
    ) -> list[TaskRow]:
        """Up to `limit` tasks with a key, one per key per round, keys longest unserved first."""
        live: dict[tuple[str, str], list[TaskRow]] = {}
        for row in self.live.values():
            if row.queue in queues and row.partition_key is not None and row.state in _KEY_LIVE:
                live.setdefault((row.queue, row.partition_key), []).append(row)
        order = sorted(
            live, key=lambda pair: (self._key_turns.get(pair, 0), min(r.id for r in live[pair]))
        )
        found: list[list[TaskRow]] = []
        waiting: list[int] = []
        slots: list[KeySlot] = []
        for queue, key in order:
            rows = live[(queue, key)]
            limits = limits_for(queue, key, declared, self._key_overrides)
            running = sum(1 for r in rows if r.state is TaskState.PROCESSING)
            slot = KeySlot(queue, key, limits, running, self._key_next_start.get((queue, key)))
            want = slot.want(now)
            if limits.ordered:
                head = min(rows, key=lambda r: r.id)
                due = [head] if head.state in READY_STATES and head.run_at <= now else []
            else:
                due = sorted(
                    (r for r in rows if r.state in READY_STATES and r.run_at <= now),
                    key=lambda r: (-r.priority, r.run_at, r.id),
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
                self._key_turns[pair] = next(self._turns)
                self._key_touched[pair] = now
                after = rate_after(slot.limits.rate, slot.next_start_at, now, n)
                if after is not None:
                    self._key_next_start[pair] = after
            next_start = self._key_next_start.get(pair)
            if next_start is not None and next_start > now and due_count > n:
                self._keys_wake_note(slot.queue, next_start)  # due tasks wait for the rate
        return picked

    def keys_wake_at(self, queues: Sequence[str], now: datetime) -> datetime | None:
        noted = [self._keys_wake[q] for q in queues if q in self._keys_wake]
        return min(noted) if noted else None

    async def key_stats(self, *, now: datetime, limit: int = 10) -> list[KeyStats]:
        with self._lock:
            counts: dict[tuple[str, str], list[int]] = {}
            for r in self.live.values():
                if r.partition_key is None:
                    continue
                c = counts.setdefault((r.queue, r.partition_key), [0, 0])
                if r.state is TaskState.PROCESSING:
                    c[1] += 1
                elif r.state in READY_STATES and r.run_at <= now:
                    c[0] += 1
            busiest = sorted(counts.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:limit]
            return [
                KeyStats(
                    q,
                    k,
                    w,
                    p,
                    next_at
                    if (next_at := self._key_next_start.get((q, k))) and next_at > now
                    else None,
                )
                for (q, k), (w, p) in busiest
                if w or p
            ]

    # -- key limits set at run time -----------------------------------------------------------

    async def key_override_set(self, override: KeyOverride) -> None:
        with self._lock:
            self._key_overrides[(override.queue, override.key)] = override

    async def key_override_clear(self, key: str, queue: str | None = None) -> bool:
        with self._lock:
            return self._key_overrides.pop((queue, key), None) is not None

    async def key_override_list(self) -> list[KeyOverride]:
        with self._lock:
            return sorted(self._key_overrides.values(), key=lambda o: (o.key, o.queue or ""))

    def queue_rate_set_sync(self, queue: str, rate: Rate) -> None:
        with self._lock:
            self._queue_rates[queue] = rate

    async def queue_rate_set(self, queue: str, rate: Rate) -> None:
        self.queue_rate_set_sync(queue, rate)

    def queue_rate_clear_sync(self, queue: str) -> bool:
        with self._lock:
            return self._queue_rates.pop(queue, None) is not None

    async def queue_rate_clear(self, queue: str) -> bool:
        return self.queue_rate_clear_sync(queue)

    async def queue_rates_stored(self) -> dict[str, Rate]:
        with self._lock:
            return dict(self._queue_rates)

    def _current(
        self, key: TaskKey, worker_id: str | None = None, expired_before: datetime | None = None
    ) -> TaskRow | None:
        row = self.live.get(key.id)
        if row is None or row.attempt != key.attempt or row.state is not TaskState.PROCESSING:
            return None
        if worker_id is not None and row.worker_id != worker_id:
            return None
        if expired_before is not None and not (
            row.lease_expires_at is not None and row.lease_expires_at < expired_before
        ):
            return None
        return row

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
        with self._lock:
            for outcome in outcomes:
                row = self._current(outcome.key, worker_id, expired_before)
                if row is None:
                    stale.append(outcome.key)
                    continue
                self._apply(row, outcome, now, archive_completed)
        return WriteResult(len(outcomes) - len(stale), tuple(stale))

    def _apply(self, row: TaskRow, outcome: Outcome, now: datetime, archive: bool) -> None:
        outcome = cancel_wins(outcome, row.cancel_requested_at is not None)
        kind = outcome.kind
        if kind.finishes:
            del self.live[row.id]
            if kind is not OutcomeKind.COMPLETE or archive or outcome.result is not None:
                self.archived[row.id] = row._replace(
                    state=TaskState(kind.value),
                    last_error=outcome.error or row.last_error,
                    lease_expires_at=None,
                    finished_at=now,
                    result=outcome.result,
                )
        elif kind is OutcomeKind.RETRY:
            assert outcome.run_at is not None
            self.live[row.id] = row._replace(
                state=TaskState.RETRYABLE,
                run_at=outcome.run_at,
                last_error=outcome.error,
                checkpoint=outcome.checkpoint or row.checkpoint,
                lease_expires_at=None,
                worker_id=None,
            )
        else:
            self.live[row.id] = row._replace(
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

    async def lease_extend_many(
        self,
        keys: Sequence[TaskKey],
        *,
        lease_until: datetime,
        worker_id: str | None = None,
        progress: Mapping[TaskKey, str] | None = None,
        left_out: set[TaskKey] | None = None,
        wait_locked: bool = False,
    ) -> int:
        count = 0  # no row locks here: `wait_locked` changes nothing
        with self._lock:
            for key in keys:
                row = self._current(key, worker_id)
                if row is not None:
                    report = progress.get(key, row.progress) if progress else row.progress
                    self.live[key.id] = row._replace(lease_expires_at=lease_until, progress=report)
                    count += 1
                elif left_out is not None:
                    left_out.add(key)
        return count

    # -- inspection ---------------------------------------------------------------------------

    async def live_count(
        self,
        queues: Sequence[str] | None,
        *,
        now: datetime,
        due_before: datetime,
        at_most: int | None = None,
    ) -> int:
        with self._lock:
            live = (
                r
                for r in self.live.values()
                if (queues is None or r.queue in queues)
                and (
                    (
                        r.state in READY_STATES
                        and r.run_at <= due_before
                        and r.queue not in self.paused
                    )
                    or (
                        r.state is TaskState.PROCESSING
                        and r.lease_expires_at is not None
                        and r.lease_expires_at > now
                    )
                )
            )
            return sum(1 for _ in itertools.islice(live, at_most))

    async def task_get(self, task_id: int) -> TaskRow | None:
        return self.task_get_sync(task_id)

    def task_get_sync(self, task_id: int) -> TaskRow | None:
        return self.live.get(task_id) or self.archived.get(task_id)

    async def queue_stats(self, *, now: datetime, archived: bool = True) -> list[QueueStats]:
        stats: dict[str, QueueStats] = {}
        oldest: dict[str, datetime] = {}
        ready: dict[str, int] = {}
        with self._lock:
            finished = self.archived.values() if archived else ()
            for row in itertools.chain(self.live.values(), finished):
                counts = stats.setdefault(row.queue, QueueStats(row.queue)).counts
                counts[row.state.value] = counts.get(row.state.value, 0) + 1
                if row.state in READY_STATES and row.run_at <= now:
                    oldest[row.queue] = min(oldest.get(row.queue, row.run_at), row.run_at)
                    ready[row.queue] = ready.get(row.queue, 0) + 1
            paused = dict(self.paused)
        return queue_stats_list(stats, oldest, paused, ready, now)

    async def queue_rates(self, *, now: datetime, window: float = 60.0) -> list[QueueRates]:
        since = now - timedelta(seconds=window)
        enqueued: dict[str, int] = {}
        finished: dict[str, dict[str, int]] = {}
        with self._lock:
            for row in itertools.chain(self.live.values(), self.archived.values()):
                done = row.finished_at is not None and row.finished_at > since
                if row.created_at > since:
                    enqueued[row.queue] = enqueued.get(row.queue, 0) + 1
                elif done:
                    enqueued.setdefault(row.queue, 0)
                if done:
                    counts = finished.setdefault(row.queue, {})
                    counts[row.state.value] = counts.get(row.state.value, 0) + 1
        return [QueueRates(q, window, enqueued[q], finished.get(q, {})) for q in sorted(enqueued)]

    # -- control ------------------------------------------------------------------------------

    def task_cancel_many_sync(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        with self._lock:
            if ids is None:
                assert where is not None
                ids = sorted(
                    r.id
                    for r in self.live.values()
                    if r.state.value in CANCELLABLE
                    and r.cancel_requested_at is None
                    and _matches(r, where)
                )[:limit]
            found = [self._cancel(task_id, now) for task_id in dict.fromkeys(ids)]
        live = [
            (f.id, f.state.value, f.queue, f.partition_key, f.cancel_requested_at)
            for f in found
            if f
        ]
        archived = {i: r.state.value for i, r in self.archived.items() if i in set(ids)}
        return cancels_of(list(dict.fromkeys(ids)), live, archived)

    def _cancel(self, task_id: int, now: datetime) -> TaskRow | None:
        """Cancel one live task; the row as it was found (None: not live, or staged)."""
        row = self.live.get(task_id)
        if row is None or row.state.value not in CANCELLABLE:
            return None
        if row.state in READY_STATES:
            del self.live[task_id]
            self.archived[task_id] = row._replace(state=TaskState.CANCELLED, finished_at=now)
        elif row.cancel_requested_at is None:
            self.live[task_id] = row._replace(cancel_requested_at=now)
        return row

    async def task_cancel_many(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        return self.task_cancel_many_sync(ids, where=where, now=now, limit=limit)

    async def cancel_requested_list(self, keys: Sequence[TaskKey]) -> list[TaskKey]:
        with self._lock:
            return [
                k
                for k in keys
                if (r := self.live.get(k.id)) is not None
                and r.attempt == k.attempt
                and r.cancel_requested_at is not None
            ]

    def queue_pause_sync(self, queue: str, *, now: datetime) -> datetime | None:
        with self._lock:
            earlier = self.paused.get(queue)
            self.paused.setdefault(queue, now)
            return earlier

    async def queue_pause(self, queue: str, *, now: datetime) -> datetime | None:
        return self.queue_pause_sync(queue, now=now)

    def queue_resume_sync(self, queue: str) -> bool:
        with self._lock:
            return self.paused.pop(queue, None) is not None

    async def queue_resume(self, queue: str) -> bool:
        return self.queue_resume_sync(queue)

    async def queue_paused_list(self) -> dict[str, datetime]:
        with self._lock:
            return dict(sorted(self.paused.items()))

    async def process_beat(self, process: ProcessRow, *, forget_before: datetime) -> None:
        with self._lock:
            started = self.beats.get(process.id)
            if started is not None:  # the row keeps when it was made
                process = replace(process, started_at=started.started_at)
            self.beats[process.id] = process
            for row in list(self.beats.values()):
                if row.expires_at < forget_before:
                    del self.beats[row.id]

    async def process_end(self, process_id: str) -> None:
        with self._lock:
            self.beats.pop(process_id, None)

    async def process_list(self) -> list[ProcessRow]:
        with self._lock:
            return sorted(self.beats.values(), key=lambda r: (r.kind, r.id))

    async def task_list(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        return self.task_list_sync(states=states, where=where, limit=limit)

    def task_list_sync(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        chosen = set(states) if states else set(LIVE_STATES)
        flt = where or TaskFilter()
        with self._lock:
            rows = [
                r
                for r in itertools.chain(self.live.values(), self.archived.values())
                if r.state in chosen and _matches(r, flt)
            ]
        return task_list_order(rows)[:limit]

    # -- dead letters -------------------------------------------------------------------------

    def _dead(self, ids: Sequence[int] | None, queue: str | None) -> list[TaskRow]:
        return [
            r
            for r in self.archived.values()
            if r.state is TaskState.DEAD
            and (ids is None or r.id in ids)
            and (queue is None or r.queue == queue)
        ]

    async def dead_list(self, *, queue: str | None = None, limit: int = 100) -> list[TaskRow]:
        with self._lock:
            rows = self._dead(None, queue)
        rows.sort(key=lambda r: (r.finished_at or datetime.min, r.id), reverse=True)
        return rows[:limit]

    async def dead_requeue(
        self, ids: Sequence[int] | None = None, *, queue: str | None = None, now: datetime
    ) -> list[int]:
        with self._lock:
            live_keys = {r.dedup_key for r in self.live.values() if r.dedup_key}
            dead = {r.id: r for r in self._dead(ids, queue)}
            picked = requeue_choice([(r.id, r.dedup_key) for r in dead.values()], live_keys)
            chosen = [dead[i] for i in picked]
            for row in chosen:
                del self.archived[row.id]
                self.live[row.id] = row._replace(
                    state=TaskState.PENDING,
                    attempt=0,
                    run_at=now,
                    finished_at=None,
                    worker_id=None,
                    lease_expires_at=None,
                    started_at=None,
                    cancel_requested_at=None,
                )
        return sorted(r.id for r in chosen)

    async def dead_purge(
        self, ids: Sequence[int] | None = None, *, queue: str | None = None
    ) -> int:
        with self._lock:
            chosen = self._dead(ids, queue)
            for row in chosen:
                del self.archived[row.id]
        return len(chosen)

    # -- the cleaner's sweeps -----------------------------------------------------------------

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list[TaskRow]:
        with self._lock:
            expired = [
                r
                for r in self.live.values()
                if r.state is TaskState.PROCESSING
                and r.lease_expires_at is not None
                and r.lease_expires_at < now
            ]
        expired.sort(key=lambda r: (r.lease_expires_at or now, r.id))
        return expired[:limit]

    async def ready_list(self, queue: str, *, due_before: datetime, limit: int) -> list[int]:
        with self._lock:
            ready = [
                r
                for r in self.live.values()
                if r.queue == queue and r.state in READY_STATES and r.run_at <= due_before
            ]
        ready.sort(key=lambda r: (-r.priority, r.run_at, r.id))
        return [r.id for r in ready[:limit]]

    async def finished_archive_many(self, *, now: datetime, limit: int) -> int:
        with self._lock:
            done = sorted(i for i, r in self.live.items() if r.state in FINISHED_STATES)[:limit]
            for task_id in done:
                row = self.live.pop(task_id)
                self.archived[task_id] = row._replace(lease_expires_at=None, finished_at=now)
        return len(done)

    async def keys_forget_many(self, *, idle_before: datetime, limit: int) -> int:
        with self._lock:
            live = {(r.queue, r.partition_key) for r in self.live.values() if r.partition_key}
            idle = [
                pair
                for pair, touched in sorted(self._key_touched.items())
                if touched < idle_before
                and pair not in live
                and self._key_next_start.get(pair, touched) < idle_before
            ][:limit]
            for pair in idle:
                for state in (self._key_touched, self._key_turns, self._key_next_start):
                    state.pop(pair, None)
        return len(idle)

    async def archive_purge_many(
        self,
        *,
        state: TaskState,
        before: datetime,
        limit: int,
        queues: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
    ) -> int:
        with self._lock:
            old = sorted(
                (
                    r
                    for r in self.archived.values()
                    if r.state is state
                    and r.finished_at is not None
                    and r.finished_at < before
                    and (queues is None or r.queue in queues)
                    and r.queue not in exclude
                ),
                key=lambda r: (r.finished_at or before, r.id),
            )[:limit]
            for row in old:
                del self.archived[row.id]
        return len(old)

    async def periodic_list(self) -> dict[str, PeriodicRow]:
        with self._lock:
            return dict(self.periodic)

    async def periodic_advance(
        self,
        name: str,
        *,
        schedule: str,
        expected: datetime | None,
        next_fire_at: datetime,
        fires: Sequence[NewTask],
        now: datetime,
    ) -> list[int] | None:
        with self._lock:
            stored = self.periodic.get(name)
            current = None if stored is None else stored.next_fire_at
            if current != expected:
                return None
            last = max((f.run_at for f in fires), default=None)
            self.periodic[name] = PeriodicRow(
                name=name,
                schedule=schedule,
                next_fire_at=next_fire_at,
                last_fire_at=last or (stored.last_fire_at if stored else None),
                updated_at=now,
            )
            return [self._insert(row) for row in fires]
