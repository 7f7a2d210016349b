"""What a handler sees of its task, and how it chooses the outcome by hand."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from txtasks.errors import PayloadError
from txtasks.payload import headers_decode
from txtasks.types import OutcomeKind

if TYPE_CHECKING:
    from txtasks.app import App, Task
    from txtasks.types import TaskRow


TASK_LOGGER = logging.getLogger("txtasks.task")


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
