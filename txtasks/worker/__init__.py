"""Running tasks: the worker, the handler context, the outcome buffer."""

from txtasks.worker.context import TaskContext
from txtasks.worker.worker import Worker, WorkerConfig, WorkerStats

__all__ = ["TaskContext", "Worker", "WorkerConfig", "WorkerStats"]
