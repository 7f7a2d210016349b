"""The worker: claims batches of ready tasks, runs their handlers, records the outcomes.

One claimer per worker fetches as many rows as there are free slots in one statement; a
heartbeat extends every held lease in one statement; outcomes are flushed in batches.

Handlers run on at most `concurrency` runners: long-lived asyncio tasks that take claimed rows
one after the other. A runner about to call a handler while more rows wait wakes another one,
so a handler that waits never holds up the rows behind it, and handlers that finish without
waiting cost no asyncio task each. Every handler starts in the worker's own context: a runner
whose handler left a context variable set retires, and a fresh one takes the next row.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import random
import socket
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from txtasks import tracing
from txtasks._checks import check_number
from txtasks.app import App, Task, check_queue_name
from txtasks.driver import Driver
from txtasks.driver.urls import url_safe
from txtasks.errors import ConfigurationError, PayloadError
from txtasks.faults import Outage, open_when_reachable
from txtasks.health import HealthServer, Pulse
from txtasks.payload import headers_decode, payload_decode
from txtasks.policy import (
    AckPolicy,
    error_text,
    outcome_after_failure,
    outcome_for_exception,
    sanitized,
)
from txtasks.types import Outcome, OutcomeKind, TaskKey, TaskRow
from txtasks.wakeup import Notifier
from txtasks.worker.context import TaskContext
from txtasks.worker.outcomes import OutcomeBuffer, event_wait

if TYPE_CHECKING:
    from txtasks.metrics import Metrics

log = logging.getLogger("txtasks.worker")

CLAIM_ERROR_BACKOFF_MAX = 5.0
#: What the log line of a failed attempt says happens next, by outcome (a retry: its time).
FAILURE_NEXT = {
    OutcomeKind.DEAD: "dead-lettered",
    OutcomeKind.DISCARD: "discarded",
    OutcomeKind.FAIL: "failed for good",
    OutcomeKind.COMPLETE: "completed anyway (ack_policy complete)",
}
#: The longest error a log line shows (the task row keeps the whole text).
LOGGED_ERROR_CHARS = 300
#: Seconds /readyz waits for the database's answer.
READY_TIMEOUT = 3.0
#: Enum members read once: `Enum.MEMBER` is a slow lookup, paid for every task otherwise.
_COMPLETE = OutcomeKind.COMPLETE
_MANUAL = AckPolicy.MANUAL


@dataclass(frozen=True)
class WorkerConfig:
    """Worker settings; every one has a named default and is checked at start."""

    #: Queues to take tasks from; None means every queue a registered task uses.
    queues: tuple[str, ...] | None = None
    #: Tasks run at once by this worker (async handlers as tasks, sync ones in threads).
    concurrency: int = 10
    #: Seconds a claim holds a task before the cleaner may rescue it.
    lease: float = 30.0
    #: Seconds between lease extensions; default a third of the lease.
    heartbeat: float | None = None
    #: Seconds between polls when idle (jittered by +-10%).
    poll_interval: float = 1.0
    #: Seconds outcomes may wait in the buffer to be written together.
    flush_interval: float = 0.005
    #: Most outcomes written in one statement.
    flush_batch: int = 500
    #: Seconds in-flight tasks get to finish after a stop request.
    shutdown_grace: float = 30.0
    #: Keep completed tasks in the archive table (False: delete them).
    archive_completed: bool = True
    #: Exit when the queues hold no task due within `burst_horizon` seconds.
    burst: bool = False
    burst_horizon: float = 10.0
    #: Identifies this worker in the task rows; default host:pid:random.
    worker_id: str | None = None
    #: Serve /livez and /readyz on this port (0: any free port); None: no HTTP endpoint.
    health_port: int | None = None
    #: Address the health endpoint listens on.
    health_host: str = "0.0.0.0"
    #: Seconds a loop (claims, heartbeat, outcome writes) may overrun its interval, stuck in
    #: a database call, before /livez fails.
    stall_after: float = 60.0

    def __post_init__(self) -> None:
        check_number("concurrency", self.concurrency, minimum=1, maximum=None, integer=True)
        check_number("flush_batch", self.flush_batch, minimum=1, maximum=None, integer=True)
        for name in ("lease", "poll_interval", "flush_interval"):
            check_number(name, getattr(self, name), above=0)
        for name in ("shutdown_grace", "burst_horizon"):
            check_number(name, getattr(self, name), minimum=0)
        check_number("stall_after", self.stall_after, above=0)
        if self.health_port is not None:
            check_number("health_port", self.health_port, minimum=0, maximum=65535, integer=True)
        if self.heartbeat is not None:
            check_number("heartbeat", self.heartbeat, above=0)
            if not self.heartbeat < self.lease:
                raise ConfigurationError(
                    f"heartbeat must be shorter than the lease ({self.lease}s), "
                    f"got {self.heartbeat!r}"
                )
        for queue in self.queues or ():
            check_queue_name(queue, setting="queues")
        if self.worker_id is not None and not 0 < len(self.worker_id) <= 128:
            raise ConfigurationError(f"worker_id must be 1-128 characters, got {self.worker_id!r}")

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3


@dataclass
class WorkerStats:
    """What a worker did; returned by `run()`."""

    claimed: int = 0
    started: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    stale: int = 0
    claim_errors: int = 0
    wakeups: int = 0
    #: Sync handlers that ran past their timeout (their thread kept the slot until it ended).
    overruns: int = 0

    def count(self, outcomes: Sequence[Outcome], stale: Sequence[TaskKey]) -> None:
        counts = self.outcomes
        for outcome in outcomes:
            kind = outcome.kind._value_  # a plain attribute, unlike the `value` property
            counts[kind] = counts.get(kind, 0) + 1
        self.stale += len(stale)


def first_line(error: str | None) -> str:
    """The first line of an error text, bounded, for a log line."""
    line = (error or "no reason given").strip().partition("\n")[0]
    return line if len(line) <= LOGGED_ERROR_CHARS else line[:LOGGED_ERROR_CHARS] + "..."


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
        #: Claimed attempts not finished yet: waiting for a runner, or running.
        self._held: set[TaskKey] = set()
        #: Claimed rows no runner has taken yet, in claim order.
        self._ready: deque[tuple[TaskRow, TaskKey]] = deque()
        self._runners: set[asyncio.Task[None]] = set()
        #: Runners with nothing to do, each waiting on its future.
        self._idle: deque[asyncio.Future[None]] = deque()
        #: A runner was woken (or created) and has not looked at the ready rows yet.
        self._waking = False
        #: The context every handler starts in (a copy of the one `run()` was called in).
        self._base_context = contextvars.copy_context()
        self._stopping = asyncio.Event()
        #: Database outages as seen by the claims and the heartbeat: logged once each.
        self._claim_outage = Outage(log, "claiming tasks")
        self._beat_outage = Outage(log, "extending leases")
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._beat_stop = asyncio.Event()
        #: Set while the worker waits for a wake-up or its next poll (its last claim was empty).
        self.idle = asyncio.Event()
        self._force = False
        self._traced = False
        self._threads: ThreadPoolExecutor | None = None
        #: Sync handlers still running in their thread after their timeout (by task id).
        self._overrun: dict[TaskKey, asyncio.Future[Any]] = {}
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
            on_written=self.stats.count,
        )

    # -- control ------------------------------------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming; in-flight tasks get `shutdown_grace` seconds to finish.

        With `now=True` in-flight tasks are cancelled at once and handed back to the queue.
        """
        self._stopping.set()
        self._wake.set()
        if now:
            self._force = True
            self._ready.clear()  # never started: handed back at shutdown
            for runner in self._runners:
                runner.cancel()

    def wake(self, queue: str | None = None) -> None:
        """Claim now instead of at the next poll (a wake-up arrived). `queue` is the one the
        wake-up named; the claim serves all the worker's queues in priority order, so it only
        says why the worker woke."""
        self.stats.wakeups += 1
        self._wake.set()

    @property
    def threads_alive(self) -> bool:
        """True when a sync handler is still running in a thread after shutdown."""
        return self._threads is not None and any(
            t.is_alive() for t in getattr(self._threads, "_threads", ())
        )

    async def run(self) -> WorkerStats:
        """Run until stopped (or, in burst mode, until the queues are empty). While the database
        cannot be reached at start, wait for it (a burst fails at once instead)."""
        if self.health_server is not None:
            await self.health_server.start()  # live while it waits for the database
        try:
            if not await self._open():
                log.info("worker %s stopped before the database answered", self.worker_id)
                return self.stats
            return await self._serve()
        finally:
            if self.health_server is not None:
                await self.health_server.stop()

    async def _open(self) -> bool:
        if self.config.burst:
            await self.driver.open()
            return True
        self._connecting = True
        try:
            what = f"connecting to {self._database}"
            return await open_when_reachable(self.driver.open, log, what, self._stopping)
        finally:
            self._connecting = False

    async def _serve(self) -> WorkerStats:
        self._base_context = contextvars.copy_context()
        self._threads = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="txtasks")
        flusher = asyncio.create_task(self._outcomes.run(), name="txtasks-flush")
        heartbeat = asyncio.create_task(self._heartbeat(), name="txtasks-heartbeat")
        self._loops = [flusher, heartbeat]
        log.info("worker %s serving %s", self.worker_id, ", ".join(self.queues))
        try:
            await self.notifier.subscribe(self.queues, self.wake)
            await self._claim_loop()
        finally:
            await self.notifier.unsubscribe()  # a stopped worker must not take wake-ups
            await self._shutdown()
            self._beat_stop.set()
            self._outcomes.stop()
            await asyncio.gather(flusher, heartbeat, return_exceptions=True)
            await self._outcomes.drain(give_up=lambda: self._force)
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        return self.stats

    @property
    def _database(self) -> str:
        url = getattr(self.driver, "url", None)
        return url_safe(url) if url is not None else "the database"

    # -- claiming -----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        backoff = 0.0
        pulse = self._pulses["claimer"]
        while not self._stopping.is_set():
            pulse.beat()
            free = self.config.concurrency - len(self._held)
            if free <= 0:
                self._slot_free.clear()
                await self._wait(self._slot_free, self.config.poll_interval)  # turn meanwhile
                continue
            self._wake.clear()
            try:
                rows = await self._claim(free)
                backoff = 0.0
                self._claim_outage.ok()
            except Exception as exc:
                self.stats.claim_errors += 1
                backoff = min(CLAIM_ERROR_BACKOFF_MAX, max(0.1, backoff * 2))
                self._claim_outage.failed(exc, retry_in=backoff)
                await self._wait(self._stopping, backoff * random.uniform(0.5, 1.0))
                continue
            if self._stopping.is_set():  # a stop arrived during the claim: hand the rows back
                for row in rows:
                    self._outcomes.add(
                        Outcome(row.key, OutcomeKind.RELEASE, error="worker stopped")
                    )
                return
            self._traced = tracing.enabled()  # read once a batch: it is not free
            for row in rows:
                self._start(row)
            self._dispatch()
            if rows:
                await asyncio.sleep(0)  # let the handlers start before the next claim goes out
                continue
            if self.config.burst and await self._burst_done():
                return
            self.idle.set()
            await self._wait(self._wake, self._poll_delay())
            self.idle.clear()

    async def _claim(self, limit: int) -> list[TaskRow]:
        now = self.app.clock()
        rows = await self.driver.task_claim_many(
            self.queues,
            limit,
            now=now,
            lease_until=now + timedelta(seconds=self.config.lease),
            worker_id=self.worker_id,
        )
        self.stats.claimed += len(rows)
        return rows

    def _poll_delay(self) -> float:
        return self.config.poll_interval * random.uniform(0.9, 1.1)

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
        return await self.driver.live_count(self.queues, now=now, due_before=due) == 0

    async def _wait(self, event: asyncio.Event, timeout: float | None) -> None:
        """Wait for `event` (or a stop request) at most `timeout` seconds."""
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
        """Hold a claimed row until a runner takes it (`_dispatch` wakes one)."""
        if self.metrics is not None:
            self.metrics.task_claimed(row.queue, row.task_name)
        key = TaskKey(row.id, row.attempt)
        self._held.add(key)
        self._ready.append((row, key))

    def _dispatch(self) -> None:
        """Rows are ready: make sure a runner will look at them, unless one already will."""
        if self._waking or not self._ready:
            return
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():  # not a runner cancelled while idle
                waiter.set_result(None)
                self._waking = True
                return
        if len(self._runners) < self.config.concurrency:
            # in the worker's context, not in that of the handler that may be calling this (a
            # copy: with an eager task factory the runner may dispatch before this returns)
            runner = self._base_context.copy().run(
                asyncio.ensure_future, self._run_rows(), loop=asyncio.get_running_loop()
            )
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
            self._waking = True
        # else every runner is busy: the first to finish takes the row

    async def _run_rows(self) -> None:
        """A runner: take ready rows one by one; between them wait, idle, for more."""
        clean = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        while True:
            self._waking = False
            while self._ready:
                row, key = self._ready.popleft()
                self._dispatch()  # in case this handler waits: the next row needs a runner
                try:
                    await self._execute(row, key)
                except Exception:  # _execute records every outcome; never lose the runner
                    log.exception("task %d: runner failed", key.id)
                if contextvars.copy_context() != clean:
                    # the handler left a context variable set: the next handler must not see it
                    self._runners.discard(asyncio.current_task())
                    self._dispatch()
                    return
            waiter = loop.create_future()
            self._idle.append(waiter)
            await waiter

    async def _execute(self, row: TaskRow, key: TaskKey) -> None:
        started = time.perf_counter() if self.metrics is not None else 0.0
        try:
            outcome = await self._attempt(row, key)
        except asyncio.CancelledError:
            # Shutdown grace ran out: hand the task back, this attempt not counted.
            self._outcomes.add(Outcome(key, OutcomeKind.RELEASE, error="worker shut down"))
            if self.metrics is not None:
                self.metrics.task_finished(row.queue, row.task_name, "pending", None)
            self._finished(key)
            raise
        except Exception as exc:  # deciding the outcome failed: never leave the row behind
            outcome = Outcome(key, OutcomeKind.DEAD, error=f"outcome failed: {error_text(exc)}")
        if outcome.kind is not _COMPLETE or outcome.error is not None:
            self._log_failure(row, outcome)
        if self.metrics is not None:
            seconds = time.perf_counter() - started
            self.metrics.task_finished(row.queue, row.task_name, outcome.kind.value, seconds)
        if self._overrun:
            overrun = self._overrun.pop(key, None)
            if overrun is not None:  # still running in its thread: no retry may overlap with it
                await asyncio.wait({overrun})
        self._outcomes.add(outcome if outcome.error is None else sanitized(outcome))
        self._finished(key)

    def _log_failure(self, row: TaskRow, outcome: Outcome) -> None:
        """One line for an attempt that failed: WARNING, or ERROR when it is dead-lettered."""
        kind = outcome.kind
        what = FAILURE_NEXT.get(kind, kind.value)
        fields: dict[str, Any] = {
            "task_id": row.id,
            "task_name": row.task_name,
            "attempt": row.attempt,
            "max_attempts": row.max_attempts,
            "outcome": kind.value,
        }
        if kind is OutcomeKind.RETRY and outcome.run_at is not None:
            wait = (outcome.run_at - self.app.clock()).total_seconds()
            fields["retry_at"] = f"{outcome.run_at.isoformat(timespec='milliseconds')}Z"
            what = f"retry at {fields['retry_at']} (in {max(0.0, wait):.1f}s)"
        log.log(
            logging.ERROR if kind is OutcomeKind.DEAD else logging.WARNING,
            "task %d %s attempt %d/%d failed: %s; %s",
            row.id,
            row.task_name,
            row.attempt,
            row.max_attempts,
            first_line(outcome.error),
            what,
            extra=fields,
        )

    def _finished(self, key: TaskKey) -> None:
        """The slot is free; the outcome is in the buffer (its lease still extended there)."""
        self._held.discard(key)
        self._slot_free.set()

    async def _attempt(self, row: TaskRow, key: TaskKey) -> Outcome:
        """Run one attempt and decide its outcome. Never raises for a bad row."""
        try:
            task = self.app.get_task(row.task_name)
        except LookupError as exc:
            return Outcome(key, OutcomeKind.DEAD, error=f"{exc} (worker {self.worker_id})")
        if row.attempt > row.max_attempts:
            error = f"attempt {row.attempt} exceeds max_attempts {row.max_attempts}"
            return Outcome(key, OutcomeKind.DEAD, error=error)
        if row.expires_at is not None and self.app.clock() > row.expires_at:
            return Outcome(key, OutcomeKind.DEAD, error=f"deadline {row.expires_at} passed")
        try:
            payload = payload_decode(row.payload, row.content_type)
        except PayloadError as exc:
            return Outcome(key, OutcomeKind.DEAD, error=f"cannot decode payload: {exc}")
        ctx = TaskContext(self.app, task, row, self.worker_id)
        self.stats.started += 1
        try:
            if self._traced:
                await self._traced_call(task, payload, ctx)
            else:
                await self._call(task, payload, ctx)
        except asyncio.CancelledError as exc:
            if self._stopping.is_set():  # the worker cancelled it: shutdown
                raise
            return outcome_for_exception(  # the handler raised it: a failure like any other
                key, task.policy, exc, now=self.app.clock(), max_attempts=row.max_attempts
            )
        except Exception as exc:
            return self._decided(ctx) or outcome_for_exception(
                key,
                task.policy,
                exc,
                now=self.app.clock(),
                expires_at=row.expires_at,
                max_attempts=row.max_attempts,
                checkpoint=ctx.new_checkpoint,
            )
        if ctx.decision is None and task.policy.ack_policy is not _MANUAL:
            return Outcome(key, _COMPLETE)  # the common case, without more calls
        return self._decided(ctx) or self._returned(ctx)

    async def _traced_call(self, task: Task, payload: Any, ctx: TaskContext) -> None:
        """`_call` inside an OpenTelemetry span continuing the enqueuer's trace."""
        try:
            headers = headers_decode(ctx.row.headers)
        except ValueError:
            headers = {}
        with tracing.attempt_span(ctx.row, headers) as span:
            try:
                await self._call(task, payload, ctx)
            except BaseException as exc:
                tracing.span_failed(span, exc)
                raise

    async def _call(self, task: Task, payload: Any, ctx: TaskContext) -> None:
        args = (payload, ctx) if task.wants_context else (payload,)
        timeout = task.options.timeout
        if task.is_async:
            if timeout is None:
                await task.handler(*args)
            else:
                await asyncio.wait_for(task.handler(*args), timeout)
            return
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def call() -> Any:
            loop.call_soon_threadsafe(started.set)
            return task.handler(*args)

        # the thread runs in a copy of this context: the handler sees the attempt's span
        future = loop.run_in_executor(self._threads, contextvars.copy_context().run, call)
        if timeout is None:
            result = await future
        else:
            await started.wait()  # the timeout counts from the start of the handler
            try:
                result = await asyncio.wait_for(asyncio.shield(future), timeout)
            except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                self._overrun[ctx.row.key] = future
                self.stats.overruns += 1
                raise
        if inspect.isawaitable(result):  # a callable object or wrapper returning a coroutine
            await asyncio.wait_for(result, timeout)

    def _returned(self, ctx: TaskContext) -> Outcome:
        """The handler returned without a manual decision."""
        key = ctx.row.key
        if ctx.task.policy.ack_policy is AckPolicy.MANUAL:
            return self._nack(ctx, "handler returned without ack/nack/reject (ack_policy manual)")
        return Outcome(key, OutcomeKind.COMPLETE)

    def _decided(self, ctx: TaskContext) -> Outcome | None:
        """The outcome the handler chose with ctx.ack()/nack()/reject()/drop(), if any."""
        decision = ctx.decision
        if decision is None:
            return None
        if decision.kind is OutcomeKind.RETRY:
            return self._nack(ctx, decision.reason, decision.delay)
        error = None if decision.kind is OutcomeKind.COMPLETE else decision.reason
        return Outcome(ctx.row.key, decision.kind, error=error)

    def _nack(
        self, ctx: TaskContext, reason: str, delay: float | timedelta | None = None
    ) -> Outcome:
        row = ctx.row
        return outcome_after_failure(
            row.key,
            ctx.task.policy,
            now=self.app.clock(),
            error=reason,
            delay=delay,
            expires_at=row.expires_at,
            max_attempts=row.max_attempts,
            checkpoint=ctx.new_checkpoint,
        )

    # -- leases -------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Extend every held lease (running, or finished but not yet written) in one statement."""
        pulse = self._pulses["heartbeat"]
        while not await event_wait(self._beat_stop, self.config.heartbeat_interval):
            # never waits for a flush: rows an outcome write has locked are left out
            keys = [*self._held, *self._outcomes.keys()]
            if keys:
                await self._leases_extend(keys)
            pulse.beat()

    async def _leases_extend(self, keys: list[TaskKey]) -> None:
        until = self.app.clock() + timedelta(seconds=self.config.lease)
        try:
            held = await self.driver.lease_extend_many(
                keys, lease_until=until, worker_id=self.worker_id
            )
            self._beat_outage.ok()
        except Exception as exc:
            self._beat_outage.failed(exc)
            return
        if held < len(keys):  # some may have been written meanwhile: count those still ours
            pending = set(self._outcomes.keys())
            lost = sum(1 for k in keys if k in self._held or k in pending) - held
            if lost > 0:
                log.warning("%d of %d leases were lost (rescued elsewhere)", lost, len(keys))

    # -- health -------------------------------------------------------------------------------

    def liveness(self) -> dict[str, Any]:
        """`live`: the claim loop and the heartbeat each turned within their interval plus
        `stall_after`, no outcome write has been under way longer than the heartbeat interval
        plus `stall_after`, and no loop has ended. Waiting for the database at start is live:
        a restart would not bring it."""
        if self._connecting:
            return {"live": True, "connecting": True, "seconds_since_turned": {}, "stuck": []}
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
        self._ready.clear()  # not started in time: handed back below
        late = len(self._held)
        runners = list(self._runners)
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        if late:
            log.warning("%d task(s) did not finish in time and were handed back", late)
        for key in list(self._held):  # cancelled before a runner took them: never started
            self._outcomes.add(Outcome(key, OutcomeKind.RELEASE, error="worker shut down"))
            self._finished(key)
