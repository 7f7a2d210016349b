"""What happens to a task after an attempt: the one policy the worker and the cleaner share."""

from __future__ import annotations

import enum
import linecache
import re
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType

from txtasks.clock import seconds
from txtasks.errors import Drop, Reject, Retry
from txtasks.retry import RetryStrategy
from txtasks.types import Outcome, OutcomeKind, TaskKey

#: The longest error text a task row keeps (the exception, its traceback and causes).
MAX_ERROR_CHARS = 16_000
#: Frames of each exception's stack an error text shows (the innermost), and the exceptions of
#: a chain (the one raised, then what caused it or was being handled).
MAX_ERROR_FRAMES = 50
MAX_ERROR_CHAIN = 5
#: Room left after an error text for what the policy adds ("(attempt 3 of 3)").
_ERROR_MARGIN = 200


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
    message, then its traceback (outermost frame first, by module name: never a file path),
    then the exception that caused it or was being handled, with its own, and so on."""
    parts = [_exception_text(exc)]
    seen = {id(exc)}
    while len(parts) < MAX_ERROR_CHAIN:
        cause, how = _cause_of(exc)
        if cause is None or id(cause) in seen:
            break
        parts.append(f"{how}: {_exception_text(cause)}")
        exc = cause
        seen.add(id(exc))
    return "\n".join(parts)[: MAX_ERROR_CHARS - _ERROR_MARGIN]


def _cause_of(exc: BaseException) -> tuple[BaseException | None, str]:
    """The exception `exc` was raised from, or the one being handled when it was raised."""
    if exc.__cause__ is not None:
        return exc.__cause__, "caused by"
    if exc.__context__ is not None and not exc.__suppress_context__:
        return exc.__context__, "while handling"
    return None, ""


def _exception_text(exc: BaseException) -> str:
    """One exception's message and the innermost frames of its traceback."""
    if isinstance(exc, SyntaxError):  # its standard text starts with the file's path
        text = f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    else:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    text = text[: MAX_ERROR_CHARS // 4]
    frames = list(traceback.walk_tb(exc.__traceback__))
    if len(frames) > MAX_ERROR_FRAMES:
        text += f"\n  ... {len(frames) - MAX_ERROR_FRAMES} outer frames not kept"
        frames = frames[-MAX_ERROR_FRAMES:]
    return text + "".join(_frame_line(frame, line) for frame, line in frames)


def _frame_line(frame: FrameType, line: int) -> str:
    """`  at module.function line N: source`, without the file's path."""
    module = frame.f_globals.get("__name__", "?")
    source = linecache.getline(frame.f_code.co_filename, line, frame.f_globals).strip()
    return f"\n  at {module}.{frame.f_code.co_name} line {line}{': ' if source else ''}{source}"


#: Lines the retry policy appends to an error text, which say nothing about the exception.
_POLICY_SUFFIX = re.compile(r"^\((attempt \d+ of \d+|deadline .* passed)\)$")


def error_summary(text: str | None) -> str:
    """The line of a stored error that names the exception: its first line (txtasks stores the
    exception before its traceback), or for a Python traceback its last line that is neither a
    frame nor what the retry policy appended."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if not lines[0].startswith("Traceback (most recent call last)"):
        return lines[0]
    for line in reversed(lines):
        if not line[:1].isspace() and not _POLICY_SUFFIX.match(line):
            return line
    return lines[0]


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
