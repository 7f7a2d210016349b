"""txtasks: a transactional task queue.

Enqueue tasks inside your own SQL transaction; workers claim them with SKIP LOCKED and record
every outcome fenced on the attempt that ran it.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from txtasks.app import App, Task, TaskOptions
    from txtasks.dbapi import DbapiTx
    from txtasks.driver import MemoryDriver, driver_for_url
    from txtasks.driver.timeouts import DatabaseTimeout, Timeouts
    from txtasks.engines import create_async_engine, create_engine, migrate
    from txtasks.errors import (
        ConfigurationError,
        Drop,
        LeaseLost,
        MissingExtraError,
        PayloadError,
        Reject,
        ResultTimeout,
        Retry,
        SchemaError,
        TaskFailed,
        TaskNotFound,
        TxtasksError,
        UnknownTaskError,
    )
    from txtasks.keys import KeyLimits, KeyOverride, Rate
    from txtasks.middleware import AttemptEnd, Middleware
    from txtasks.policy import AckPolicy
    from txtasks.retry import Constant, Custom, Exponential, Linear, RetryStrategy
    from txtasks.task import TaskSettings
    from txtasks.types import Cancel, CancelResult, NewTask, Progress, TaskRow, TaskState
    from txtasks.worker import TaskContext, Worker, WorkerConfig, WorkerStats

from txtasks._version import __version__

__all__ = [
    "AckPolicy",
    "App",
    "AttemptEnd",
    "Cancel",
    "CancelResult",
    "ConfigurationError",
    "Constant",
    "Custom",
    "DatabaseTimeout",
    "DbapiTx",
    "Drop",
    "Exponential",
    "KeyLimits",
    "KeyOverride",
    "LeaseLost",
    "Linear",
    "MemoryDriver",
    "Middleware",
    "MissingExtraError",
    "NewTask",
    "PayloadError",
    "Progress",
    "Rate",
    "Reject",
    "ResultTimeout",
    "Retry",
    "RetryStrategy",
    "SchemaError",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskNotFound",
    "TaskOptions",
    "TaskRow",
    "TaskSettings",
    "TaskState",
    "Timeouts",
    "TxtasksError",
    "UnknownTaskError",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "__version__",
    "create_async_engine",
    "create_engine",
    "driver_for_url",
    "migrate",
]

#: Where each export lives: `import txtasks` is cheap (a command's `--help` imports no
#: SQLAlchemy), and a name's module is imported when the name is first used (PEP 562).
_SOURCES = {
    "App": "txtasks.app",
    "Task": "txtasks.app",
    "TaskOptions": "txtasks.app",
    "TaskSettings": "txtasks.task",
    "DbapiTx": "txtasks.dbapi",
    "MemoryDriver": "txtasks.driver",
    "driver_for_url": "txtasks.driver",
    "DatabaseTimeout": "txtasks.driver.timeouts",
    "Timeouts": "txtasks.driver.timeouts",
    "create_async_engine": "txtasks.engines",
    "create_engine": "txtasks.engines",
    "migrate": "txtasks.engines",
    "KeyLimits": "txtasks.keys",
    "KeyOverride": "txtasks.keys",
    "Rate": "txtasks.keys",
    "AttemptEnd": "txtasks.middleware",
    "Middleware": "txtasks.middleware",
    **dict.fromkeys(
        (
            "ConfigurationError",
            "Drop",
            "PayloadError",
            "LeaseLost",
            "MissingExtraError",
            "Reject",
            "ResultTimeout",
            "Retry",
            "SchemaError",
            "TaskFailed",
            "TaskNotFound",
            "TxtasksError",
            "UnknownTaskError",
        ),
        "txtasks.errors",
    ),
    "AckPolicy": "txtasks.policy",
    **dict.fromkeys(
        ("Constant", "Custom", "Exponential", "Linear", "RetryStrategy"), "txtasks.retry"
    ),
    **dict.fromkeys(
        ("Cancel", "CancelResult", "NewTask", "Progress", "TaskRow", "TaskState"), "txtasks.types"
    ),
    **dict.fromkeys(("TaskContext", "Worker", "WorkerConfig", "WorkerStats"), "txtasks.worker"),
}


def __getattr__(name: str) -> object:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'txtasks' has no attribute {name!r}")
    value = getattr(_importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
