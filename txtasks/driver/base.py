"""The driver contract: the one small interface the core talks to.

A driver owns its connections and knows its SQL dialect; the worker, the CLI and the cleaner
only call these methods. Every method is a few statements at most, batched over many tasks.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from txtasks.control import TaskFilter
from txtasks.driver.history import HistoryRow
from txtasks.driver.timings import FinishedTimes
from txtasks.keys import KeyLimits, KeyOverride, Rate
from txtasks.types import (
    FINISHED_STATES,
    READY_STATES,
    Cancel,
    Delivery,
    KeyStats,
    NewPublish,
    NewTask,
    Outcome,
    PeriodicRow,
    ProcessRow,
    QueueRates,
    QueueStats,
    RunningTask,
    Subscription,
    TaskKey,
    TaskRow,
    TaskState,
    TopicStats,
)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the core asks these instead of checking dialect names."""

    name: str
    #: Several claimers can work at once without blocking each other (row locks, SKIP LOCKED).
    concurrent_claims: bool = True
    #: Reachable from other processes and hosts (not an in-process store).
    shared: bool = True
    #: A handler can complete its task in a transaction of its own on the database
    #: (`attempt_transaction`): a SQL database, not the in-memory store.
    transactions: bool = True
    #: Rows can be staged with the client's LOAD DATA LOCAL INFILE (MariaDB/MySQL): a Spark
    #: write's option `local_infile`.
    local_infile: bool = False


@dataclass(frozen=True)
class WriteResult:
    """How many outcomes a flush applied, and which were fenced off (a stale attempt)."""

    applied: int
    stale: tuple[TaskKey, ...] = ()


class AttemptFinish(Protocol):
    """What an attempt's transaction records when it commits (see `attempt_transaction`)."""

    def outcome(self) -> Outcome:
        """The outcome to write, asked for as the block ends."""
        ...

    def now(self) -> datetime:
        """The time written as its finish."""
        ...

    @property
    def archive_completed(self) -> bool:
        """Whether a completed task is kept in the archive (see `outcome_write_many`)."""
        ...


def queue_stats_list(
    counts: Mapping[str, QueueStats],
    oldest: Mapping[str, datetime],
    paused: Mapping[str, datetime],
    ready: Mapping[str, int],
    now: datetime,
) -> list[QueueStats]:
    """Each queue's stats, by name: its counts per state (`counts`), the age of its oldest
    ready task, when it was paused, its ready tasks; a paused queue without tasks included."""
    return [
        QueueStats(
            q,
            counts[q].counts if q in counts else {},
            (now - oldest[q]).total_seconds() if q in oldest else None,
            paused.get(q),
            ready.get(q, 0),
        )
        for q in sorted(set(counts) | set(paused))
    ]


def requeue_choice(dead: Iterable[tuple[int, str | None]], live_keys: set[str]) -> list[int]:
    """Which dead letters a requeue takes: every one, except that a dedup key held by a live
    task is skipped, and of several dead tasks sharing a key only the newest comes back."""
    newest: dict[str, int] = {}
    chosen = []
    for task_id, key in dead:
        if key is None:
            chosen.append(task_id)
        elif key not in live_keys:
            newest[key] = max(task_id, newest.get(key, task_id))
    return sorted(chosen + list(newest.values()))


#: The states of the hot table (live tasks) and of the archive, as the dashboard lists them.
LIVE = tuple(s.value for s in (TaskState.STAGED, *READY_STATES, TaskState.PROCESSING))
FINISHED = tuple(sorted(s.value for s in FINISHED_STATES))
#: Counts of the dashboard stop here: past it a page shows "at least" (counting a million rows
#: on every refresh would read them all).
COUNT_CAP = 1_000
#: Text in the error is looked for among this many tasks (matching the other filters) a page.
SEARCH_WINDOW = 5_000


@dataclass
class QueueDepth:
    """Live tasks of one queue: ready now, scheduled later, processing, dead letters."""

    queue: str
    ready: int = 0
    scheduled: int = 0
    processing: int = 0
    dead: int = 0
    #: When the task at the head of the claim order became due (None: none is due).
    oldest_ready: datetime | None = None
    #: True when a count stopped at its cap: there are at least that many.
    capped: bool = False


@dataclass(frozen=True)
class TaskPage:
    """One page of a task listing, and the cursor of the next one (None: the last page)."""

    rows: list[TaskRow]
    next_cursor: str | None


@dataclass(frozen=True)
class WorkerBusy:
    """The tasks one worker runs: the first few by start, and how many in all."""

    worker_id: str
    tasks: list[RunningTask]
    total: int


@dataclass(frozen=True)
class TaskQuery:
    """What the task listing shows: live tasks (`state` None or a live state) or finished ones
    of one state, filtered by queue, task, key, and text in the last error and in the payload
    (each looked for among a window of `SEARCH_WINDOW` tasks: `Dashboard.task_page`)."""

    state: str | None = None
    queue: str | None = None
    task_name: str | None = None
    key: str | None = None
    error: str | None = None
    payload: str | None = None

    @property
    def searching(self) -> bool:
        """Whether text is looked for (in the error or the payload)."""
        return bool(self.error or self.payload)

    def found(self, last_error: str | None, payload: bytes | None) -> bool:
        """Whether a task's error and payload hold the text looked for (case-insensitive;
        the payload's bytes as UTF-8)."""
        if self.error and self.error.lower() not in (last_error or "").lower():
            return False
        if self.payload:
            text = (payload or b"").decode("utf-8", "replace").lower()
            return self.payload.lower() in text
        return True

    @property
    def live(self) -> bool:
        return self.state is None or self.state in LIVE

    @property
    def where(self) -> TaskFilter:
        """The filters but the texts, which `Dashboard.task_page` looks for itself."""
        return TaskFilter(self.queue, self.task_name, self.key)


def task_cursor(row: Any, live: bool) -> str:
    """Where the page after `row` (a task, or a row with its id and finished_at) starts: its
    id (live tasks, newest first), or its finish time and id (finished ones)."""
    if live:
        return str(row.id)
    assert row.finished_at is not None
    return f"{row.finished_at.isoformat()}~{row.id}"


def finished_cursor(cursor: str) -> tuple[datetime, int]:
    """The finish time and id of a cursor of finished tasks; ValueError when it is not one."""
    at_text, _, id_text = cursor.partition("~")
    return datetime.fromisoformat(at_text), int(id_text)


def check_cursor(cursor: str | None, live: bool) -> str | None:
    """A cursor from a URL, or a ValueError saying what is wrong with it."""
    if not cursor:
        return None
    try:
        if live:
            int(cursor)
        else:
            finished_cursor(cursor)
    except ValueError:
        raise ValueError(f"cursor: not a cursor of this listing: {cursor!r}") from None
    return cursor


def minute_label(at: datetime) -> str:
    """The minute of a time as the per-minute counts label it ('YYYY-MM-DD HH:MM')."""
    return at.strftime("%Y-%m-%d %H:%M")


def minute_slots(now: datetime, minutes: int) -> tuple[datetime, dict[str, int]]:
    """The start of the first of the last `minutes` minutes, and each minute's slot by label
    (`minute_label`)."""
    start = (now - timedelta(minutes=minutes - 1)).replace(second=0, microsecond=0)
    labels = [minute_label(start + timedelta(minutes=i)) for i in range(minutes)]
    return start, {label: i for i, label in enumerate(labels)}


class Tasks(Protocol):
    """The application's tasks: writing them (an enqueue in a transaction of the driver's
    own), reading one or a list, and counting what is left to do."""

    async def task_insert_many(self, rows: Sequence[NewTask]) -> list[int]:
        """Insert in one transaction of the driver's own; a dedup hit returns the existing id."""

    def task_insert_many_sync(self, rows: Sequence[NewTask]) -> list[int]:
        """The same for synchronous callers."""

    async def task_get(self, task_id: int) -> TaskRow | None:
        """One task by id, live or archived: its state, attempts, last error, headers, and
        its `progress` and `result` (JSON text; see `TaskRow.progress_report`)."""

    def task_get_sync(self, task_id: int) -> TaskRow | None:
        """The same for synchronous callers."""

    async def task_list(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        """Up to `limit` tasks in `states` (default: the live ones) matching `where`: live ones
        newest first, then finished ones last finished first."""

    def task_list_sync(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        """The same for synchronous callers."""

    async def live_count(
        self,
        queues: Sequence[str] | None,
        *,
        now: datetime,
        due_before: datetime,
        at_most: int | None = None,
    ) -> int:
        """Tasks still to do: ready before `due_before` in a queue not paused, or processing
        under a valid lease. With `at_most`, counting stops there (whether any are left is
        `at_most=1`: the database stops at the first row it finds)."""


class Claims(Protocol):
    """The worker's loop: claims, leases, outcomes fenced on the attempt, cancels asked for,
    and an attempt's own transaction. The cleaner's rescue writes outcomes here too."""

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
        """Claim up to `limit` ready tasks: state processing, attempt + 1, leased to the worker.
        Tasks with a key are claimed within their key's limits (`keys`: those the application
        declares per queue, under the ones set at run time) and in turn (see txtasks.keys).
        A queue in `queue_rates` starts at most what its rate allows, with a key or without,
        across every claimer."""

    async def task_claim_ids(
        self,
        queues: Sequence[str],
        ids: Sequence[int],
        *,
        now: datetime,
        lease_until: datetime,
        worker_id: str,
    ) -> list[TaskRow]:
        """Claim the tasks `ids` (a wake-up named them) that a claim of `queues` without a key
        would take: ready, due, without a key, in one of `queues`, that queue not paused; each
        found by its primary key, in claim order. The others are left as they are (claimed
        by another worker, a key's, not due: a claim of the queues takes them in turn). Rates
        are the caller's to leave out: `queues` must not name a queue with a rate."""

    def keys_wake_at(self, queues: Sequence[str], now: datetime) -> datetime | None:
        """When a key that this driver's claims of `queues` put aside may start a task again
        (its rate's next start, its next delayed task): the earliest such time not yet looked
        at by a claim (it may be past `now`: claim at once), or None. Known from those claims:
        no database read. An idle worker claims again then."""

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
        """Push the leases of in-flight attempts forward (the heartbeat), fenced likewise,
        leaving out (not waiting for) rows another transaction has locked. Returns how many of
        `keys` are still this worker's attempts, extended or left out; the rest were lost.
        `progress` (JSON text by attempt) is stored on the rows extended, in the same
        transaction. `left_out`, when given, receives the keys not extended (left out or
        lost). `wait_locked`: wait for the rows another transaction holds instead (in line
        for their locks, so the extension comes first when that transaction ends without
        finishing them; an expired lease not taken by then is extended too). `lease_until`
        may be a callable, called once the rows are locked (a waiting extension's lease
        counts from when it gets them)."""

    async def cancel_requested_list(self, keys: Sequence[TaskKey]) -> list[TaskKey]:
        """Of the attempts `keys`, those whose cancel was asked for (a read by primary key)."""

    async def outcome_write_many(
        self,
        outcomes: Sequence[Outcome],
        *,
        now: datetime,
        archive_completed: bool = True,
        worker_id: str | None = None,
        expired_before: datetime | None = None,
    ) -> WriteResult:
        """Record outcomes, each fenced on (id, attempt, state = processing), on the worker
        holding the claim when `worker_id` is given, and on a lease expired before
        `expired_before` when that is given (the cleaner's rescue)."""

    def attempt_transaction(
        self, key: TaskKey, *, worker_id: str, finish: AttemptFinish
    ) -> AbstractAsyncContextManager[Any]:
        """A transaction on the database (an `AsyncConnection`) that locks the attempt `key`
        first, fenced on (id, attempt, processing, worker): `LeaseLost` and nothing written if
        it is no longer the worker's. When the block ends without an exception, the outcome
        `finish.outcome()` is written in the same transaction (as `outcome_write_many` writes
        it, keys armed alike), which then commits; an exception rolls everything back."""
        ...

    def attempt_transaction_sync(
        self, key: TaskKey, *, worker_id: str, finish: AttemptFinish
    ) -> AbstractContextManager[Any]:
        """The same on a sync `Connection`, for sync handlers (in the worker's threads)."""
        ...


class Topics(Protocol):
    """Topics: publishes, subscriptions, and what `txtasks topics` shows."""

    async def topic_publish_many(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        """Publish in one transaction of the driver's own: for each publish, one task per group
        subscribed to its topic (none for a group whose live delivery holds its dedup key), and
        a drop recorded when its topic has no subscriber. Returns each publish's new tasks."""

    def topic_publish_many_sync(self, publishes: Sequence[NewPublish]) -> list[list[Delivery]]:
        """The same for synchronous callers."""

    async def subscription_set_many(self, subs: Sequence[Subscription], *, now: datetime) -> None:
        """Create the subscriptions of (topic, group), or update their task, queue, priority
        and attempts; publishes from the commit on reach them."""

    async def subscription_delete_many(self, pairs: Sequence[tuple[str, str]]) -> int:
        """Delete the subscriptions (topic, group); how many there were. Tasks already
        delivered stay."""

    async def subscription_list(self, topics: Sequence[str] | None = None) -> list[Subscription]:
        """The subscriptions (of `topics`, or every one), by topic and group."""

    async def topic_stats(self) -> list[TopicStats]:
        """Every topic with a subscriber or a recorded drop: its groups, the live tasks of each
        group's task in its queue by state, and the drops kept."""

    async def topic_drops_forget_many(self, *, before: datetime, limit: int) -> int:
        """Delete up to `limit` recorded drops older than `before`."""


class Control(Protocol):
    """Control at run time (see docs/control.md): cancels, making a waiting task due now,
    paused queues, stored queue rates and key limits."""

    async def task_cancel_many(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        """Cancel the tasks `ids` (or up to `limit` live tasks matching `where` whose cancel
        is not asked for yet), in one transaction: a waiting task (pending, retryable) moves
        to the archive as cancelled, atomically with respect to claims, and its key is armed;
        a processing one is marked for its worker. What was done to each, in order."""

    def task_cancel_many_sync(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        """The same for synchronous callers."""

    async def task_run_now(self, task_id: int, *, now: datetime) -> str | None:
        """Make a waiting task (pending or retryable) due at `now`; its queue, or None when it
        is not waiting (any more). A task with a key leaves a key hint, so that claims look at
        its key now rather than when its next task was due."""

    async def queue_pause(self, queue: str, *, now: datetime) -> datetime | None:
        """Pause `queue`: claims take none of its tasks from the commit on. When it was paused
        already: since when (else None)."""

    def queue_pause_sync(self, queue: str, *, now: datetime) -> datetime | None:
        """The same for synchronous callers."""

    async def queue_resume(self, queue: str) -> bool:
        """Resume `queue`; False when it was not paused."""

    def queue_resume_sync(self, queue: str) -> bool:
        """The same for synchronous callers."""

    async def queue_paused_list(self) -> dict[str, datetime]:
        """The paused queues, by name, with when each was paused."""

    async def queue_rate_set(self, queue: str, rate: Rate) -> None:
        """Store a rate for `queue` as a whole, over the one the application declares."""

    def queue_rate_set_sync(self, queue: str, rate: Rate) -> None:
        """The same for synchronous callers."""

    async def queue_rate_clear(self, queue: str) -> bool:
        """Remove a queue's stored rate; False when there was none."""

    def queue_rate_clear_sync(self, queue: str) -> bool:
        """The same for synchronous callers."""

    async def queue_rates_stored(self) -> dict[str, Rate]:
        """Every queue's stored rate."""

    async def key_override_set(self, override: KeyOverride) -> None:
        """Store limits for one key (in one queue, or every queue), over the declared ones."""

    async def key_override_clear(self, key: str, queue: str | None = None) -> bool:
        """Remove stored limits; False when there were none."""

    async def key_override_list(self) -> list[KeyOverride]:
        """Every stored key limit, by key."""


class Admin(Protocol):
    """Inspection and dead letters: what `txtasks status`, `txtasks dlq` and the cleaner's
    statistics read."""

    async def queue_stats(self, *, now: datetime, archived: bool = True) -> list[QueueStats]:
        """Counts per queue and state (of live tasks only unless `archived`), the age of the
        oldest ready task, and the count of ready tasks due at `now`."""

    async def queue_rates(self, *, now: datetime, window: float = 60.0) -> list[QueueRates]:
        """Per queue: tasks enqueued and tasks finished (archived, by final state) in the
        `window` seconds before `now`; queues with neither are left out. Each statement reads
        an index: the live tasks enqueued since, the archived tasks finished since."""

    async def key_stats(self, *, now: datetime, limit: int = 10) -> list[KeyStats]:
        """The keys with the most tasks waiting (due) or processing, busiest first."""

    async def dead_list(self, *, queue: str | None = None, limit: int = 100) -> list[TaskRow]:
        """Dead-lettered tasks, newest first."""

    async def dead_requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        now: datetime,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> list[int]:
        """Move dead-lettered tasks (or finished tasks in one of `states`) back to pending
        with a fresh attempt budget, in one transaction.

        A task whose dedup key is live again stays dead; see `requeue_choice`.
        """

    async def dead_purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> int:
        """Delete dead-lettered tasks (or finished tasks in one of `states`) for good."""


class Sweeps(Protocol):
    """The cleaner's sweeps: expired leases, overlooked ready tasks, the archive and
    retention, periodic schedules, the queues' history."""

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list[TaskRow]:
        """Processing tasks whose lease ran out before `now`, oldest lease first."""

    async def ready_list(self, queue: str, *, due_before: datetime, limit: int) -> list[int]:
        """Ids of ready tasks of `queue` due at or before `due_before`, in claim order."""

    async def finished_archive_many(self, *, now: datetime, limit: int) -> int:
        """Move up to `limit` rows in a finished state from the hot table to the archive."""

    async def archive_purge_many(
        self,
        *,
        state: TaskState,
        before: datetime,
        limit: int,
        queues: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
    ) -> int:
        """Delete up to `limit` archived rows in `state` finished before `before`, of `queues`
        (None: any) except those in `exclude`."""

    async def keys_forget_many(self, *, idle_before: datetime, limit: int) -> int:
        """Delete up to `limit` rows of keys idle since before `idle_before`: no task of the
        key in the hot table, nothing armed, no rate start after `idle_before`, and no claim
        holding the row. A key that gets a task again is created anew by its hint."""

    async def history_last(self) -> int | None:
        """The last minute of the history written (its number), None when none is."""

    async def history_count(self, *, since: datetime, until: datetime) -> list[HistoryRow]:
        """The tasks enqueued and finished per queue in each minute from `since` up to
        `until` (whole minutes, `until` excluded), as the dashboard's last hour counts them;
        a (minute, queue) without any is left out."""

    async def history_write(self, rows: Sequence[HistoryRow]) -> None:
        """Write rows of the history, each only where no row of its minute and queue is (one
        written by another cleaner, or before, stays as it is)."""

    async def history_purge(self, *, before: int) -> int:
        """Delete the history's minutes before minute `before`; how many rows."""

    async def periodic_list(self) -> dict[str, PeriodicRow]:
        """Every stored periodic schedule by name."""

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
        """In one transaction: move schedule `name` from next fire time `expected` (None: not
        stored yet) to `next_fire_at` and insert `fires`. Returns their ids, or None when
        another cleaner moved the schedule first (then nothing is written)."""


class Processes(Protocol):
    """Heartbeat rows of workers and cleaners."""

    async def process_beat(self, process: ProcessRow, *, forget_before: datetime) -> None:
        """Write the heartbeat row of a worker or cleaner (made at its first beat), and delete
        the rows of processes that stopped beating before `forget_before`."""

    async def process_end(self, process_id: str) -> None:
        """Delete the row of a process that stops (none: nothing happens)."""

    async def process_list(self) -> list[ProcessRow]:
        """Every heartbeat row, by kind and id, those expired included."""


class Dashboard(Protocol):
    """What the dashboard reads, each along an index so that a page stays fast on a table of
    millions of rows: queue depths, busy keys, tasks finished and enqueued per minute (and the
    queues' history over longer ranges), pages of tasks by keyset (and searches of a window of
    them), the tasks each worker runs, the times of tasks finished lately."""

    async def depths(self, *, now: datetime, cap: int = COUNT_CAP) -> dict[str, QueueDepth]:
        """Per queue with ready, processing or dead tasks: ready tasks due at `now` and
        scheduled later (each up to `cap`), when the head of its claim order became due,
        processing tasks and dead letters (up to `cap`)."""

    async def busy_keys(
        self, *, now: datetime, limit: int = 20, cap: int = COUNT_CAP
    ) -> list[KeyStats]:
        """Up to `limit` keys with tasks waiting, soonest first, with their tasks waiting and
        processing (each up to `cap`) and when their rate lets the next one start."""

    async def finished_per_minute(
        self, *, now: datetime, minutes: int = 60
    ) -> dict[str, dict[str, list[int]]]:
        """Per queue and final state, the tasks finished in each of the last `minutes` minutes
        (oldest first)."""

    async def arrived_per_minute(self, *, now: datetime, minutes: int = 60) -> dict[str, list[int]]:
        """Per queue, the tasks enqueued in each of the last `minutes` minutes (oldest first),
        live or finished since."""

    async def task_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        """A page of tasks matching `query` after `cursor` (`task_cursor`): live ones newest
        first, finished ones last finished first. Text in the error or the payload is looked
        for among the next `SEARCH_WINDOW` tasks matching the rest (case-insensitive; the
        payload's bytes as UTF-8): a page may then hold fewer tasks than `limit` and still have
        a next one."""

    async def finished_times(self, *, since: datetime, limit: int) -> list[FinishedTimes]:
        """The times of the last `limit` tasks finished since `since` in each of the states
        `TIMED_STATES` (at most `limit` rows of each read, along the archive's index of state
        and finish time), last finished first."""

    async def history_buckets(
        self, *, first: int, last: int, minutes: int
    ) -> dict[str, dict[str, list[int]]]:
        """Per queue and series (`HISTORY_SERIES`), the history's sums over buckets of
        `minutes` minutes from minute `first` up to `last` (minute numbers, `last` excluded;
        `first` a multiple of `minutes`), oldest first; a queue with nothing written is left
        out."""

    async def running_by_worker(self, *, per_worker: int) -> dict[str, WorkerBusy]:
        """The processing tasks by worker id: the first `per_worker` each worker started (in
        the order it started them) and how many it runs; along the lease index, which holds
        the tasks running now (as many as the workers' slots), not the table."""


class Driver(Protocol):
    """Storage for tasks: a database handle's life (open, migrate, ping, close) and the roles
    its callers use, each an object of its own sharing that handle. Implementations: the SQL
    drivers per dialect, and the in-memory driver.

    Who uses which role: the application `tasks` and `topics` (and `control` through
    `app.control`); the worker `claims`, `processes`, `control.queue_rates_stored` and
    `tasks.live_count`; the cleaner `sweeps`, `processes`, `claims.outcome_write_many`
    (rescues) and `admin` (statistics); the CLI `admin`, `control`, `topics`; the dashboard
    `dashboard` and those of the CLI.
    """

    @property
    def capabilities(self) -> Capabilities:
        """What this store can do (a SQL driver's: its dialect's)."""
        ...

    async def open(self) -> None:
        """Connect and check that the schema is migrated."""

    async def close(self) -> None:
        """Release every connection."""

    async def migrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied."""

    async def ping(self) -> None:
        """One cheap round trip to the database (readiness probes); raises if it fails."""

    @property
    def tasks(self) -> Tasks:
        """Enqueue, read and list tasks; count what is left to do."""
        ...

    @property
    def claims(self) -> Claims:
        """Claims, leases, fenced outcomes, an attempt's transaction."""
        ...

    @property
    def topics(self) -> Topics:
        """Publishes and subscriptions."""
        ...

    @property
    def control(self) -> Control:
        """Cancels, paused queues, stored queue rates and key limits."""
        ...

    @property
    def admin(self) -> Admin:
        """Statistics and dead letters."""
        ...

    @property
    def sweeps(self) -> Sweeps:
        """Expired leases, overlooked tasks, the archive, periodic schedules."""
        ...

    @property
    def processes(self) -> Processes:
        """Heartbeat rows of workers and cleaners."""
        ...

    @property
    def dashboard(self) -> Dashboard:
        """The dashboard's reads."""
        ...


#: Each role's protocol, by the name of the driver's attribute that holds it.
ROLES: dict[str, type] = {
    "tasks": Tasks,
    "claims": Claims,
    "topics": Topics,
    "control": Control,
    "admin": Admin,
    "sweeps": Sweeps,
    "processes": Processes,
    "dashboard": Dashboard,
}
#: The role of each method of the contract.
ROLE_OF: dict[str, str] = {
    name: role
    for role, protocol in ROLES.items()
    for name in vars(protocol)
    if not name.startswith("_") and callable(getattr(protocol, name))
}


def moved_to_role(driver: object, name: str) -> Any:
    """`driver.<name>` of a contract method, from before the contract was split into roles:
    the role's method, with a DeprecationWarning (a driver's `__getattr__`)."""
    role = ROLE_OF.get(name)
    if role is None:
        raise AttributeError(f"{type(driver).__name__!r} object has no attribute {name!r}")
    warnings.warn(
        f"driver.{name} is deprecated; use driver.{role}.{name}", DeprecationWarning, stacklevel=3
    )
    return getattr(getattr(driver, role), name)
