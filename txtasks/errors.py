"""Exceptions raised to users and by handlers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta


class TxtasksError(Exception):
    """Base class of every error txtasks raises."""


class ConfigurationError(TxtasksError, ValueError):
    """A setting is invalid; the message names the setting."""


def cannot_listen(
    what: str, host: str, port: int, setting: str, exc: OSError
) -> ConfigurationError:
    """The error of a server that cannot listen: it names the port and the setting."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__
    return ConfigurationError(f"{setting} {port}: cannot serve {what} on {host}:{port}: {reason}")


#: Optional modules -> the extra that installs them.
EXTRAS = {
    "asyncpg": "postgres",
    "psycopg": "postgres",
    "aiomysql": "mysql",
    "pymysql": "mysql",
    "aio_pika": "rabbitmq",
    "aiormq": "rabbitmq",
    "uvloop": "fast",
    "opentelemetry": "otel",
    "pyspark": "spark",
    "pyarrow": "spark",
    "starlette": "web",
    "uvicorn": "web",
    "jinja2": "web",
    "multipart": "web",
    "python_multipart": "web",
}


class MissingExtraError(TxtasksError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def missing_extra(exc: ImportError) -> MissingExtraError | None:
    """The error naming the extra that installs the module `exc` did not find, None when no
    extra does."""
    if isinstance(exc, MissingExtraError):
        return exc
    module = (exc.name or "").partition(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    text = f'{module} is not installed: pip install "txtasks[{extra}]"'
    return MissingExtraError(text, name=exc.name)


@contextmanager
def extras_needed() -> Iterator[None]:
    """Turn the ImportError of an optional dependency into a `MissingExtraError`."""
    try:
        yield
    except ImportError as exc:
        missing = missing_extra(exc)
        if missing is None or missing is exc:
            raise
        raise missing from None


class PayloadError(TxtasksError, ValueError):
    """A payload cannot be stored (not JSON-serialisable, or too large)."""


class UnknownTaskError(TxtasksError, LookupError):
    """No task of that name is registered on the application."""


class SchemaError(TxtasksError):
    """The database schema is missing or older than this version of txtasks needs."""


class HandlerSignal(Exception):
    """Base of the exceptions a handler raises to choose the outcome of its task."""


class Retry(HandlerSignal):
    """Run the task again later (a nack). `delay` overrides the retry strategy."""

    def __init__(
        self, reason: str = "retry requested", *, delay: float | timedelta | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class Drop(HandlerSignal):
    """The task is valid but can never be processed: archive it as discarded, never retry."""

    def __init__(self, reason: str = "dropped") -> None:
        super().__init__(reason)
        self.reason = reason


class Reject(HandlerSignal):
    """The task failed for good: dead-letter it now, whatever attempts remain."""

    def __init__(self, reason: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason


class LeaseExpired(TxtasksError):
    """The worker running an attempt stopped heartbeating (it died or was cut off): the
    cleaner treats the attempt as failed with this error, under the task's ack policy."""


class LeaseLost(TxtasksError):
    """The attempt is no longer this worker's (its lease ran out and the task was rescued or
    claimed again, or it already completed): its transaction was rolled back, so nothing it
    wrote in it is stored, and its outcome is not recorded."""


class TaskFailed(TxtasksError):
    """`App.result` of a task that ended without completing: dead-lettered, failed or
    discarded. `state` says which, `error` is the task's last error."""

    def __init__(self, task_id: int, state: str, error: str | None) -> None:
        super().__init__(f"task {task_id} ended {state}: {error or 'no reason given'}")
        self.task_id = task_id
        self.state = state
        self.error = error


class ResultTimeout(TxtasksError, TimeoutError):
    """`App.result` waited its whole timeout and the task had not finished."""


class TaskNotFound(TxtasksError, LookupError):
    """No task with that id, live or archived (never enqueued, or purged by retention)."""
