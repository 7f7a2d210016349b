"""Middleware: hooks around every attempt (and every enqueue), run in order.

A middleware subclasses `Middleware` and overrides the hooks it needs. The `before_attempt`
hooks run in registration order (the application's, then the task's) before the handler, the
`after_attempt` hooks in the reverse order after it: an onion. An attempt hook may be sync or
async; both run on the worker's event loop, so a sync one must not block.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txtasks.types import NewTask, Outcome
    from txtasks.worker.context import TaskContext


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How an attempt ended, as the `after_attempt` hooks see it."""

    #: What is recorded: its kind (completed, retryable, dead, discarded...) and error.
    outcome: Outcome
    #: What the handler returned (None when it raised, or did not run).
    value: Any
    #: What the handler (or a `before_attempt` hook) raised, or None.
    exception: BaseException | None
    #: Seconds from the first `before_attempt` hook to the outcome.
    seconds: float


class Middleware:
    """Base class of middleware; every hook does nothing unless overridden."""

    def before_attempt(self, ctx: TaskContext) -> Awaitable[None] | None:
        """Before the handler: read or change `ctx` (`ctx.payload`, `ctx.extra`). Raising
        `Drop`, `Retry` or `Reject` (or any exception) short-circuits the attempt: the handler
        and the later hooks do not run, the outcome is what that exception means for a handler
        (discarded, retried, dead-lettered; another exception: the task's ack policy), and the
        `after_attempt` hooks of the middleware already entered still run."""
        return None

    def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> Awaitable[None] | None:
        """After the outcome is decided (not yet written): see it, time it, trace it. An
        exception here is logged and does not change the outcome."""
        return None

    def before_enqueue(self, rows: Sequence[NewTask]) -> Sequence[NewTask] | None:
        """Before the application writes tasks (every enqueue, in a transaction of its own or
        the caller's; every publish to a topic; every periodic fire): return changed rows
        (e.g. with headers added, `dataclasses.replace`) or None to keep them; raise to refuse
        the call (nothing is written). Always sync: enqueues can be.

        A publish comes as one row for the tasks of all its groups: `topic` set, `task_name`
        and `queue` empty (see docs/middleware.md)."""
        return None
