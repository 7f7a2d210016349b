"""Helpers for the tests of applications that use txtasks.

app = App(driver=MemoryDriver())
...code under test enqueues with `await task.aenqueue(...)`...
assert [t.payload for t in enqueued(app, "send_email")] == [...]
stats = await run_until_empty(app)
"""

from __future__ import annotations

from typing import Any

from txtasks.app import App, Task
from txtasks.driver.memory import MemoryDriver
from txtasks.payload import payload_decode
from txtasks.types import TaskRow, TaskState
from txtasks.worker.worker import Worker, WorkerConfig, WorkerStats


async def run_until_empty(
    app: App, *, queues: list[str] | None = None, concurrency: int | None = 10, **config: Any
) -> WorkerStats:
    """Run a worker in burst mode until no task is due: what `txtasks worker --burst` does
    (`concurrency=None`: the worker's default, which grows while a backlog lasts)."""
    settings = {"poll_interval": 0.01, "flush_interval": 0.001, "burst_horizon": 0.0, **config}
    worker_config = WorkerConfig(
        queues=tuple(queues) if queues else None, concurrency=concurrency, burst=True, **settings
    )
    return await Worker(app, worker_config).run()


def _memory(app: App) -> MemoryDriver:
    driver = app.driver
    if not isinstance(driver, MemoryDriver):
        raise TypeError("txtasks.testing inspection needs App(driver=MemoryDriver())")
    return driver


def enqueued(app: App, task: Task | str | None = None) -> list[TaskRow]:
    """Live tasks (not finished yet), optionally of one task, in id order."""
    name = task.name if isinstance(task, Task) else task
    rows = _memory(app).store.live.values()
    return sorted((r for r in rows if name is None or r.task_name == name), key=lambda r: r.id)


def finished(app: App, state: TaskState | str | None = None) -> list[TaskRow]:
    """Archived tasks, optionally in one final state, in id order."""
    wanted = None if state is None else TaskState(state)
    rows = _memory(app).store.archived.values()
    return sorted((r for r in rows if wanted is None or r.state is wanted), key=lambda r: r.id)


def payloads(rows: list[TaskRow]) -> list[Any]:
    """The decoded payloads of some rows."""
    return [payload_decode(r.payload, r.content_type) for r in rows]


__all__ = ["MemoryDriver", "enqueued", "finished", "payloads", "run_until_empty"]
