"""Running claimed attempts: the runners, one attempt's outcome, the handler call.

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
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from txtasks.errors import LeaseLost, PayloadError
from txtasks.middleware import AttemptEnd, Middleware
from txtasks.payload import payload_decode, result_encode
from txtasks.policy import (
    AckPolicy,
    error_text,
    outcome_after_failure,
    outcome_for_exception,
    sanitized,
)
from txtasks.topics import delivery_note
from txtasks.types import Outcome, OutcomeKind, Progress, TaskKey, TaskRow
from txtasks.worker.config import WorkerStats
from txtasks.worker.context import TaskContext
from txtasks.worker.outcomes import OutcomeBuffer
from txtasks.worker.progress import ProgressWriter

if TYPE_CHECKING:
    from txtasks.app import App
    from txtasks.driver import Driver
    from txtasks.metrics import Metrics
    from txtasks.task import Task

log = logging.getLogger("txtasks.worker")

#: What the log line of a failed attempt says happens next, by outcome (a retry: its time).
FAILURE_NEXT = {
    OutcomeKind.DEAD: "dead-lettered",
    OutcomeKind.DISCARD: "discarded",
    OutcomeKind.FAIL: "failed for good",
    OutcomeKind.COMPLETE: "completed anyway (ack_policy complete)",
}
#: The longest error a log line shows (the task row keeps the whole text).
LOGGED_ERROR_CHARS = 300
#: Seconds the idle threads of the handler pool get, in all, to end once the pool is shut down.
THREADS_EXIT_WITHIN = 1.0
#: Enum members read once: `Enum.MEMBER` is a slow lookup, paid for every task otherwise.
_COMPLETE = OutcomeKind.COMPLETE
_CANCEL = OutcomeKind.CANCEL
#: The errors of cancelled attempts.
CANCELLED_RUNNING = "cancelled while running"
NOT_STARTED = "cancelled before its handler started"
_MANUAL = AckPolicy.MANUAL
#: The error of an attempt handed back at shutdown.
SHUT_DOWN = "worker shut down"


def first_line(error: str | None) -> str:
    """The first line of an error text, bounded, for a log line."""
    line = (error or "no reason given").strip().partition("\n")[0]
    return line if len(line) <= LOGGED_ERROR_CHARS else line[:LOGGED_ERROR_CHARS] + "..."


class Runner:
    """Runs a worker's claimed attempts and records their outcomes in its buffer.

    The worker puts each claimed row in `ready` (its key in `held`), then calls `dispatch()`;
    `finished()` frees the slot (`held` and `slot_free` are the worker's).
    """

    def __init__(
        self,
        app: App,
        *,
        worker_id: str,
        concurrency: int,
        stats: WorkerStats,
        outcomes: OutcomeBuffer,
        held: set[TaskKey],
        slot_free: asyncio.Event,
        stopping: asyncio.Event,
        metrics: Metrics | None,
        progress: ProgressWriter | None = None,
        freed: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.stats = stats
        self.metrics = metrics
        self._outcomes = outcomes
        #: Claimed attempts not finished yet: waiting for a runner, or running.
        self._held = held
        self._slot_free = slot_free
        #: Called when a slot frees, after `slot_free` is set.
        self._freed = freed
        self._stopping = stopping
        #: Claimed rows no runner has taken yet, in claim order.
        self.ready: deque[tuple[TaskRow, TaskKey]] = deque()
        self._runners: set[asyncio.Task[None]] = set()
        #: Runners with nothing to do, each waiting on its future.
        self._idle: deque[asyncio.Future[None]] = deque()
        #: A runner was woken (or created) and has not looked at the ready rows yet.
        self._waking = False
        #: The context every handler starts in (a copy of the one `run()` was called in).
        self._base_context = contextvars.copy_context()
        #: The application's middleware, after the built-in ones the worker enables (metrics,
        #: tracing): set by the worker once a claimed batch; a task's own come after them.
        self.chain: tuple[Middleware, ...] = app._middleware
        self.threads: ThreadPoolExecutor | None = None
        #: Sync handlers still running in their thread after their timeout (by task id).
        self._overrun: dict[TaskKey, asyncio.Future[Any]] = {}
        #: Attempts whose handler's transaction recorded the outcome (or found the lease lost).
        self._handled: set[TaskKey] = set()
        #: The store handlers' transactions use, and whether completed tasks are archived.
        self.driver: Driver = outcomes.driver
        self.archive_completed = outcomes.archive_completed
        #: Where progress reports go to be stored (coalesced, spaced).
        self.progress = progress or ProgressWriter(
            self.driver, app.clock, interval=1.0, lease=30.0, worker_id=worker_id
        )
        #: Attempts whose handler is running: their context, and for an async handler the
        #: asyncio task it runs in (a cancel is delivered there).
        self._running: dict[TaskKey, tuple[TaskContext, asyncio.Task[Any] | None]] = {}

    # -- the runners --------------------------------------------------------------------------

    def open(self) -> None:
        """Start serving: handlers start in the current context, sync ones in a thread pool."""
        self._base_context = contextvars.copy_context()
        self.threads = ThreadPoolExecutor(self.concurrency, thread_name_prefix="txtasks")

    def close(self) -> None:
        """Let go of the thread pool; a sync handler still running keeps its thread."""
        if self.threads is not None:
            self.threads.shutdown(wait=False, cancel_futures=True)

    def threads_busy(self, within: float = THREADS_EXIT_WITHIN) -> bool:
        """After `close()`: whether a thread of the pool is still running a sync handler. Idle
        threads end as soon as they see the pool shut down: each gets up to `within` seconds
        in all to do so."""
        threads = list(getattr(self.threads, "_threads", ()))
        deadline = time.monotonic() + within
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return any(thread.is_alive() for thread in threads)

    def cancel(self) -> list[asyncio.Task[None]]:
        """Drop the rows no runner has taken (handed back at shutdown) and cancel the runners."""
        self.ready.clear()
        runners = list(self._runners)
        for runner in runners:
            runner.cancel()
        return runners

    async def shut_down(self) -> None:
        """`cancel()`, then wait until every runner has ended."""
        await asyncio.gather(*self.cancel(), return_exceptions=True)

    def cancel_attempts(self, keys: Iterable[TaskKey]) -> int:
        """A cancel of these attempts was asked for: a handler running sees `ctx.cancelled`
        (and an async one `CancelledError` at its next await); a row not started yet is
        recorded as cancelled at once. How many were not known to be cancelled yet."""
        count = 0
        for key in keys:
            running = self._running.get(key)
            if running is not None:
                ctx, task = running
                if not ctx.cancelled:
                    ctx.cancelled = True
                    count += 1
                    if task is not None:
                        task.cancel()
                continue
            waiting = next((item for item in self.ready if item[1] == key), None)
            if waiting is not None:
                self.ready.remove(waiting)
                self._outcomes.add(Outcome(key, OutcomeKind.CANCEL, error=NOT_STARTED))
                self.finished(key)
                count += 1
        return count

    def dispatch(self) -> None:
        """Rows are ready: make sure a runner will look at them, unless one already will."""
        if self._waking or not self.ready:
            return
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():  # not a runner cancelled while idle
                waiter.set_result(None)
                self._waking = True
                return
        if len(self._runners) < self.concurrency:
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
            while self.ready:
                row, key = self.ready.popleft()
                self.dispatch()  # in case this handler waits: the next row needs a runner
                try:
                    await self._execute(row, key)
                except Exception:  # _execute records every outcome; never lose the runner
                    log.exception("task %d: runner failed", key.id)
                if contextvars.copy_context() != clean:
                    # the handler left a context variable set: the next handler must not see it
                    self._runners.discard(asyncio.current_task())
                    self.dispatch()
                    return
            waiter = loop.create_future()
            self._idle.append(waiter)
            await waiter

    async def _execute(self, row: TaskRow, key: TaskKey) -> None:
        try:
            outcome = await self._attempt(row, key)
        except asyncio.CancelledError:
            # Shutdown grace ran out: hand the task back, this attempt not counted.
            self._outcomes.add(Outcome(key, OutcomeKind.RELEASE, error=SHUT_DOWN))
            self.finished(key)
            raise
        except Exception as exc:  # deciding the outcome failed: never leave the row behind
            outcome = Outcome(key, OutcomeKind.DEAD, error=f"outcome failed: {error_text(exc)}")
        outcome = sanitized(outcome)  # stored, and logged, as text every sink can encode
        if outcome.kind is _CANCEL:
            log.info("task %d %s attempt %d cancelled", row.id, row.task_name, row.attempt)
        elif outcome.kind is not _COMPLETE or outcome.error is not None:
            self._log_failure(row, outcome)
        if self._overrun:
            overrun = self._overrun.pop(key, None)
            if overrun is not None:  # still running in its thread: no retry may overlap with it
                await asyncio.wait({overrun})
        if self._handled and key in self._handled:  # written by the handler's transaction
            self._handled.discard(key)
            if outcome.kind is _COMPLETE:  # else the lease was lost: nothing to count
                self._outcomes.written_elsewhere(outcome)
        else:
            self._outcomes.add(outcome)
        self.finished(key)

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

    def progress_report(self, row: TaskRow, report: Progress) -> None:
        """Keep an attempt's latest report for the next progress write (older ones not stored
        yet are replaced)."""
        self.progress.report(row.key, report.to_json())
        if self.metrics is not None:
            self.metrics.task_progress(row.queue, row.task_name, report)

    def finished(self, key: TaskKey) -> None:
        """The slot is free; the outcome is in the buffer (its lease still extended there)."""
        self._held.discard(key)
        self._slot_free.set()
        if self._freed is not None:
            self._freed()

    async def _attempt(self, row: TaskRow, key: TaskKey) -> Outcome:
        """Run one attempt and decide its outcome. Never raises for a bad row."""
        try:
            task = self.app.get_task(row.task_name)
        except LookupError as exc:
            return self._refused(
                row, f"{exc} (worker {self.worker_id}){delivery_note(row.headers)}"
            )
        if row.attempt > row.max_attempts:
            return self._refused(
                row, f"attempt {row.attempt} exceeds max_attempts {row.max_attempts}"
            )
        if row.expires_at is not None and self.app.clock() > row.expires_at:
            return self._refused(row, f"deadline {row.expires_at} passed")
        try:
            payload = payload_decode(row.payload, row.content_type)
        except PayloadError as exc:
            return self._refused(row, f"cannot decode payload: {exc}")
        ctx = TaskContext(self.app, task, row, self.worker_id, host=self, payload=payload)
        self.stats.started += 1
        self._running[key] = (ctx, asyncio.current_task() if task.is_async else None)
        try:
            if self.chain or task.options.middleware:
                return await self._attempt_chained(task, ctx)
            try:
                value = await self._call(task, payload, ctx)
            except asyncio.CancelledError as exc:
                if self._stopping.is_set():  # the worker cancelled it: shutdown
                    raise
                return self._failed(ctx, exc)  # the task's cancel, or the handler raised it
            except Exception as exc:
                return self._failed(ctx, exc)
        finally:
            self._running.pop(key, None)
        if ctx.completed:
            return self._written_by_handler(ctx)
        if ctx.cancelled:
            return self._cancelled(ctx)
        if ctx.decision is None and task.policy.ack_policy is not _MANUAL:
            if task.options.keep_result:
                return self._kept(ctx, value)
            return Outcome(key, _COMPLETE)  # the common case, without more calls
        return self._decided(ctx, value) or self._returned(ctx, value)

    def _refused(self, row: TaskRow, error: str) -> Outcome:
        """A row dead-lettered before any attempt started: no middleware sees it (there is no
        attempt), so the metrics count it here."""
        if self.metrics is not None:
            self.metrics.task_finished(row.queue, row.task_name, OutcomeKind.DEAD.value, None)
        return Outcome(row.key, OutcomeKind.DEAD, error=error)

    def _failed(self, ctx: TaskContext, exc: BaseException) -> Outcome:
        """The outcome of an attempt whose handler raised `exc`."""
        row = ctx.row
        if ctx.completed or isinstance(exc, LeaseLost):
            if ctx.completed:
                log.warning("task %d raised after its transaction completed it: %r", row.id, exc)
            return self._written_by_handler(ctx)
        if ctx.cancelled:  # whatever the handler raised after the worker saw the cancel
            return self._cancelled(ctx)
        cancelled = isinstance(exc, asyncio.CancelledError)
        return (None if cancelled else self._decided(ctx, None)) or outcome_for_exception(
            row.key,
            ctx.task.policy,
            exc,
            now=self.app.clock(),
            expires_at=row.expires_at,
            max_attempts=row.max_attempts,
            checkpoint=ctx.new_checkpoint,
        )

    def _written_by_handler(self, ctx: TaskContext) -> Outcome:
        """The handler's transaction recorded the completion, or found the attempt lost:
        nothing is left to write (`_execute` skips it)."""
        self._handled.add(ctx.row.key)
        if ctx.completed:
            return ctx.outcome()
        return Outcome(
            ctx.row.key,
            OutcomeKind.RELEASE,
            error="lease lost (taken over elsewhere): nothing written",
        )

    def _kept(self, ctx: TaskContext, value: Any) -> Outcome:
        """A completion that keeps its result: `set_result`'s, or the return value."""
        result = ctx.result_json
        if result is None:
            try:
                result = result_encode(value, limit=self.app.max_payload_bytes)
            except PayloadError as exc:
                return self._failed(ctx, exc)
        return Outcome(ctx.row.key, _COMPLETE, result=result)

    async def _attempt_chained(self, task: Task, ctx: TaskContext) -> Outcome:
        """The attempt inside its middleware: the built-in ones and the application's
        (`chain`), then the task's. An attempt cut short by a shutdown is seen as handed
        back (outcome `pending`) before the cancel goes on."""
        chain = (*self.chain, *task.options.middleware)
        entered: list[Middleware] = []
        started = time.perf_counter()
        value: Any = None
        error: BaseException | None = None
        shutdown = False
        try:
            for middleware in chain:
                entered.append(middleware)
                done = middleware.before_attempt(ctx)
                if done is not None:
                    await done
            value = await self._call(task, ctx.payload, ctx)
        except asyncio.CancelledError as exc:
            if self._stopping.is_set():
                shutdown = True
                error, outcome = exc, Outcome(ctx.row.key, OutcomeKind.RELEASE, error=SHUT_DOWN)
            else:
                error, outcome = exc, self._failed(ctx, exc)
        except Exception as exc:
            error, outcome = exc, self._failed(ctx, exc)
        else:
            if ctx.completed:
                outcome = self._written_by_handler(ctx)
            elif ctx.cancelled:
                outcome = self._cancelled(ctx)
            elif ctx.decision is None and task.policy.ack_policy is not _MANUAL:
                outcome = (
                    self._kept(ctx, value)
                    if task.options.keep_result
                    else Outcome(ctx.row.key, _COMPLETE)
                )
            else:
                outcome = self._decided(ctx, value) or self._returned(ctx, value)
        end = AttemptEnd(outcome, value, error, time.perf_counter() - started)
        for middleware in reversed(entered):
            try:
                done = middleware.after_attempt(ctx, end)
                if done is not None:
                    await done
            except Exception:
                log.exception(
                    "task %d: middleware %r failed after the attempt", ctx.row.id, middleware
                )
        if shutdown:
            raise error  # type: ignore[misc]
        return outcome

    def _cancelled(self, ctx: TaskContext) -> Outcome:
        """The attempt of a task whose cancel the worker saw: recorded as cancelled, whatever
        the handler did after. The cancel delivered to an async handler is spent here."""
        running = asyncio.current_task()
        uncancel = getattr(running, "uncancel", None)  # Python 3.11+
        if ctx.task.is_async and uncancel is not None and running.cancelling():  # type: ignore[union-attr]
            uncancel()
        return Outcome(ctx.row.key, OutcomeKind.CANCEL, error=CANCELLED_RUNNING)

    async def _call(self, task: Task, payload: Any, ctx: TaskContext) -> Any:
        """Run the handler (sync ones in the thread pool); what it returned."""
        args = (payload, ctx) if task.wants_context else (payload,)
        timeout = task.options.timeout
        if task.is_async:
            if timeout is None:
                return await task.handler(*args)
            return await asyncio.wait_for(task.handler(*args), timeout)
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def call() -> Any:
            loop.call_soon_threadsafe(started.set)
            return task.handler(*args)

        # the thread runs in a copy of this context: the handler sees the attempt's span
        future = loop.run_in_executor(self.threads, contextvars.copy_context().run, call)
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
            return await asyncio.wait_for(result, timeout)
        return result

    def _returned(self, ctx: TaskContext, value: Any) -> Outcome:
        """The handler returned without a manual decision."""
        key = ctx.row.key
        if ctx.task.policy.ack_policy is AckPolicy.MANUAL:
            return self._nack(ctx, "handler returned without ack/nack/reject (ack_policy manual)")
        if ctx.task.options.keep_result:
            return self._kept(ctx, value)
        return Outcome(key, OutcomeKind.COMPLETE)

    def _decided(self, ctx: TaskContext, value: Any) -> Outcome | None:
        """The outcome the handler chose with ctx.ack()/nack()/reject()/drop(), if any."""
        decision = ctx.decision
        if decision is None:
            return None
        if decision.kind is OutcomeKind.RETRY:
            return self._nack(ctx, decision.reason, decision.delay)
        if decision.kind is OutcomeKind.COMPLETE and ctx.task.options.keep_result:
            return self._kept(ctx, value)
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
