"""The worker: claims batches of ready tasks, runs their handlers, records the outcomes.

One claimer per worker fetches as many rows as there are free slots in one statement; a
heartbeat extends every held lease in one statement; outcomes are flushed in batches. The
claimed rows run on the worker's `Runner` (txtasks.worker.runner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from txtasks import tracing
from txtasks._waits import within
from txtasks.app import App
from txtasks.driver import Driver
from txtasks.errors import ConfigurationError
from txtasks.faults import Outage, backoff_next, describe, open_when_reachable
from txtasks.health import HealthServer, Pulse
from txtasks.keys import Rate
from txtasks.middleware import Middleware
from txtasks.processes import Beacon
from txtasks.services import ServiceHost, services_for
from txtasks.types import Outcome, OutcomeKind, TaskKey, TaskRow
from txtasks.wakeup import Notifier
from txtasks.wakeup.base import MAX_IDS
from txtasks.worker.config import (
    CONCURRENCY_AUTO_MAX,
    CONCURRENCY_START,
    WorkerConfig,
    WorkerStats,
)
from txtasks.worker.outcomes import OutcomeBuffer, event_wait
from txtasks.worker.progress import ProgressWriter
from txtasks.worker.runner import Runner, first_line
from txtasks.worker.services import HostedServices

if TYPE_CHECKING:
    from txtasks.metrics import Metrics

log = logging.getLogger("txtasks.worker")

CLAIM_ERROR_BACKOFF_MAX = 5.0
#: Seconds to the first retry of a lease extension that failed, then doubling up to
#: `BEAT_RETRY_MAX` (or the heartbeat interval if shorter): however long the database has been
#: away, a lease is extended within a second of its coming back.
BEAT_RETRY_FIRST = 0.1
BEAT_RETRY_MAX = 1.0
#: Lease extensions waiting in line for locked rows at once (`Worker._leases_await`), each
#: for rows none of the others waits for.
AWAITING_MOST = 3
#: Seconds between two looks for cancels prompted by cancel wake-ups (the heartbeat looks
#: anyway).
CANCEL_LOOK_SPACING = 0.25
#: Seconds between reads of the queue rates stored at run time (`txtasks keys queue-rate`).
QUEUE_RATES_EVERY = 5.0
#: Seconds between two looks of a burst worker whose queues are empty while other workers'
#: tasks still run (`_idle_delay`).
BURST_LOOK_EVERY = 0.05
#: Seconds /readyz waits for the database's answer.
READY_TIMEOUT = 3.0
#: Seconds a worker's every slot stays taken before it stops taking wake-ups (its notifier's
#: `accepting(False)`: the broker gives them to other workers until a slot frees). Under a
#: backlog slots free and fill in less: no consumer changes at every claim.
FULL_BEFORE_HANDING_OFF = 0.05

__all__ = ["Worker", "WorkerConfig", "WorkerStats"]


class Named:
    """The tasks wake-ups named since the worker's last claim, and whether its next claim may
    take just those, each by its primary key (`Claims.task_claim_ids`), instead of looking at
    its whole queues: only while its last look found nothing (so nothing else was ready then),
    it has had a free slot since, and every wake-up since named all its tasks. A wake-up
    without ids, or with as many as a message holds (some may have been left out), a poll,
    every slot taken, a key's slot freed and a failed claim make the next claim look at the
    whole queues, in claim order."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        #: The next claim looks at the whole queues.
        self.look = True

    def add(self, ids: Sequence[int]) -> None:
        if ids and len(ids) < MAX_IDS and len(self.ids) + len(ids) <= MAX_IDS:
            self.ids.extend(ids)
        else:
            self.look = True

    def take(self, limit: int) -> list[int]:
        """The ids the claim starting now takes, or [] when it looks at the whole queues (a
        look asked for while it runs is kept for the next claim)."""
        ids, self.ids = self.ids, []
        if self.look or not ids or len(ids) > limit:
            self.look = False
            return []
        return ids

    @property
    def due(self) -> bool:
        """A claim is due now: wake-ups named tasks, or the queues need a look."""
        return self.look or bool(self.ids)


class Slots:
    """How many tasks the worker runs at once (`limit`). A worker given its concurrency runs
    that many. Without one (`WorkerConfig.concurrency` None) it starts at
    `CONCURRENCY_START`; if its handlers are all async, each claim of its queues that fills
    every free slot (a backlog: more may be ready) doubles the limit, up to
    `CONCURRENCY_AUTO_MAX`, and each that comes back short halves it, down to the start. So
    a claim carries up to that many tasks per round trip while a backlog lasts, and at a low
    load, where claims come back short, the worker claims and spreads tasks among workers as
    with the start's fixed concurrency. Sync handlers run in threads, as many as the start:
    a worker with any of them keeps it."""

    def __init__(self, config: WorkerConfig, stats: WorkerStats) -> None:
        given = config.concurrency
        self.start = given if given is not None else CONCURRENCY_START
        self.adaptive = given is None
        self.most = self.limit = self.start
        self.stats = stats
        stats.concurrency_peak = self.start

    def settle(self, all_async: bool) -> None:
        """Whether it may grow: an adaptive worker whose handlers are all async."""
        if self.adaptive and all_async:
            self.most = max(self.start, CONCURRENCY_AUTO_MAX)

    def claimed(self, got: int, asked: int) -> None:
        """A claim of the queues asked for `asked` tasks (its free slots) and got `got`."""
        if self.most == self.start:
            return
        if got >= asked:
            self.limit = min(self.most, self.limit * 2)
            if self.limit > self.stats.concurrency_peak:
                self.stats.concurrency_peak = self.limit
        else:
            self.limit = max(self.start, self.limit // 2)


def default_worker_id() -> str:
    """host:pid:random, within the 128 characters the column holds."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs an application's tasks. `await worker.run()`; `worker.stop()` to end gracefully."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig | None = None,
        *,
        driver: Driver | None = None,
        notifier: Notifier | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.app = app
        #: Prometheus counters of this worker's tasks (txtasks.metrics), or None.
        self.metrics = metrics
        self.config = config or WorkerConfig()
        self.driver = driver or app.driver
        self.notifier = notifier or app.notifier
        self.worker_id = self.config.worker_id or default_worker_id()
        self.queues = list(self.config.queues or app.queues)
        if not self.queues:
            raise ConfigurationError("worker: no queues to serve (register a task or pass queues)")
        self.stats = WorkerStats()
        #: How many tasks it runs at once.
        self._slots = Slots(self.config, self.stats)
        #: Its heartbeat row (txtasks.processes): its queues and how many tasks it runs.
        self._beacon = Beacon(
            self.driver,
            app.clock,
            process_id=self.worker_id,
            kind="worker",
            runs=self.queues,
            expires_after=self.config.lease,
        )
        #: Claimed attempts not finished yet: waiting for a runner, or running.
        self._held: set[TaskKey] = set()
        #: Attempts of tasks with a key whose outcome is not written yet (see `_written`).
        self._keyed: set[TaskKey] = set()
        self._stopping = asyncio.Event()
        #: Database outages as seen by the claims and the heartbeat: logged once each.
        self._claim_outage = Outage(log, "claiming tasks")
        self._beat_outage = Outage(log, "extending leases")
        self._wake = asyncio.Event()
        #: What wake-ups named since the last claim (claimed by id while the queues are empty).
        self._named = Named()
        #: Whether its notifier gives it wake-ups: not while every slot is taken (`_handoff`).
        self._taking_wakeups = True
        self._handoff_timer: asyncio.TimerHandle | None = None
        self._queue_rates: Mapping[str, Rate] = app.declared_queue_rates
        self._queue_rates_at: float | None = None  # monotonic time of the last read
        self._slot_free = asyncio.Event()
        self._beat_stop = asyncio.Event()
        #: A cancel wake-up arrived while tasks run, or a beat reached the database: look for
        #: cancels (`_cancels_watch`).
        self._cancel_look = asyncio.Event()
        #: Set while the worker waits for a wake-up or its next poll (its last claim was empty).
        self.idle = asyncio.Event()
        self._force = False
        #: Extensions waiting in line for rows another transaction holds, and their keys
        #: (`_leases_await`).
        self._awaiting: dict[asyncio.Task[None], frozenset[TaskKey]] = {}
        #: When the claim loop and the heartbeat last turned (liveness).
        self._pulses = {"claimer": Pulse(), "heartbeat": Pulse()}
        self._loops: list[asyncio.Task[None]] = []
        #: Waiting at start for the database to answer.
        self._connecting = False
        self.health_server: HealthServer | None = None
        if self.config.health_port is not None:
            self.health_server = HealthServer(
                self.health, self.config.health_host, self.config.health_port, logger=log
            )
        self._outcomes = OutcomeBuffer(
            self.driver,
            app.clock,
            interval=self.config.flush_interval,
            max_batch=self.config.flush_batch,
            archive_completed=self.config.archive_completed,
            worker_id=self.worker_id,
            on_written=self._written,
        )
        self._progress = ProgressWriter(
            self.driver,
            app.clock,
            interval=self.config.progress_interval,
            lease=self.config.lease,
            worker_id=self.worker_id,
            held=self._held,
        )
        self._runner = Runner(
            app,
            worker_id=self.worker_id,
            concurrency=self._slots.most,
            stats=self.stats,
            outcomes=self._outcomes,
            held=self._held,
            slot_free=self._slot_free,
            freed=self._slot_freed,
            stopping=self._stopping,
            metrics=metrics,
            progress=self._progress,
        )
        #: Claimed rows no runner has taken yet, in claim order (the runner's queue).
        self._ready = self._runner.ready
        #: The built-in middleware every attempt runs in, without tracing and with it.
        self._builtin = () if metrics is None else (metrics.middleware,)
        self._builtin_traced = (tracing.TRACING, *self._builtin)
        #: The services it hosts (txtasks.services), the publisher of deferred writes among them.
        host = ServiceHost("worker", app, self.driver, log, wake=self._queue_woken)
        services = services_for("worker", self.config.services)
        self._services = HostedServices(services, host, self._stopping)

    # -- control ------------------------------------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming; in-flight tasks get `shutdown_grace` seconds to finish.

        With `now=True` in-flight tasks are cancelled at once and handed back to the queue.
        """
        self._stopping.set()
        self._wake.set()
        if now:
            self._force = True
            self._runner.cancel()  # rows not started yet are handed back at shutdown

    def wake(
        self, queue: str | None = None, *, cancel: bool = False, ids: Sequence[int] = ()
    ) -> None:
        """Claim now instead of at the next poll (a wake-up arrived). `queue` is the one the
        wake-up named; the claim serves all the worker's queues in priority order, so it only
        says why the worker woke. `ids`, the tasks the wake-up named: while its last claim
        found its queues empty, the worker claims just those, by primary key (`Named`). A
        cancel wake-up (`cancel=True`: a running task of `queue` was asked to stop) makes the
        worker look for cancels of its running tasks instead; an ordinary one never does."""
        if cancel:
            self.stats.cancel_wakeups += 1
            if self._held:
                self._cancel_look.set()
            return
        self.stats.wakeups += 1
        self._named.add(ids)
        self._wake.set()

    @property
    def threads_alive(self) -> bool:
        """True when a sync handler is still running in a thread after shutdown."""
        return self._runner.threads_busy()

    async def run(self) -> WorkerStats:
        """Run until stopped (or, in burst mode, until the queues are empty). While the database
        cannot be reached at start, wait for it (a burst fails at once instead)."""
        if self.health_server is not None:
            await self.health_server.start()  # live while it waits for the database
        try:
            if not await self._open():
                log.info("worker %s stopped before the database answered", self.worker_id)
                return self.stats
            await self._subscribe()
            return await self._serve()
        finally:
            if self.health_server is not None:
                await self.health_server.stop()

    async def _open(self) -> bool:
        await self._handlers_settle()
        if self.config.burst:
            await self.driver.open()
            return True
        self._connecting = True
        try:
            return await open_when_reachable(self.driver, log, self._stopping)
        finally:
            self._connecting = False

    async def _handlers_settle(self) -> None:
        """What its handlers being sync or async decide. A worker whose handlers are all
        async may grow its concurrency (`Slots`). One with sync handlers runs their
        transactions and enqueues on the sync engine: under a connection budget, the
        engines share it (see `SqlDatabase.share_with_sync`)."""
        served = [t for t in self.app.tasks.values() if t.options.queue in self.queues]
        all_async = all(t.is_async for t in served)
        self._slots.settle(all_async)
        self._runner.concurrency = self._slots.most
        if self.metrics is not None:
            self.metrics.concurrency.set(self._slots.limit)
        share = getattr(getattr(self.driver, "db", None), "share_with_sync", None)
        if share is not None and not all_async:
            await share()

    async def _subscribe(self) -> None:
        """Store the subscriptions of the tasks of the queues it serves (see txtasks.topics):
        publishes from now on reach their groups."""
        subs = [s for s in self.app.subscriptions if s.queue in self.queues]
        if subs:
            await self.driver.topics.subscription_set_many(subs, now=self.app.clock())
            log.info(
                "worker %s subscribed %s",
                self.worker_id,
                ", ".join(f"{s.group} to {s.topic}" for s in subs),
            )

    async def _serve(self) -> WorkerStats:
        self._runner.open()
        flusher = asyncio.create_task(self._outcomes.run(), name="txtasks-flush")
        heartbeat = asyncio.create_task(self._heartbeat(), name="txtasks-heartbeat")
        cancels = asyncio.create_task(self._cancels_watch(), name="txtasks-cancels")
        progress = asyncio.create_task(self._progress.run(self._beat_stop), name="txtasks-progress")
        self._loops = [flusher, heartbeat, cancels, progress]
        if not self.config.burst:  # a burst runs them inline, when the queues look empty
            self._loops.extend(self._services.start())
        log.info("worker %s serving %s", self.worker_id, ", ".join(self.queues))
        await self._beacon.beat(running=0)
        try:
            await self.notifier.subscribe(self.queues, self.wake)
            await self._claim_loop()
        finally:
            await self.notifier.unsubscribe()  # a stopped worker must not take wake-ups
            if self._handoff_timer is not None:
                self._handoff_timer.cancel()
            await self._shutdown()
            self._beat_stop.set()
            self._outcomes.stop()
            for waiting in self._awaiting:
                waiting.cancel()
                self._loops.append(waiting)
            await asyncio.gather(*self._loops, return_exceptions=True)
            await self._outcomes.drain(give_up=lambda: self._force)
            self._runner.close()
            await self._beacon.end()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        return self.stats

    # -- claiming -----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        backoff = 0.0
        pulse = self._pulses["claimer"]
        while not self._stopping.is_set():
            pulse.beat()
            free = self._slots.limit - len(self._held)
            if free <= 0:
                self._named.look = True  # tasks pile up meanwhile: the next claim looks
                self._slot_free.clear()
                await self._wait(self._slot_free, self.config.poll_interval)  # turn meanwhile
                continue
            self._wake.clear()
            try:
                rows = await self._claim(free)
                backoff = 0.0
                self._claim_outage.ok()
            except Exception as exc:
                self._named.look = True
                self.stats.claim_errors += 1
                backoff = backoff_next(backoff, 0.1, CLAIM_ERROR_BACKOFF_MAX)
                self._claim_outage.failed(exc, retry_in=backoff)
                await self._wait(self._stopping, backoff * random.uniform(0.5, 1.0))
                continue
            if self._stopping.is_set():  # a stop arrived during the claim: hand the rows back
                for row in rows:
                    self._outcomes.add(
                        Outcome(row.key, OutcomeKind.RELEASE, error="worker stopped")
                    )
                return
            self._runner.chain = self._chain()
            for row in rows:
                self._start(row)
            self._runner.dispatch()
            if len(rows) >= free:  # every slot taken: wake-ups may go elsewhere soon
                self._handoff_arm()
            if rows:
                await asyncio.sleep(0)  # let the handlers start before the next claim goes out
            if self._named.due:  # it found some (more may be ready), or was asked to look
                continue
            if self.config.burst and await self._services.pass_all():
                continue  # a service may have made tasks claimable (deferred writes)
            if self.config.burst and await self._burst_done():
                return
            self.idle.set()
            await self._wait(self._wake, self._idle_delay())
            self.idle.clear()
            if not self._wake.is_set():  # the poll: look at the whole queues
                self._named.look = True

    # -- wake-ups while every slot is taken ---------------------------------------------------

    def _handoff_arm(self) -> None:
        """Every slot is taken: if they all still are `FULL_BEFORE_HANDING_OFF` seconds from
        now, stop taking wake-ups (`_handoff`)."""
        if self._taking_wakeups and self._handoff_timer is None:
            loop = asyncio.get_running_loop()
            self._handoff_timer = loop.call_later(FULL_BEFORE_HANDING_OFF, self._handoff)

    def _handoff(self) -> None:
        self._handoff_timer = None
        if len(self._held) >= self._slots.limit and not self._stopping.is_set():
            self._wakeups_taken(False)

    def _slot_freed(self) -> None:
        """A slot freed (`Runner.finished`): take wake-ups again."""
        if not self._taking_wakeups:
            self._wakeups_taken(True)

    def _wakeups_taken(self, yes: bool) -> None:
        """Tell the notifier whether this worker can claim now: while it cannot, the broker
        gives the wake-ups of its queues to other workers (a notifier without `accepting`
        cannot: it is told nothing)."""
        self._taking_wakeups = yes
        accepting = getattr(self.notifier, "accepting", None)
        if accepting is not None:
            accepting(yes)

    def _queue_woken(self, queue: str) -> None:
        """A service gave `queue` tasks: wake its workers, this one at once if it serves it."""
        self.app.notify(queue)
        if queue in self.queues:
            self._named.look = True
            self._wake.set()

    async def _rates(self) -> Mapping[str, Rate]:
        """The queues' own rates: those stored at run time over the declared ones, read at
        most once per QUEUE_RATES_EVERY."""
        at = time.monotonic()
        if self._queue_rates_at is None or at - self._queue_rates_at >= QUEUE_RATES_EVERY:
            stored = await self.driver.control.queue_rates_stored()
            mine = {q: r for q, r in stored.items() if q in self.queues}
            self._queue_rates = {**self.app.declared_queue_rates, **mine}
            self._queue_rates_at = at
        return self._queue_rates

    async def _claim(self, limit: int) -> list[TaskRow]:
        """The tasks wake-ups named, by primary key, while the queues were found empty (see
        `Named`); else a claim of the whole queues. A look that finds nothing lets the next
        claims take what wake-ups name; a named task not taken (another worker's by now, a
        key's, not due) makes the next claim look."""
        ids = self._named.take(limit)
        if self.config.burst:  # a burst always looks at its whole queues
            ids = []
        now = self.app.clock()
        lease_until = now + timedelta(seconds=self.config.lease)
        rates = await self._rates()
        if ids:
            rows = await self.driver.claims.task_claim_ids(
                [q for q in self.queues if q not in rates],
                ids,
                now=now,
                lease_until=lease_until,
                worker_id=self.worker_id,
            )
            if len(rows) < len(set(ids)):
                self._named.look = True
            self.stats.claimed_named += len(rows)
        else:
            rows = await self.driver.claims.task_claim_many(
                self.queues,
                limit,
                now=now,
                lease_until=lease_until,
                worker_id=self.worker_id,
                keys=self.app.declared_key_limits,
                queue_rates=rates,
            )
            if rows:  # more may be ready: the next claim looks again, as long as it finds some
                self._named.look = True
            self._slots.claimed(len(rows), limit)
            if self.metrics is not None:
                self.metrics.concurrency.set(self._slots.limit)
        self.stats.claimed += len(rows)
        return rows

    def _poll_delay(self) -> float:
        return self.config.poll_interval * random.uniform(0.9, 1.1)

    def _idle_delay(self) -> float:
        """Until the next poll, or until a key put aside by a claim may start again (its rate),
        whichever comes first. In burst mode at most `BURST_LOOK_EVERY`: the queues are empty
        but other workers' tasks still run (they may come back as retries), and the burst
        ends as soon as they are done, not up to a poll interval later."""
        delay = self._poll_delay()
        if self.config.burst:
            delay = min(delay, BURST_LOOK_EVERY)
        now = self.app.clock()
        wake_at = self.driver.claims.keys_wake_at(self.queues, now)
        if wake_at is not None:
            delay = max(0.0, min(delay, (wake_at - now).total_seconds()))
        return delay

    async def _burst_done(self) -> bool:
        """`_drained()`, but a database error only means: not yet."""
        try:
            return await self._drained()
        except Exception as exc:
            self._claim_outage.failed(exc)
            return False

    async def _drained(self) -> bool:
        """Burst mode: nothing in flight, outcomes written, nothing due soon in the queues."""
        if self._held:
            return False
        await self._outcomes.flush()
        now = self.app.clock()
        due = now + timedelta(seconds=self.config.burst_horizon)
        left = await self.driver.tasks.live_count(self.queues, now=now, due_before=due, at_most=1)
        return left == 0

    async def _wait(self, event: asyncio.Event, timeout: float | None) -> None:
        """Wait for `event` (or a stop request) at most `timeout` seconds. For a wake-up, one
        waiter (a stop sets `_wake` too): a wake-up resumes the claim loop in one turn of the
        event loop, not three."""
        if event is self._wake:
            with contextlib.suppress(asyncio.TimeoutError):
                await within(event.wait(), timeout)
            return
        waiters = {
            asyncio.ensure_future(event.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        }
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # -- running ------------------------------------------------------------------------------

    def _start(self, row: TaskRow) -> None:
        """Hold a claimed row until a runner takes it (`Runner.dispatch` wakes one)."""
        if self.metrics is not None:
            self.metrics.task_claimed(row.queue, row.task_name)
        key = TaskKey(row.id, row.attempt)
        self._held.add(key)
        if row.partition_key is not None:
            self._keyed.add(key)
        self._ready.append((row, key))

    def _chain(self) -> tuple[Middleware, ...]:
        """The middleware every attempt of a claimed batch runs in, before its task's own:
        tracing while a tracer provider is configured (asked once a batch: it is not free),
        metrics when the worker has them, then the application's."""
        builtin = self._builtin_traced if tracing.enabled() else self._builtin
        return (*builtin, *self.app._middleware) if builtin else self.app._middleware

    def _written(self, batch: list[Outcome], stale: tuple[TaskKey, ...]) -> None:
        """Outcomes are stored: count them; a task with a key that left processing freed a
        slot of its key (or moved an ordered key on), so claim now rather than at the poll."""
        self.stats.count(batch, stale)
        self.app.tasks_finished(o.key.id for o in batch if o.kind.finishes)
        if self._keyed and any(o.key in self._keyed for o in batch):
            self._keyed.difference_update(o.key for o in batch)
            self._named.look = True
            self._wake.set()

    # -- leases -------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Extend every held lease (running, or finished but not yet written) in one statement.

        A failed extension is tried again soon, backing off up to a second, not one interval
        later: on a network that is down in spells, a lease must be extended in the first
        moments the database answers again, before the lease runs out and the task is rescued
        and run a second time. The process's heartbeat row waits for a beat that reached the
        database, so that it never delays a retry."""
        pulse = self._pulses["heartbeat"]
        interval = self.config.heartbeat_interval
        retry = 0.0  # seconds to the next try after a failed one; 0: the beat went through
        while not await event_wait(self._beat_stop, retry or interval):
            # never waits for a flush: rows an outcome write has locked are left out
            keys = [*self._held, *self._outcomes.keys()]
            if not keys or await self._leases_extend(keys):
                retry = 0.0
                if keys:
                    self._cancel_look.set()  # looked for apart: a beat never waits for it
                await self._beacon.beat(running=len(self._held))
            else:
                retry = backoff_next(retry, BEAT_RETRY_FIRST, min(interval, BEAT_RETRY_MAX))
            pulse.beat()

    async def _cancels_look(self) -> None:
        """Ask the database which held attempts were asked to cancel, and stop them (see
        docs/control.md): after every heartbeat that reached the database, and soon after a
        cancel wake-up while tasks run; in a task of its own (`_cancels_watch`), so that a look
        stuck on a failing network never holds back the next lease extension."""
        keys = list(self._held)
        if not keys:
            return
        self.stats.cancel_looks += 1
        try:
            found = await self.driver.claims.cancel_requested_list(keys)
        except Exception as exc:
            self._beat_outage.failed(exc)
            return
        if found:
            self._runner.cancel_attempts(found)

    async def _cancels_watch(self) -> None:
        """Look for cancels after each beat that reached the database, and soon after a cancel
        wake-up arrives while tasks run (a cancel sends one to every worker of the queue of each
        running task it asks to stop): at most one look per `CANCEL_LOOK_SPACING` seconds,
        however many arrive."""
        while True:
            waiters = {
                asyncio.ensure_future(self._cancel_look.wait()),
                asyncio.ensure_future(self._beat_stop.wait()),
            }
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if self._beat_stop.is_set():
                return
            self._cancel_look.clear()
            await self._cancels_look()
            if await event_wait(self._beat_stop, CANCEL_LOOK_SPACING):
                return

    async def _leases_extend(self, keys: list[TaskKey]) -> bool:
        """Extend the leases of `keys`; whether the database answered."""
        until = self.app.clock() + timedelta(seconds=self.config.lease)
        left_out: set[TaskKey] = set()
        try:
            held = await self.driver.claims.lease_extend_many(
                keys, lease_until=until, worker_id=self.worker_id, left_out=left_out
            )
            self._beat_outage.ok()
        except Exception as exc:
            self._beat_outage.failed(exc)
            return False
        if held < len(keys):  # some may have been written meanwhile: count those still ours
            pending = set(self._outcomes.keys())
            lost = sum(1 for k in keys if k in self._held or k in pending) - held
            if lost > 0:
                log.warning("%d of %d leases were lost (rescued elsewhere)", lost, len(keys))
        if left_out:
            self._leases_await(left_out)
        return True

    def _leases_await(self, left_out: set[TaskKey]) -> None:
        """Extend, as soon as their rows are free, the leases of outcomes not stored yet that
        the beat left out because another transaction holds their rows.

        That transaction is most often this worker's own outcome write, which stores them a
        moment later. But a write whose answer was lost may keep its locks on the server
        (its session not ended yet) for longer than the lease has left: skipped beat after
        beat, the lease runs out, and when that transaction ends without storing them, the
        rescuer would take the rows before the next beat or the write's retry, and the task
        would run again. An extension waiting in line for the locks comes first instead.

        The first beat that leaves rows out puts one extension in line for them, and it stays
        there until it gets them (or the command timeout ends it, and a later beat puts
        another): the one in line was put there while the lease had time left, however late
        a loaded machine brings it to the server. Its lease is counted from the moment it
        gets the rows. Rows left out again while one waits for them add nothing."""
        self._awaiting = {t: keys for t, keys in self._awaiting.items() if not t.done()}
        waiting = left_out.intersection(self._outcomes.keys())
        for keys in self._awaiting.values():
            waiting -= keys
        if waiting and len(self._awaiting) < AWAITING_MOST:
            task = asyncio.create_task(self._leases_extend_waiting(sorted(waiting)))
            self._awaiting[task] = frozenset(waiting)

    async def _leases_extend_waiting(self, keys: list[TaskKey]) -> None:
        lease = timedelta(seconds=self.config.lease)
        try:
            await self.driver.claims.lease_extend_many(
                keys,
                lease_until=lambda: self.app.clock() + lease,
                worker_id=self.worker_id,
                wait_locked=True,
            )
        except Exception as exc:  # the beats go on, and put another in line while it matters
            log.debug("waiting to extend %d lease(s): %s", len(keys), describe(exc))

    # -- health -------------------------------------------------------------------------------

    def liveness(self) -> dict[str, Any]:
        """`live`: the claim loop and the heartbeat each turned within their interval plus
        `stall_after`, no outcome write has been under way longer than the heartbeat interval
        plus `stall_after`, and no loop has ended. Waiting for the database at start, and the
        start itself, are live: a restart would not bring it sooner."""
        if self._connecting:
            return {"live": True, "connecting": True, "seconds_since_turned": {}, "stuck": []}
        if not self._loops:  # starting: its subscriptions are being stored (`_subscribe`)
            return {"live": True, "starting": True, "seconds_since_turned": {}, "stuck": []}
        now = time.monotonic()
        bounds = {
            "claimer": self.config.poll_interval * 1.1,
            "heartbeat": self.config.heartbeat_interval,
            "outcomes": self.config.heartbeat_interval,
        }
        ages = {name: round(pulse.age(now), 3) for name, pulse in self._pulses.items()}
        flushing = self._outcomes.flushing_since
        ages["outcomes"] = round(now - flushing, 3) if flushing is not None else 0.0
        stuck = [name for name, age in ages.items() if age > bounds[name] + self.config.stall_after]
        if self._stopping.is_set():  # the claim loop has ended on purpose
            stuck = [name for name in stuck if name != "claimer"]
        ended = [loop.get_name() for loop in self._loops if loop.done()]
        return {
            "live": bool(self._loops) and not stuck and not ended,
            "seconds_since_turned": ages,
            "stuck": stuck + ended,
        }

    async def health(self, probe: str = "ready") -> dict[str, Any]:
        """The report of the health endpoint: `liveness()`, and for readiness a round trip to
        the database (`ready`: live, not stopping, and the database answered in time)."""
        report = self.liveness()
        if probe != "ready":
            return report
        try:
            await asyncio.wait_for(self.driver.ping(), READY_TIMEOUT)
            report["database"] = "ok"
        except Exception as exc:  # the database is unreachable, or too slow to answer
            report["database"] = first_line(str(exc) or type(exc).__name__)
        ready = report["live"] and report["database"] == "ok" and not self._stopping.is_set()
        report["ready"] = ready
        return report

    # -- shutdown -----------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Let held tasks finish within the grace period, then hand the rest back."""
        if self._held:
            grace = 0.0 if self._force else self.config.shutdown_grace
            log.info("waiting up to %.1fs for %d task(s)", grace, len(self._held))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            while self._held and not self._force and (left := deadline - loop.time()) > 0:
                self._slot_free.clear()
                await event_wait(self._slot_free, left)
        late = len(self._held)
        await self._runner.shut_down()  # rows not started in time: handed back below
        if late:
            log.warning("%d task(s) did not finish in time and were handed back", late)
        for key in list(self._held):  # cancelled before a runner took them: never started
            self._outcomes.add(Outcome(key, OutcomeKind.RELEASE, error="worker shut down"))
            self._runner.finished(key)
