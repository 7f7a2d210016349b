"""Running tasks: the worker, the handler context, the outcome buffer."""

from txtasks.worker.config import WorkerConfig, WorkerStats
from txtasks.worker.context import TaskContext
from txtasks.worker.worker import Worker

__all__ = ["TaskContext", "Worker", "WorkerConfig", "WorkerStats"]
