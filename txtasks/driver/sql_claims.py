"""Claims, leases and outcomes on a SQL database: the `Claims` role of `SqlDriver`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    Result,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.control import cancel_wins
from txtasks.driver.base import (
    AttemptFinish,
    WriteResult,
)
from txtasks.driver.database import SqlDatabase
from txtasks.driver.insert_plan import Statement, plan_run_async, plan_run_sync
from txtasks.driver.sql_lanes import SqlLanes
from txtasks.driver.statements.control import override_of
from txtasks.driver.statements.keys import KeysLook
from txtasks.driver.statements.outcomes import keys_param
from txtasks.errors import LeaseLost
from txtasks.keys import (
    NEXT_DUE,
    NO_LIMITS,
    KeyLimits,
    KeySlot,
    Rate,
    fetch_cap,
    limits_for,
    rate_after,
    rate_allowance,
    round_robin,
)
from txtasks.schema.tables import PROCESSING
from txtasks.types import (
    Outcome,
    OutcomeKind,
    TaskKey,
    TaskRow,
    claim_order,
)

#: How often a claim looks for tasks with a key in queues the application declared no key
#: limits for (tasks enqueued with `key=` by another application, the CLI or Spark).
KEYS_PROBE_EVERY = timedelta(seconds=1)


#: Transactions a claim of the keys' lane takes at most (see `keyed_claim`).
KEY_ROUNDS = 3


def lease_lost(key: TaskKey) -> LeaseLost:
    return LeaseLost(
        f"task {key.id} attempt {key.attempt} is no longer this worker's (its lease ran out, "
        "or it already completed): its transaction was rolled back"
    )


@dataclass(frozen=True)
class Claim:
    """One claim's parameters, shared by its lanes."""

    queues: list[str]
    now: datetime
    lease_until: datetime
    worker_id: str

    def params(self, **more: Any) -> dict[str, Any]:
        return {
            "queues": self.queues,
            "now": self.now,
            "lease_until": self.lease_until,
            "worker_id": self.worker_id,
            **more,
        }


class SqlClaims:
    """The worker's loop on a SQL database: claims in two lanes (tasks with a key and without),
    leases, outcomes fenced on the attempt, and an attempt's own transaction."""

    #: How this database runs the claim's statements (see sql_lanes.py).
    lanes_class: ClassVar[type[SqlLanes]] = SqlLanes

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self.lanes = self.lanes_class(db)
        #: Which lane the next claim starts with, and when each set of queues is next probed
        #: for tasks with a key (see `task_claim_many`).
        self._keys_first = False
        self._keys_probe_at: dict[tuple[str, ...], datetime] = {}
        #: Per queue: the earliest future look at a key its claims wrote (`keys_wake_at`).
        self._keys_wake: dict[str, datetime] = {}
        #: Queues whose rate row exists (`rated_claim`).
        self._rate_rows: set[str] = set()

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
        """Two lanes: tasks without a key (one statement), and tasks with one, claimed by their
        keys' limits and in turn (`txtasks.keys`); which goes first alternates between claims.
        The keys' lane runs on every claim of a queue in `keys` (the limits the application
        declares), and on the others at most once per `KEYS_PROBE_EVERY` until it finds work.
        A queue with a rate of its own is claimed on its own (`rated_claim`)."""
        claim = Claim(list(queues), now, lease_until, worker_id)
        for queue in claim.queues:
            if self._keys_wake.get(queue, now) <= now:
                self._keys_wake.pop(queue, None)  # this claim looks at that queue
        self._keys_first = not self._keys_first
        rows: list[TaskRow] = []
        rates = queue_rates or {}
        rated = [q for q in claim.queues if q in rates]
        for queue in rated:
            if len(rows) < limit:
                one = replace(claim, queues=[queue])
                rows += await self.rated_claim(one, limit - len(rows), rates[queue], keys)
        if rated:
            claim = replace(claim, queues=[q for q in claim.queues if q not in rated])
        if claim.queues:
            rows += await self._lanes_claim(claim, limit - len(rows), keys)
        rows.sort(key=claim_order)
        return rows

    async def _lanes_claim(
        self, claim: Claim, limit: int, keys: Mapping[str, KeyLimits] | None
    ) -> list[TaskRow]:
        async def keyed(left: int) -> list[TaskRow]:
            found = await self.keyed_claim(claim, left, keys or {})
            self._keyed_found(claim.queues, bool(found), claim.now)
            return found

        plain = functools.partial(self.plain_claim, claim)
        due = self._keyed_lane_due(claim.queues, keys, claim.now)
        return await self._in_turn(limit, plain, keyed if due else None)

    async def _in_turn(
        self,
        limit: int,
        plain: Callable[[int], Awaitable[list[TaskRow]]],
        keyed: Callable[[int], Awaitable[list[TaskRow]]] | None,
    ) -> list[TaskRow]:
        """Up to `limit` tasks from the two lanes (`keyed` None: its lane is not due), each
        given what the other left; which goes first alternates between claims."""
        rows: list[TaskRow] = []
        for lane in (keyed, plain) if self._keys_first else (plain, keyed):
            if lane is not None and len(rows) < limit:
                rows += await lane(limit - len(rows))
        return rows

    async def rated_claim(
        self, claim: Claim, limit: int, rate: Rate, keys: Mapping[str, KeyLimits] | None
    ) -> list[TaskRow]:
        """Claim from one queue with a rate of its own: in one transaction, lock the queue's
        row (the key ''; a claim that finds it held by another claim takes nothing from the
        queue this time), take at most what the rate allows now from both lanes, and write
        the rate's next start back."""
        [queue] = claim.queues
        if queue not in self._rate_rows:
            await self._rate_row_make(queue, claim.now)
        keyed = self._keyed_lane_due(claim.queues, keys, claim.now)
        if keyed:
            await self._hints_take(claim)

        async def work(conn: AsyncConnection) -> list[TaskRow]:
            lock = {"queue": queue}
            held = (await conn.execute(self.db.sql.keys.stmt_queue_rate_lock(), lock)).first()
            if held is None:  # another claim of the queue holds it (or it is gone: made anew)
                self._rate_rows.discard(queue)
                return []
            allowed = min(limit, rate_allowance(rate, held.next_start_at, claim.now))

            async def plain(left: int) -> list[TaskRow]:
                return await self.lanes.claim(conn, claim.params(limit=left))

            async def with_keys(left: int) -> list[TaskRow]:
                return (await self._keyed_claim_on(conn, claim, left, keys or {}))[0]

            rows = await self._in_turn(allowed, plain, with_keys if keyed else None)
            next_start = rate_after(rate, held.next_start_at, claim.now, len(rows))
            settle = {"b_id": held.id, "b_ready_at": None, "b_next_start_at": next_start}
            await self.lanes.keys_settle(conn, [{**settle, "now": claim.now}])
            if len(rows) == allowed and next_start is not None:  # more may wait for the rate
                self._keys_wake_note([(queue, next_start)], claim.now)
            return rows

        return await self.db.in_transaction(work)

    async def _rate_row_make(self, queue: str, now: datetime) -> None:
        """The row that holds a queue's rate (the key ''): made if missing, once a process."""
        row = {"queue": queue, "partition_key": "", "ready_at": None, "now": now}

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                self.db.sql.keys.stmt_keys_arm(), [row]
            )  # never arms it: no look due

        await self.db.in_transaction(work)
        self._rate_rows.add(queue)

    async def task_claim_ids(
        self,
        queues: Sequence[str],
        ids: Sequence[int],
        *,
        now: datetime,
        lease_until: datetime,
        worker_id: str,
    ) -> list[TaskRow]:
        """Those of the tasks `ids` a claim of `queues` without a key would take, each found
        by its primary key, in one statement (MySQL: the rows locked, then marked)."""
        if not ids or not queues:
            return []
        claim = Claim(list(queues), now, lease_until, worker_id)
        rows = await self.named_claim(claim, list(dict.fromkeys(ids)))
        rows.sort(key=claim_order)
        return rows

    async def named_claim(self, claim: Claim, ids: list[int]) -> list[TaskRow]:
        async def work(conn: AsyncConnection) -> list[TaskRow]:
            return await self.lanes.claim_named(conn, claim.params(ids=ids, limit=len(ids)))

        return await self.db.in_transaction(work)

    async def plain_claim(self, claim: Claim, limit: int) -> list[TaskRow]:
        """Claim up to `limit` ready tasks without a key, in claim order."""

        async def work(conn: AsyncConnection) -> list[TaskRow]:
            return await self.lanes.claim(conn, claim.params(limit=limit))

        return await self.db.in_transaction(work)

    def keys_wake_at(self, queues: Sequence[str], now: datetime) -> datetime | None:
        noted = [self._keys_wake[q] for q in queues if q in self._keys_wake]
        return min(noted) if noted else None

    def _keys_wake_note(self, looks: Iterable[tuple[str, Any]], now: datetime) -> None:
        """Keep, per queue, the earliest future look among `looks` (queue, look) and the one
        noted before."""
        for queue, when in looks:
            if isinstance(when, datetime) and when > now:
                noted = self._keys_wake.get(queue)
                self._keys_wake[queue] = when if noted is None else min(noted, when)

    def _keyed_lane_due(
        self, queues: list[str], declared: Mapping[str, KeyLimits] | None, now: datetime
    ) -> bool:
        if declared and any(q in declared for q in queues):
            return True
        return now >= self._keys_probe_at.get(tuple(queues), now)

    def _keyed_found(self, queues: list[str], found: bool, now: datetime) -> None:
        self._keys_probe_at[tuple(queues)] = now if found else now + KEYS_PROBE_EVERY

    async def keyed_claim(
        self, claim: Claim, limit: int, declared: Mapping[str, KeyLimits]
    ) -> list[TaskRow]:
        """Claim up to `limit` tasks with a key: first turn the hints into armed keys (a
        transaction of its own), then lock the keys that waited longest and take their tasks
        in turn within their limits, in one transaction. Keys armed with nothing left to
        start (a hint outlived its task) are put aside on the way: another round follows while
        the claim is short and every key it locked was taken."""
        await self._hints_take(claim)
        rows: list[TaskRow] = []
        for _ in range(KEY_ROUNDS):

            async def work(
                conn: AsyncConnection, left: int = limit - len(rows)
            ) -> tuple[list[TaskRow], bool]:
                return await self._keyed_claim_on(conn, claim, left, declared)

            found, more = await self.db.in_transaction(work)
            rows += found
            if not more or len(rows) >= limit:
                break
        return rows

    async def _hints_take(self, claim: Claim) -> None:
        async def work(conn: AsyncConnection) -> None:
            await self.lanes.hints_take(conn, claim.queues, claim.now)

        await self.db.in_transaction(work)

    async def _keyed_claim_on(
        self, conn: AsyncConnection, claim: Claim, limit: int, declared: Mapping[str, KeyLimits]
    ) -> tuple[list[TaskRow], bool]:
        """The tasks claimed, and whether more keys may be armed (as many locked as asked)."""
        now = claim.now
        lock = {"queues": claim.queues, "now": now, "limit": limit}
        held, stored = await self.lanes.keys_lock(conn, lock)
        if not held:
            return [], False
        if stored:
            overrides = {(o.queue, o.key): o for o in map(override_of, stored)}
            slots = [
                KeySlot(h.queue, h.partition_key, limits_for(h.queue, h.partition_key, declared, overrides), 0, h.next_start_at)
                for h in held
            ]  # fmt: skip
        else:  # no limits stored for these keys: each has its queue's
            slots = [
                KeySlot(h.queue, h.partition_key, declared.get(h.queue, NO_LIMITS), 0, h.next_start_at)
                for h in held
            ]  # fmt: skip
        key_ids = {(h.queue, h.partition_key): h.id for h in held}
        look = await self._keys_look(conn, slots, key_ids, limit, now)
        for s in slots:
            s.running = look.running.get((s.queue, s.key), 0)
        heads = look.heads
        wants = [s.want(now) for s in slots]
        cap = fetch_cap(wants, limit)
        asks = [min(w, cap) for w in wants]
        found = self._keys_found(slots, asks, look, now)
        given = round_robin([min(len(f), a) for f, a in zip(found, asks, strict=True)], limit)
        ids = [i for f, n in zip(found, given, strict=True) for i in f[:n]]
        rows = await self.lanes.claim_ids(conn, claim.params(ids=ids)) if ids else []
        took: dict[tuple[str, str], int] = {}
        for row in rows:
            pair = (row.queue, row.partition_key or "")
            took[pair] = took.get(pair, 0) + 1
        looks = await self._keys_settle(conn, held, slots, asks, found, took, heads, now)
        self._keys_wake_note(zip([s.queue for s in slots], looks, strict=True), now)
        return rows, len(held) == limit

    async def _keys_look(
        self,
        conn: AsyncConnection,
        slots: list[KeySlot],
        ids: Mapping[tuple[str, str], int],
        limit: int,
        now: datetime,
    ) -> KeysLook:
        """What the held keys have, read after their rows were locked: the running counts of
        keys with a slot limit, the heads of ordered keys, and the due tasks of the others.
        The due tasks are asked for before the running counts are known, as if nothing ran:
        each key at most its limits allow, and one more (more are due)."""
        unknown = [s.want(now) for s in slots]  # as if nothing ran
        cap = fetch_cap(unknown, limit)
        return await self.lanes.keys_look(
            conn,
            counted=[(s.queue, s.key) for s in slots if s.limits.slots is not None],
            ordered=[(s.queue, s.key) for s in slots if s.limits.ordered],
            asked=[
                (s.queue, s.key, min(w, cap) + 1)
                for s, w in zip(slots, unknown, strict=True)
                if w > 0 and not s.limits.ordered
            ],
            key_ids=ids,
            now=now,
        )

    @staticmethod
    def _keys_found(
        slots: list[KeySlot], asks: list[int], look: KeysLook, now: datetime
    ) -> list[list[int]]:
        """The due tasks each key may start, in claim order: an ordered key its head, when it
        is ready and due; another key up to its ask, and one more if there is (more are due)."""
        found: list[list[int]] = [[] for _ in slots]
        for i, (s, ask) in enumerate(zip(slots, asks, strict=True)):
            if ask <= 0:
                continue
            if s.limits.ordered:
                head = look.heads.get((s.queue, s.key))
                if head is not None and head.state != PROCESSING and head.run_at <= now:
                    found[i] = [head.id]
            else:
                found[i] = look.due.get((s.queue, s.key), [])[: ask + 1]
        return found

    async def _keys_settle(
        self,
        conn: AsyncConnection,
        held: Sequence[Any],
        slots: list[KeySlot],
        asks: list[int],
        found: list[list[int]],
        took: Mapping[tuple[str, str], int],
        heads: Mapping[tuple[str, str], Any],
        now: datetime,
    ) -> list[datetime | None]:
        """Write when to look at each key again, and its rate's next start; those looks."""
        settled = []
        for h, s, ask, f in zip(held, slots, asks, found, strict=True):
            ready_at, next_start = s.settle(
                now, asked=ask, found=len(f), took=took.get((s.queue, s.key), 0)
            )
            settled.append([h.id, s, ready_at, next_start])
        later = [x[1] for x in settled if x[2] == NEXT_DUE]
        if later:
            due = await self._keys_next_due(conn, later, heads)
            for x in settled:
                if x[2] == NEXT_DUE:
                    x[2] = due.get((x[1].queue, x[1].key))
        params = [
            {"b_id": key_id, "b_ready_at": ready_at, "b_next_start_at": next_start, "now": now}
            for key_id, s, ready_at, next_start in settled
            if not self.lanes.keys_lock_clears
            or ready_at is not None
            or next_start != s.next_start_at
        ]
        if params:
            await self.lanes.keys_settle(conn, params)
        return [ready_at for _id, _s, ready_at, _next in settled]

    async def _keys_next_due(
        self,
        conn: AsyncConnection,
        slots: list[KeySlot],
        heads: Mapping[tuple[str, str], Any],
    ) -> dict[tuple[str, str], datetime]:
        """When each key's next task is due: an ordered key's head (if it waits), another
        key's earliest ready task."""
        due: dict[tuple[str, str], datetime] = {}
        for s in slots:
            head = heads.get((s.queue, s.key))
            if s.limits.ordered and head is not None and head.state != PROCESSING:
                due[(s.queue, s.key)] = head.run_at
        others = sorted({s.key for s in slots if not s.limits.ordered})
        if others:
            result = await conn.execute(self.db.sql.keys.stmt_keys_next_due(), {"names": others})
            wanted = {(s.queue, s.key) for s in slots}
            for queue, key, when in result:
                if (queue, key) in wanted:
                    due[(queue, key)] = when
        return due

    async def outcome_write_many(
        self,
        outcomes: Sequence[Outcome],
        *,
        now: datetime,
        archive_completed: bool = True,
        worker_id: str | None = None,
        expired_before: datetime | None = None,
    ) -> WriteResult:
        if not outcomes:
            return WriteResult(0)
        fence = {"fence_worker": worker_id, "fence_expired": expired_before}

        async def work(conn: AsyncConnection) -> set[TaskKey]:
            return await self._outcomes_apply(conn, outcomes, now, archive_completed, fence)

        applied = await self.db.in_transaction(work)
        stale = tuple(o.key for o in outcomes if o.key not in applied)
        return WriteResult(len(outcomes) - len(stale), stale)

    async def _outcomes_apply(
        self,
        conn: AsyncConnection,
        outcomes: Sequence[Outcome],
        now: datetime,
        archive_completed: bool,
        fence: Mapping[str, Any],
    ) -> set[TaskKey]:
        """`outcomes_plan` on `conn`, inside its transaction: the attempts it wrote."""
        return await plan_run_async(
            conn, self.outcomes_plan(outcomes, now, archive_completed, fence)
        )

    def outcomes_plan(
        self,
        outcomes: Sequence[Outcome],
        now: datetime,
        archive_completed: bool,
        fence: Mapping[str, Any],
    ) -> Generator[Statement, Result[Any], set[TaskKey]]:
        """Lock the still-current attempts once, in id order, then write what applies to them;
        the attempts written. A plan (txtasks.driver.insert_plan): the same statements run on
        the worker's async connections and on a sync handler's transaction.

        `fence` holds the `keys_match` parameters other than the keys.
        """
        held = yield from self.attempts_lock_plan([o.key for o in outcomes], fence)
        mine = [cancel_wins(o, held[o.key][2]) for o in outcomes if o.key in held]
        woken = sorted({(q, k) for q, k, _c in (held[o.key] for o in mine) if k is not None})
        finishing = [o for o in mine if o.kind.finishes]
        if finishing:
            yield from self._finish_plan(finishing, now, archive_completed)
        retries = [o for o in mine if o.kind is OutcomeKind.RETRY]
        if retries:
            yield self.db.sql.outcomes.stmt_retry(), self._retry_params(retries)
        releases = [o.key for o in mine if o.kind is OutcomeKind.RELEASE]
        if releases:
            yield self.db.sql.outcomes.stmt_release(), {**keys_param(releases), **fence}
        if woken:  # a slot freed, a head moved on or retried: the claims look at the keys again
            yield from self.db.sql.keys.keys_wake_plan(woken, now)
        return {o.key for o in mine}

    def attempts_lock_plan(
        self, keys: Sequence[TaskKey], fence: Mapping[str, Any]
    ) -> Generator[Statement, Result[Any], dict[TaskKey, tuple[str, str | None, bool]]]:
        """Lock the rows of still-current attempts (in id order): their queues and keys, and
        whether a cancel was asked for."""
        params = {**keys_param(keys), **fence}
        locked: list[Any] = list((yield self.db.sql.outcomes.stmt_lock_keys(), params))
        return {TaskKey(row[0], row[1]): (row[2], row[3], row[4] is not None) for row in locked}

    @contextlib.asynccontextmanager
    async def attempt_transaction(
        self, key: TaskKey, *, worker_id: str, finish: AttemptFinish
    ) -> AsyncIterator[AsyncConnection]:
        """Not bounded by the command timeout as a whole (the handler decides what it does in
        it); each statement still is, by the server's settings."""
        fence = {"fence_worker": worker_id, "fence_expired": None}
        async with self.db.attempt_slot(), self.db.connect(bounded=False) as conn, conn.begin():
            if not await plan_run_async(conn, self.attempts_lock_plan([key], fence)):
                raise lease_lost(key)
            yield conn
            plan = self.outcomes_plan(
                [finish.outcome()], finish.now(), finish.archive_completed, fence
            )
            if not await plan_run_async(conn, plan):  # the row is locked: cannot happen
                raise lease_lost(key)

    @contextlib.contextmanager
    def attempt_transaction_sync(
        self, key: TaskKey, *, worker_id: str, finish: AttemptFinish
    ) -> Iterator[Connection]:
        fence = {"fence_worker": worker_id, "fence_expired": None}
        with self.db.attempt_slot_sync(), self.db.sync_engine.connect() as conn, conn.begin():
            if not plan_run_sync(conn, self.attempts_lock_plan([key], fence)):
                raise lease_lost(key)
            yield conn
            plan = self.outcomes_plan(
                [finish.outcome()], finish.now(), finish.archive_completed, fence
            )
            if not plan_run_sync(conn, plan):
                raise lease_lost(key)

    def _finish_plan(
        self, outcomes: Sequence[Outcome], now: datetime, archive_completed: bool
    ) -> Generator[Statement, Result[Any], None]:
        """Move finished attempts (rows locked by the plan) to the archive; a completed one
        without `archive_completed` only when it keeps its result."""
        for kind in {o.kind for o in outcomes}:
            ids = sorted(
                o.key.id
                for o in outcomes
                if o.kind is kind
                and (kind is not OutcomeKind.COMPLETE or archive_completed or o.result is not None)
            )
            if ids:
                yield (
                    self.db.sql.outcomes.stmt_archive_copy(),
                    {"ids": ids, "state": kind.value, "now": now},
                )
        errors = [{"b_id": o.key.id, "b_error": o.error} for o in outcomes if o.error]
        if errors:
            yield self.db.sql.outcomes.stmt_archive_error(), errors
        results = [{"b_id": o.key.id, "b_result": o.result} for o in outcomes if o.result]
        if results:
            yield self.db.sql.outcomes.stmt_archive_result(), results
        yield self.db.sql.outcomes.stmt_delete(), {"ids": sorted(o.key.id for o in outcomes)}

    @staticmethod
    def _retry_params(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
        """The next attempts of failed ones (rows locked by the plan)."""
        return [
            {
                "b_id": o.key.id,
                "b_attempt": o.key.attempt,
                "b_run_at": o.run_at,
                "b_error": o.error,
                "b_checkpoint": o.checkpoint,
            }
            for o in outcomes
        ]

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
        """Rows another transaction holds are left out, not waited for (unless `wait_locked`):
        an outcome write is finishing them, a rescuer taking them (their lease is over anyway),
        a handler's own transaction holds them, or a session whose client vanished holds them
        until the server ends it. Waiting would let every other lease of the worker run out
        meanwhile."""
        if not keys:
            return 0
        params = keys_param(keys, worker_id)
        lock = self.db.sql.outcomes.stmt_lock_keys(skip_locked=not wait_locked)

        async def work(conn: AsyncConnection) -> int:
            rows = await conn.execute(lock, params)
            locked = [TaskKey(row[0], row[1]) for row in rows]
            if locked:
                ids = [k.id for k in locked]
                until = lease_until() if callable(lease_until) else lease_until
                await conn.execute(
                    self.db.sql.outcomes.stmt_lease_set(), {"ids": ids, "lease_until": until}
                )
                reports = [
                    {"b_id": k.id, "b_progress": progress[k]}
                    for k in locked
                    if progress and k in progress
                ]
                if reports:  # the rows are locked and still this worker's
                    await conn.execute(self.db.sql.outcomes.stmt_progress_set(), reports)
            if left_out is not None and len(locked) < len(keys):
                left_out.update(set(keys).difference(locked))
            if len(locked) == len(keys):
                return len(locked)
            held = await conn.execute(
                self.db.sql.outcomes.stmt_count_keys(), params
            )  # a read: never waits
            return int(held.scalar_one())

        return await self.db.in_transaction(work)

    async def cancel_requested_list(self, keys: Sequence[TaskKey]) -> list[TaskKey]:
        if not keys:
            return []
        wanted = set(keys)
        async with self.db.connect() as conn:
            result = await conn.execute(
                self.db.sql.control.stmt_cancel_requested(), {"ids": sorted({k.id for k in keys})}
            )
            found = [TaskKey(int(i), int(a)) for i, a in result.all()]
        return [k for k in found if k in wanted]
