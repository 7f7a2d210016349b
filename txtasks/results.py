"""Results: waiting for a task to finish and reading what it returned (`app.results`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from txtasks.errors import ResultTimeout, TaskFailed, TaskNotFound
from txtasks.payload import json_decode
from txtasks.types import TaskRow, TaskState

if TYPE_CHECKING:
    from txtasks.driver.base import Driver

__all__ = ["RESULT_POLL_FIRST", "RESULT_POLL_MAX", "Results", "result_of"]

#: `Results.get`'s backoff between two reads of a task that has not finished (seconds).
RESULT_POLL_FIRST = 0.01
RESULT_POLL_MAX = 0.5
_NOT_YET = object()


def result_of(task_id: int, row: TaskRow | None) -> Any:
    """A finished task's result (or its final error, raised); `_NOT_YET` while it is live."""
    if row is None:
        raise TaskNotFound(f"no task {task_id} (never enqueued, or purged from the archive)")
    if row.state is TaskState.COMPLETED:
        return None if row.result is None else json_decode(row.result)
    if row.state.is_live:
        return _NOT_YET
    raise TaskFailed(task_id, row.state.value, row.last_error)


class ResultsHost(Protocol):
    @property
    def driver(self) -> Driver: ...


class Results:
    """The results of tasks (`app.results`): `get` / `aget` wait for one to finish."""

    def __init__(self, host: ResultsHost) -> None:
        self._host = host
        #: `aget` calls waiting in this process, by task id.
        self._finished: dict[int, asyncio.Event] = {}

    async def aget(self, task_id: int, *, timeout: float | None = None) -> Any:
        """The result of task `task_id` once it has finished: its kept return value (None for
        a task that does not keep its result). Raises `TaskFailed` if it was dead-lettered,
        failed or discarded, `ResultTimeout` after `timeout` seconds (None: no limit), and
        `TaskNotFound` for an unknown id.

        Waits by reading the task with a backoff (10 ms, doubling up to `RESULT_POLL_MAX`
        seconds); a worker in this process wakes it as soon as it records the outcome."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = RESULT_POLL_FIRST
        while True:
            found = result_of(task_id, await self._host.driver.tasks.task_get(task_id))
            if found is not _NOT_YET:
                return found
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise ResultTimeout(f"task {task_id} has not finished within {timeout} s")
            wait = delay if left is None else min(delay, left)
            await self._finished_wait(task_id, wait)
            delay = min(RESULT_POLL_MAX, delay * 2)

    def get(self, task_id: int, *, timeout: float | None = None) -> Any:
        """`aget` for synchronous callers (it reads with a backoff, in this thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = RESULT_POLL_FIRST
        while True:
            found = result_of(task_id, self._host.driver.tasks.task_get_sync(task_id))
            if found is not _NOT_YET:
                return found
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ResultTimeout(f"task {task_id} has not finished within {timeout} s")
            time.sleep(delay if left is None else min(delay, left))
            delay = min(RESULT_POLL_MAX, delay * 2)

    async def _finished_wait(self, task_id: int, seconds: float) -> None:
        event = self._finished.setdefault(task_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        finally:
            if self._finished.get(task_id) is event and not event.is_set():
                del self._finished[task_id]

    def finished(self, ids: Iterable[int]) -> None:
        """Wake the `aget` calls of this process waiting for tasks `ids` (a worker calls
        it once their outcomes are stored)."""
        if self._finished:
            for task_id in ids:
                event = self._finished.pop(task_id, None)
                if event is not None:
                    event.set()
