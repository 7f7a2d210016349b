"""What a handler sees of its task, and how it chooses the outcome by hand."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from txtasks.errors import LeaseLost, PayloadError
from txtasks.payload import headers_decode, result_encode
from txtasks.types import Outcome, OutcomeKind, Progress

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from txtasks.app import App, Task
    from txtasks.driver import Driver
    from txtasks.types import TaskRow


TASK_LOGGER = logging.getLogger("txtasks.task")
#: The longest note a progress report keeps.
PROGRESS_NOTE_CHARS = 200


class AttemptHost(Protocol):
    """What a context needs of the worker running its attempt."""

    driver: Driver
    archive_completed: bool

    def progress_report(self, row: TaskRow, report: Progress) -> None:
        """Keep the attempt's latest report, for the next progress write."""


@dataclass
class Decision:
    """A manual ack / nack / reject / drop recorded by the handler: the outcome it asks for
    (COMPLETE, RETRY, DEAD, DISCARD), why, and for a retry its delay."""

    kind: OutcomeKind
    reason: str = ""
    delay: float | timedelta | None = None


@dataclass(slots=True)
class TaskContext:
    """Passed as the second argument to handlers that take `(payload, ctx)`."""

    app: App
    task: Task
    row: TaskRow
    worker_id: str
    logger: logging.Logger = TASK_LOGGER
    decision: Decision | None = None
    new_checkpoint: str | None = None
    #: True once the worker has seen a cancel of this task (see docs/control.md): a sync
    #: handler polls it and returns; an async one gets `CancelledError` at its next await.
    #: Whatever the handler does next, the attempt is recorded as cancelled.
    cancelled: bool = False
    #: The worker running the attempt (None: a context made by hand, as in unit tests).
    host: AttemptHost | None = None
    #: The decoded payload the handler is called with (middleware may replace it).
    payload: Any = None
    #: The handler's transaction recorded the task's completion (`transaction()`).
    completed: bool = False
    #: The result `set_result` gave, as JSON text (None: not set).
    result_json: str | None = None
    _extra: dict[str, Any] | None = None

    @property
    def extra(self) -> dict[str, Any]:
        """Room for middleware: what a hook keeps for a later one (timers, spans, ...)."""
        if self._extra is None:
            self._extra = {}
        return self._extra

    @property
    def task_id(self) -> int:
        return self.row.id

    @property
    def attempt(self) -> int:
        """This attempt's number, starting at 1."""
        return self.row.attempt

    @property
    def max_attempts(self) -> int:
        return self.row.max_attempts

    @property
    def queue(self) -> str:
        return self.row.queue

    @property
    def key(self) -> str | None:
        """The key whose limits the task shares (see txtasks.keys); None without one."""
        return self.row.partition_key

    @property
    def headers(self) -> dict[str, str]:
        return headers_decode(self.row.headers)

    @property
    def checkpoint(self) -> Any:
        """What an earlier attempt saved with `save_checkpoint`, or None."""
        return None if self.row.checkpoint is None else json.loads(self.row.checkpoint)

    def save_checkpoint(self, value: Any) -> None:
        """Keep JSON state for the next attempt (stored when this attempt is retried)."""
        try:
            self.new_checkpoint = json.dumps(value, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"checkpoint is not JSON-serialisable: {exc}") from exc

    # -- transactional completion -------------------------------------------------------------

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """`async with ctx.transaction() as conn:` a transaction on the application's database
        that also records this task's completion: the handler's writes on `conn` (and tasks
        it enqueues with `enqueue_tx(conn, ...)`) commit together with the completion, or not
        at all. The attempt is locked first, fenced on its attempt and worker: if its lease
        was lost, `LeaseLost` is raised and nothing is written. An exception in the block rolls
        everything back, and the attempt fails as any other."""
        return self._transaction_async()

    @contextlib.asynccontextmanager
    async def _transaction_async(self) -> AsyncIterator[AsyncConnection]:
        driver = self._transactional()
        async with driver.claims.attempt_transaction(
            self.row.key, worker_id=self.worker_id, finish=self
        ) as conn:
            yield conn
        self.completed = True

    @contextlib.contextmanager
    def transaction_sync(self) -> Iterator[Connection]:
        """`with ctx.transaction_sync() as conn:` the same for sync handlers, on a sync
        `Connection`."""
        driver = self._transactional()
        with driver.claims.attempt_transaction_sync(
            self.row.key, worker_id=self.worker_id, finish=self
        ) as conn:
            yield conn
        self.completed = True

    def _transactional(self) -> Driver:
        if self.completed:
            raise LeaseLost(f"task {self.task_id} already completed in its transaction")
        return self.host.driver if self.host is not None else self.app.driver

    def outcome(self) -> Outcome:
        """The completion its transaction records (with the result set so far, if it keeps
        its result)."""
        if not self.task.options.keep_result:
            return Outcome(self.row.key, OutcomeKind.COMPLETE)
        return Outcome(self.row.key, OutcomeKind.COMPLETE, result=self.result_json or "null")

    def now(self) -> datetime:
        return self.app.clock()

    @property
    def archive_completed(self) -> bool:
        return self.host.archive_completed if self.host is not None else True

    # -- results and progress ------------------------------------------------------------------

    def set_result(self, value: Any) -> None:
        """The result to keep (a task with `keep_result=True`), instead of the handler's
        return value: for a handler that completes in `transaction()`, set it before the block
        ends. Raises PayloadError if it is not JSON-serialisable or over `max_payload_bytes`."""
        self.result_json = result_encode(value, limit=self.app.max_payload_bytes)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the attempt got. Cheap: the latest report of each attempt is stored
        within the worker's `progress_interval` (1 s by default; one write per interval for
        all its attempts, however many reports), shown by `txtasks inspect` and the worker's
        metrics."""
        if note is not None and len(note) > PROGRESS_NOTE_CHARS:
            note = note[: PROGRESS_NOTE_CHARS - 3] + "..."
        report = Progress(done, total, note, self.row.attempt)
        if self.host is not None:
            self.host.progress_report(self.row, report)

    # -- manual acknowledgement ----------------------------------------------------------------

    def ack(self) -> None:
        """Complete the task, whatever the handler does next."""
        self.decision = Decision(OutcomeKind.COMPLETE)

    def nack(self, reason: str = "nack", *, delay: float | timedelta | None = None) -> None:
        """Retry the task (with the strategy's backoff, or `delay` seconds)."""
        self.decision = Decision(OutcomeKind.RETRY, reason, delay)

    def reject(self, reason: str = "rejected") -> None:
        """Dead-letter the task now."""
        self.decision = Decision(OutcomeKind.DEAD, reason)

    def drop(self, reason: str = "dropped") -> None:
        """Archive the task as discarded; it is never retried."""
        self.decision = Decision(OutcomeKind.DISCARD, reason)
