"""Telling faults apart, and logging them once.

A task's outcome is a verdict on the task; a lost connection, a timeout or a deadlock is not.
`refused_value` says which errors are about the values written (retrying the same write can
never succeed), and `Outage` turns a run of failures into two log lines: one when it starts,
one when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from txtasks.driver.urls import url_safe

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


#: SQLSTATE classes of a server that cannot take the connection now: connection exceptions,
#: and operator intervention (shutting down, starting up, too many connections).
UNREACHABLE_SQLSTATE_PREFIXES = ("08", "57P", "53300")
#: MySQL/MariaDB client and server errors of the same kind: can't connect (2002, 2003), server
#: gone or connection lost (2006, 2013, 2055), too many connections (1040), shutting down (1053).
UNREACHABLE_MYSQL_ERRNOS = frozenset({1040, 1053, 2002, 2003, 2006, 2013, 2055})


def unreachable(exc: BaseException) -> bool:
    """True when the database could not be reached or lost the connection: it is down,
    starting, full, or the network failed. False for a refused login, an unknown database, a
    missing table or a schema to migrate: waiting does not mend those."""
    for cause in _causes(exc):
        if isinstance(cause, (OSError, TimeoutError, ConnectionError)):
            return True
        sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate.startswith(UNREACHABLE_SQLSTATE_PREFIXES):
            return True
        args = getattr(cause, "args", ())
        if args and isinstance(args[0], int) and args[0] in UNREACHABLE_MYSQL_ERRNOS:
            return True
        if type(cause).__name__ in ("ConnectionDoesNotExistError", "InterfaceError"):
            return True  # asyncpg: closed under an operation; DB-API: the link is gone
    return False


def backoff_next(previous: float, first: float, most: float) -> float:
    """The wait before the next retry of a failing operation: `first` after one failure (a
    `previous` of 0), then double the previous wait, never more than `most`."""
    return min(most, max(first, previous * 2))


async def open_when_reachable(
    driver: Any, logger: logging.Logger, stopping: asyncio.Event, *, cap: float = 5.0
) -> bool:
    """`driver.open()` until it works, waiting with capped, jittered backoff while the database
    is unreachable (logged once when it starts failing, once when it works, naming the URL
    without its password). Any other error raises. False when `stopping` was set first."""
    url = getattr(driver, "url", None)
    what = f"connecting to {url_safe(url) if url is not None else 'the database'}"
    outage = Outage(logger, what)
    delay = 0.1
    while True:
        try:
            await driver.open()
        except Exception as exc:
            if not unreachable(exc):
                raise
            outage.failed(exc, retry_in=delay)
            try:
                await asyncio.wait_for(stopping.wait(), delay * random.uniform(0.5, 1.0))
                return False
            except asyncio.TimeoutError:
                delay = min(cap, delay * 2)
            continue
        outage.ok()
        return True


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


class OneLine(logging.Filter):
    """Keeps a library's record of a fault to one line: the message, then the exception's
    type and text instead of its traceback (asyncpg's pool logs one for every failed attempt
    to reconnect its floor of connections; txtasks logs the fault itself, once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = None
            record.exc_info = record.exc_text = None
        return True


def one_line_records(logger_name: str) -> None:
    """Log the records of `logger_name` that carry an exception on one line (`OneLine`)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, OneLine) for f in logger.filters):
        logger.addFilter(OneLine())
