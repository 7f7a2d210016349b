"""What happens to a task after an attempt: the one policy the worker and the cleaner share."""

from __future__ import annotations

import enum
import linecache
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType

from txtasks.clock import seconds
from txtasks.errors import Drop, Reject, Retry
from txtasks.retry import RetryStrategy
from txtasks.types import Outcome, OutcomeKind, TaskKey

MAX_ERROR_CHARS = 4000
#: Frames of the stack an error text shows (the innermost).
MAX_ERROR_FRAMES = 5


class AckPolicy(str, enum.Enum):
    """What an exception other than Retry / Drop / Reject does to the task."""

    RETRY = "retry"  # nack: retry with the strategy until max_attempts, then dead-letter
    DEAD_LETTER = "dead_letter"  # reject: dead-letter at once
    DISCARD = "discard"  # drop: archive as discarded, never retried
    COMPLETE = "complete"  # ack anyway: archive as completed (the error is kept)
    MANUAL = "manual"  # the handler calls ctx.ack()/nack()/reject(); if it does not: retry


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The retry rules of one task (how many attempts a task gets is its row's `max_attempts`,
    set at enqueue)."""

    strategy: RetryStrategy
    ack_policy: AckPolicy = AckPolicy.RETRY


def clean_text(value: object, limit: int = MAX_ERROR_CHARS) -> str:
    """Text every database stores: a string, bounded, without NUL or unencodable characters."""
    text = value if isinstance(value, str) else str(value)
    text = text.replace("\x00", "\\0")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:limit]


def sanitized(outcome: Outcome) -> Outcome:
    """The outcome with a storable error text."""
    if outcome.error is None:
        return outcome
    return outcome._replace(error=clean_text(outcome.error))


def error_text(exc: BaseException) -> str:
    """A readable, bounded description of an exception for the `last_error` column: its
    message, then where it was raised (the last frames, by module name: never a file path)."""
    if isinstance(exc, SyntaxError):  # its standard text starts with the file's path
        text = f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    else:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = list(traceback.walk_tb(exc.__traceback__))[-MAX_ERROR_FRAMES:]
    text += "".join(_frame_line(frame, line) for frame, line in frames)
    return text[:MAX_ERROR_CHARS]


def _frame_line(frame: FrameType, line: int) -> str:
    """`  at module.function line N: source`, without the file's path."""
    module = frame.f_globals.get("__name__", "?")
    source = linecache.getline(frame.f_code.co_filename, line, frame.f_globals).strip()
    return f"\n  at {module}.{frame.f_code.co_name} line {line}{': ' if source else ''}{source}"


def outcome_after_failure(
    key: TaskKey,
    policy: RetryPolicy,
    *,
    now: datetime,
    error: str,
    max_attempts: int,
    delay: float | timedelta | None = None,
    expires_at: datetime | None = None,
    checkpoint: str | None = None,
) -> Outcome:
    """A nack: retry after the backoff while attempts and the deadline allow, else dead-letter.

    Used by the worker for a failed attempt and by the cleaner for an expired lease.
    """
    if key.attempt >= max_attempts:
        error = f"{error}\n(attempt {key.attempt} of {max_attempts})"
        return Outcome(key, OutcomeKind.DEAD, error=error)
    wait = policy.strategy.delay(key.attempt) if delay is None else max(0.0, seconds(delay))
    try:
        run_at = now + timedelta(seconds=wait)
    except OverflowError:
        run_at = datetime.max
    if expires_at is not None and run_at > expires_at:
        return Outcome(key, OutcomeKind.DEAD, error=f"{error}\n(deadline {expires_at} passed)")
    return Outcome(key, OutcomeKind.RETRY, error=error, run_at=run_at, checkpoint=checkpoint)


def outcome_for_exception(
    key: TaskKey,
    policy: RetryPolicy,
    exc: BaseException,
    *,
    now: datetime,
    max_attempts: int,
    expires_at: datetime | None = None,
    checkpoint: str | None = None,
) -> Outcome:
    """Map what a handler raised to the outcome the database records."""
    if isinstance(exc, Drop):
        return Outcome(key, OutcomeKind.DISCARD, error=exc.reason)
    if isinstance(exc, Reject):
        return Outcome(key, OutcomeKind.DEAD, error=exc.reason)
    if isinstance(exc, Retry):
        return outcome_after_failure(
            key,
            policy,
            now=now,
            error=exc.reason,
            delay=exc.delay,
            expires_at=expires_at,
            max_attempts=max_attempts,
            checkpoint=checkpoint,
        )
    text = error_text(exc)
    if policy.ack_policy is AckPolicy.DEAD_LETTER:
        return Outcome(key, OutcomeKind.DEAD, error=text)
    if policy.ack_policy is AckPolicy.DISCARD:
        return Outcome(key, OutcomeKind.DISCARD, error=text)
    if policy.ack_policy is AckPolicy.COMPLETE:
        return Outcome(key, OutcomeKind.COMPLETE, error=text)
    return outcome_after_failure(
        key,
        policy,
        now=now,
        error=text,
        expires_at=expires_at,
        max_attempts=max_attempts,
        checkpoint=checkpoint,
    )
