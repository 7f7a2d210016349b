"""txtasks: a transactional task queue.

Enqueue tasks inside your own SQL transaction; workers claim them with SKIP LOCKED and record
every outcome fenced on the attempt that ran it.
"""

from txtasks.app import App, Task, TaskOptions
from txtasks.driver import MemoryDriver, driver_for_url
from txtasks.driver.timeouts import DatabaseTimeout, Timeouts
from txtasks.engines import create_async_engine, create_engine, migrate
from txtasks.errors import (
    ConfigurationError,
    Drop,
    PayloadError,
    Reject,
    Retry,
    SchemaError,
    TxtasksError,
    UnknownTaskError,
)
from txtasks.policy import AckPolicy
from txtasks.retry import Constant, Custom, Exponential, Linear, RetryStrategy
from txtasks.types import NewTask, TaskRow, TaskState
from txtasks.worker import TaskContext, Worker, WorkerConfig, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "AckPolicy",
    "App",
    "ConfigurationError",
    "Constant",
    "Custom",
    "DatabaseTimeout",
    "Drop",
    "Exponential",
    "Linear",
    "MemoryDriver",
    "NewTask",
    "PayloadError",
    "Reject",
    "Retry",
    "RetryStrategy",
    "SchemaError",
    "Task",
    "TaskContext",
    "TaskOptions",
    "TaskRow",
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
