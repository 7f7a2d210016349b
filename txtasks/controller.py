"""Control of tasks and queues (`app.control`): cancel, pause and resume, queue rates,
inspect and list. Every operation has a sync form and an async one (`a` in front); those
with logic are one plan of driver calls run in either form (`txtasks._both`). See
docs/control.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from txtasks._both import DriverPlan, call, run_async, run_sync
from txtasks._checks import check_number, check_queue_name
from txtasks.control import TaskFilter, cancels_by_queue, task_state
from txtasks.errors import ConfigurationError
from txtasks.keys import Rate
from txtasks.types import Cancel, TaskRow, TaskState
from txtasks.wakeup import NullNotifier

if TYPE_CHECKING:
    from txtasks.driver.base import Driver
    from txtasks.wakeup import Notifier

__all__ = ["ControlHost", "Controller", "Named"]


class Named(Protocol):
    """A task handle (`txtasks.Task`), as far as a filter reads it."""

    @property
    def name(self) -> str: ...


class ControlHost(Protocol):
    """What control reads of the application, at each call."""

    @property
    def driver(self) -> Driver: ...

    @property
    def notifier(self) -> Notifier: ...

    def clock(self) -> datetime: ...

    def notify(self, queue: str, ids: Iterable[int] = ()) -> None: ...


class Controller:
    """Control of an application's tasks and queues (`app.control`)."""

    def __init__(self, host: ControlHost) -> None:
        self._host = host

    def cancel(self, task_id: int) -> Cancel:
        """Cancel one task: a waiting one never starts (archived as cancelled); a running one
        is stopped by its worker and recorded as cancelled; a finished one is left as it is.
        Returns what was done (`Cancel.describe()` says it in words). With a broker, the
        workers of a running task's queue get a cancel wake-up and stop it at once."""
        return self.cancel_many([task_id])[0]

    async def acancel(self, task_id: int) -> Cancel:
        """`cancel`, for async callers; a running task's worker is woken to stop it at once."""
        [result] = await self.acancel_many([task_id])
        return result

    def cancel_many(
        self,
        ids: Iterable[int] | None = None,
        *,
        queue: str | None = None,
        task: Named | str | None = None,
        key: str | None = None,
        batch: int = 1000,
    ) -> list[Cancel]:
        """Cancel the tasks `ids`, or every live task of `queue`, of task `task` and with key
        `key` (those given), in transactions of up to `batch` tasks. What was done to each."""
        target = self._cancel_target(ids, queue, task, key)  # bad input fails first
        return run_sync(self._host.driver.control, self._cancel_plan(*target, batch))

    async def acancel_many(
        self,
        ids: Iterable[int] | None = None,
        *,
        queue: str | None = None,
        task: Named | str | None = None,
        key: str | None = None,
        batch: int = 1000,
    ) -> list[Cancel]:
        """`cancel_many`, for async callers."""
        target = self._cancel_target(ids, queue, task, key)
        return await run_async(self._host.driver.control, self._cancel_plan(*target, batch))

    def _cancel_plan(
        self, ids_list: list[int] | None, where: TaskFilter, now: datetime, batch: int
    ) -> DriverPlan[list[Cancel]]:
        if ids_list is not None:
            results: list[Cancel] = yield call("task_cancel_many", ids_list, now=now)
        else:
            results = []
            while True:
                found = yield call("task_cancel_many", where=where, now=now, limit=batch)
                results += found
                if len(found) < batch:
                    break
        self._wake_cancelled(results)
        return results

    def _cancel_target(
        self,
        ids: Iterable[int] | None,
        queue: str | None,
        task: Named | str | None,
        key: str | None,
    ) -> tuple[list[int] | None, TaskFilter, datetime]:
        """What a cancel names: ids, or a filter (checked: one of the two)."""
        where = self._task_filter(queue, task, key)
        if ids is not None and not where.empty:
            raise ConfigurationError("cancel: give task ids, or queue/task/key, not both")
        if ids is None and where.empty:
            raise ConfigurationError("cancel: give task ids, or a queue, a task or a key")
        return None if ids is None else list(ids), where, self._host.clock()

    def _wake_cancelled(self, results: Sequence[Cancel]) -> None:
        """A cancel wake-up to the workers of the queues of running tasks asked to stop: they
        look for cancels now rather than after their next heartbeat."""
        if isinstance(self._host.notifier, NullNotifier):
            return
        for queue, ids in sorted(cancels_by_queue(results).items()):
            self._host.notifier.notify(queue, ids, cancel=True)

    @staticmethod
    def _task_filter(queue: str | None, task: Named | str | None, key: str | None) -> TaskFilter:
        name = task if task is None or isinstance(task, str) else task.name
        if queue is not None:
            check_queue_name(queue, setting="queue")
        return TaskFilter(queue=queue, task_name=name, key=key)

    def pause(self, queue: str) -> datetime | None:
        """Pause `queue`: no worker starts a task of it until `resume`; running tasks finish.
        Returns when it was paused, if it was already (else None)."""
        return self._host.driver.control.queue_pause_sync(
            check_queue_name(queue), now=self._host.clock()
        )

    async def apause(self, queue: str) -> datetime | None:
        """`pause`, for async callers."""
        return await self._host.driver.control.queue_pause(
            check_queue_name(queue), now=self._host.clock()
        )

    def resume(self, queue: str) -> bool:
        """Resume a paused queue (False: it was not paused); workers are woken to claim."""
        return run_sync(self._host.driver.control, self._resume_plan(check_queue_name(queue)))

    async def aresume(self, queue: str) -> bool:
        """`resume`, for async callers."""
        return await run_async(
            self._host.driver.control, self._resume_plan(check_queue_name(queue))
        )

    def _resume_plan(self, queue: str) -> DriverPlan[bool]:
        resumed: bool = yield call("queue_resume", queue)
        if resumed and not isinstance(self._host.notifier, NullNotifier):
            self._host.notify(queue)
        return resumed

    def set_queue_rate(self, queue: str, rate: Rate) -> None:
        """Set the rate of `queue` as a whole at run time, over the declared one (`queue_rate`):
        every worker of the queue applies it within `txtasks.worker.worker.QUEUE_RATES_EVERY`
        seconds."""
        self._host.driver.control.queue_rate_set_sync(*self._rate_checked(queue, rate))

    async def aset_queue_rate(self, queue: str, rate: Rate) -> None:
        """`set_queue_rate`, for async callers."""
        await self._host.driver.control.queue_rate_set(*self._rate_checked(queue, rate))

    @staticmethod
    def _rate_checked(queue: str, rate: Rate) -> tuple[str, Rate]:
        if not isinstance(rate, Rate):
            raise ConfigurationError(f"set_queue_rate: expected a Rate, got {rate!r}")
        return check_queue_name(queue, setting="queue"), rate

    def clear_queue_rate(self, queue: str) -> bool:
        """Remove the rate set at run time (False: none was): the declared one applies again."""
        return self._host.driver.control.queue_rate_clear_sync(
            check_queue_name(queue, setting="queue")
        )

    async def aclear_queue_rate(self, queue: str) -> bool:
        """`clear_queue_rate`, for async callers."""
        return await self._host.driver.control.queue_rate_clear(
            check_queue_name(queue, setting="queue")
        )

    def inspect(self, task_id: int) -> TaskRow | None:
        """One task by id, live or finished (None: no such task): its state, attempts, last
        error, times, headers, key, worker, lease, cancel, kept result (`result_value`) and
        last progress report (`progress_report`)."""
        return self._host.driver.tasks.task_get_sync(task_id)

    async def ainspect(self, task_id: int) -> TaskRow | None:
        """`inspect`, for async callers."""
        return await self._host.driver.tasks.task_get(task_id)

    def task_list(
        self,
        *,
        states: Iterable[TaskState | str] | None = None,
        queue: str | None = None,
        task: Named | str | None = None,
        key: str | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        """Up to `limit` tasks in `states` (default: every live state) of `queue`, of task
        `task` and with key `key` (those given): live ones newest first, then finished ones
        last finished first. (`app.tasks` is the registry of task declarations.)"""
        chosen, where = self._listing(states, queue, task, key, limit)
        return self._host.driver.tasks.task_list_sync(states=chosen, where=where, limit=limit)

    async def atask_list(
        self,
        *,
        states: Iterable[TaskState | str] | None = None,
        queue: str | None = None,
        task: Named | str | None = None,
        key: str | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        """`task_list`, for async callers."""
        chosen, where = self._listing(states, queue, task, key, limit)
        return await self._host.driver.tasks.task_list(states=chosen, where=where, limit=limit)

    def _listing(
        self,
        states: Iterable[TaskState | str] | None,
        queue: str | None,
        task: Named | str | None,
        key: str | None,
        limit: int,
    ) -> tuple[list[TaskState] | None, TaskFilter]:
        """A listing's states and filter, checked (bad input: an error naming it)."""
        check_number("limit", limit, minimum=1, maximum=None, integer=True)
        chosen = None if states is None else [task_state(s) for s in states]
        return chosen, self._task_filter(queue, task, key)
