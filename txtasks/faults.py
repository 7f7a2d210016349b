"""Telling faults apart, and logging them once.

A task's outcome is a verdict on the task; a lost connection, a timeout or a deadlock is not.
`refused_value` says which errors are about the values written (retrying the same write can
never succeed), and `Outage` turns a run of failures into two log lines: one when it starts,
one when it ends.
"""

from __future__ import annotations

import logging
import time

#: SQLSTATE classes about the values of a statement: data exception, integrity violation.
REFUSED_SQLSTATE_CLASSES = ("22", "23")
#: Exception class names (drivers and SQLAlchemy alike) for a value the database refused.
REFUSED_CLASS_NAMES = frozenset(
    {"DataError", "IntegrityError", "IntegrityConstraintViolationError", "UnicodeError"}
)


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception, the driver error SQLAlchemy wrapped (`orig`) and the explicit causes."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 8:
        current = todo.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [getattr(current, "orig", None), current.__cause__]
    return seen


def refused_value(exc: BaseException) -> bool:
    """True when the database (or the driver encoding for it) refused a value of the statement.

    False for everything else: a connection lost or reset, a timeout, a deadlock, a server
    shutting down, a missing table. Those are about the database, not about what was written,
    and the same write may succeed later.
    """
    for cause in _causes(exc):
        if isinstance(cause, (OSError, TimeoutError, ConnectionError)):
            return False
        sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate[:2] in REFUSED_SQLSTATE_CLASSES:
            return True
        if any(k.__name__ in REFUSED_CLASS_NAMES for k in type(cause).__mro__):
            return True
        if type(cause) in (ValueError, TypeError, OverflowError):
            return True  # raised in Python before anything reached the database
    return False


class Outage:
    """One WARNING when a run of failures starts, one INFO when it ends; DEBUG in between.

    `failed(exc)` after each failure, `ok()` after each success (cheap when nothing failed).
    """

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.failures = 0
        self._since = 0.0

    @property
    def down(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException, retry_in: float | None = None) -> None:
        self.failures += 1
        then = f"; retrying in {retry_in:.1f}s" if retry_in is not None else ""
        if self.failures == 1:
            self._since = time.monotonic()
            self.logger.warning("%s failed: %s%s", self.what, describe(exc), then)
        else:
            self.logger.debug("%s failed again (%d): %s", self.what, self.failures, describe(exc))

    def ok(self) -> None:
        if self.failures:
            took = time.monotonic() - self._since
            self.logger.info(
                "%s works again after %.1fs and %d failure(s)", self.what, took, self.failures
            )
            self.failures = 0


def describe(exc: BaseException) -> str:
    """One line naming the error: its text, or its type when the text is empty. For an error
    SQLAlchemy wrapped, the driver's own error, without the statement and its parameters."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        return f"{type(orig).__name__}: {describe(orig)}"
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text:
        return name
    return text if len(text) <= 300 else text[:300] + "..."
