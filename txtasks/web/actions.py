"""The dashboard's actions: what each takes (task ids, a queue, a filter of dead letters, a
schedule, a rate or a key's limits), how it says what it will do on the confirmation page, and
how it runs (through the same API as the CLI: `app.control`, the driver's `control` role)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import FormData

from txtasks._checks import check_key, check_queue_name
from txtasks.app import App
from txtasks.driver.base import TaskQuery
from txtasks.errors import ConfigurationError
from txtasks.keys import KeyOverride, Rate
from txtasks.types import FINISHED_STATES, CancelResult, TaskState


@dataclass(frozen=True)
class Limits:
    """What an action on limits sets: a queue's rate, or a key's limits (fields left None keep
    the declared ones)."""

    key: str | None = None
    rate: Rate | None = None
    concurrency: int | None = None
    ordered: bool | None = None

    def text(self) -> str:
        said = [] if self.concurrency is None else [f"concurrency {self.concurrency}"]
        if self.ordered is not None:
            said.append("ordered" if self.ordered else "unordered")
        if self.rate is not None:
            said.append(rate_text(self.rate))
        return ", ".join(said)


@dataclass(frozen=True)
class Target:
    ids: list[int]
    queue: str | None
    schedule: str | None
    #: Every dead letter matching these filters (up to `MATCH_LIMIT` an action).
    match: TaskQuery | None = None
    #: The limits an action on a queue's rate or a key's limits sets.
    limits: Limits = Limits()

    def match_text(self) -> str:
        m = self.match
        assert m is not None
        found = [
            f"{k} {v}" for k, v in (("queue", m.queue), ("task", m.task_name), ("key", m.key)) if v
        ]
        if m.error:
            found.append(f"error containing {m.error!r}")
        if m.payload:
            found.append(f"payload containing {m.payload!r}")
        return ", ".join(found) or "no filter"


#: Task ids an action takes at most (a page of the listing holds far fewer).
MAX_IDS = 500
#: The states a retry takes a task from.
RETRIABLE = (TaskState.FAILED, TaskState.DEAD)
#: Dead letters an action on a filter takes at most (the next click takes the next ones).
MATCH_LIMIT = 10_000


@dataclass(frozen=True)
class Action:
    """One kind of action: what it needs, how it says what it will do, and how it runs."""

    what: str
    run_it: Callable[[App, Target], Awaitable[str]]
    by_queue: bool = False
    by_schedule: bool = False

    def needs_target(self, target: Target) -> str | None:
        if self.by_schedule:
            return None if target.schedule else "give a schedule"
        if len(target.ids) > MAX_IDS:
            return f"give at most {MAX_IDS} task ids at a time"
        given = sum(1 for x in (target.ids, target.queue, target.match) if x)
        if self.by_queue and given > 1:
            return "give task ids, a queue or a filter, not more than one"
        if not target.ids and not (self.by_queue and given):
            return "give task ids" + (", a queue or a filter" if self.by_queue else "")
        return None

    def describe(self, target: Target) -> str:
        if self.by_schedule:
            return f"{self.what} {target.schedule}"
        if target.match is not None:
            return (
                f"{self.what} every dead letter with {target.match_text()} "
                f"(up to {MATCH_LIMIT:,} at a time)"
            )
        if target.ids:
            shown = ", ".join(str(i) for i in target.ids[:20])
            more = f" and {len(target.ids) - 20} more" if len(target.ids) > 20 else ""
            return f"{self.what} task{'s' if len(target.ids) > 1 else ''} {shown}{more}"
        return f"{self.what} every one of queue {target.queue}"

    async def run(self, app: App, target: Target) -> str:
        return await self.run_it(app, target)


async def _matching(app: App, target: Target) -> dict[int, str]:
    """The dead letters an action takes: {id: queue}, of the ids given or matching the filter
    (None for an action on a whole queue)."""
    if target.match is None:
        rows = [await app.control.ainspect(i) for i in target.ids]
        return {r.id: r.queue for r in rows if r is not None}
    found: dict[int, str] = {}
    cursor = None
    while len(found) < MATCH_LIMIT:
        page = await app.driver.dashboard.task_page(target.match, cursor, 500)
        found.update((r.id, r.queue) for r in page.rows[: MATCH_LIMIT - len(found)])
        cursor = page.next_cursor
        if cursor is None:
            break
    return found


async def _requeue(app: App, target: Target) -> str:
    if target.queue is not None:
        ids = await app.driver.admin.dead_requeue(queue=target.queue, now=app.clock())
        app.notify(target.queue, ids)
        return f"{len(ids)} re-driven"
    chosen = await _matching(app, target)
    done: list[int] = []
    batch = list(chosen)
    for start in range(0, len(batch), 1000):
        done += await app.driver.admin.dead_requeue(batch[start : start + 1000], now=app.clock())
    for queue in sorted({chosen[i] for i in done}):
        app.notify(queue, [i for i in done if chosen[i] == queue])
    return f"{len(done)} re-driven"


async def _purge(app: App, target: Target) -> str:
    if target.queue is not None:
        return f"{await app.driver.admin.dead_purge(queue=target.queue)} purged"
    batch = list(await _matching(app, target))
    count = 0
    for start in range(0, len(batch), 1000):
        count += await app.driver.admin.dead_purge(batch[start : start + 1000])
    return f"{count} purged"


async def _cancel(app: App, target: Target) -> str:
    results = await app.control.acancel_many(target.ids)
    if len(results) == 1:
        return results[0].describe()
    count = Counter(c.result for c in results)
    said = [f"{count[CancelResult.CANCELLED]} of {len(results)} cancelled"]
    running = count[CancelResult.REQUESTED] + count[CancelResult.ALREADY_REQUESTED]
    if running:
        said.append(f"{running} running: asked to stop")
    left = count[CancelResult.FINISHED] + count[CancelResult.NOT_FOUND]
    if left:
        said.append(f"{left} left as they were (finished already, or not found)")
    return "; ".join(said)


async def _retry(app: App, target: Target) -> str:
    """Run failed and dead tasks again (one transaction), each with a fresh attempt budget."""
    queues = await _matching(app, target)
    done = await app.driver.admin.dead_requeue(target.ids, now=app.clock(), states=RETRIABLE)
    for queue in sorted({queues[i] for i in done}):
        app.notify(queue, [i for i in done if queues[i] == queue])
    return (
        f"{len(done)} of {len(target.ids)} run again "
        "(only failed and dead tasks are; the others were left as they were)"
    )


async def _delete(app: App, target: Target) -> str:
    """Delete finished tasks for good (one statement); live ones are left alone."""
    states = sorted(FINISHED_STATES, key=lambda s: s.value)
    count = await app.driver.admin.dead_purge(target.ids, states=states)
    return (
        f"{count} of {len(target.ids)} deleted "
        "(only finished tasks are: cancel a waiting or running one first)"
    )


async def _run_now(app: App, target: Target) -> str:
    made = []
    for task_id in target.ids:
        queue = await app.driver.control.task_run_now(task_id, now=app.clock())
        if queue is not None:
            app.notify(queue, [task_id])
            made.append(task_id)
    return f"{len(made)} of {len(target.ids)} made due now (the others were not waiting)"


async def _pause(app: App, target: Target) -> str:
    assert target.queue is not None
    was = await app.control.apause(target.queue)
    return f"queue {target.queue} " + ("was already paused" if was else "paused")


async def _resume(app: App, target: Target) -> str:
    assert target.queue is not None
    resumed = await app.control.aresume(target.queue)
    return f"queue {target.queue} " + ("resumed" if resumed else "was not paused")


async def _periodic_now(app: App, target: Target) -> str:
    schedule = app.schedules.get(target.schedule or "")
    if schedule is None:
        raise ConfigurationError(f"schedule {target.schedule!r}: not declared by this app")
    options: dict[str, Any] = {}
    if schedule.queue is not None:
        options["queue"] = schedule.queue
    if schedule.priority is not None:
        options["priority"] = schedule.priority
    task_id = await app.aenqueue(schedule.task_name, schedule.payload, **options)
    return f"schedule {schedule.name}: task {task_id} enqueued"


class _QueueAction(Action):
    def needs_target(self, target: Target) -> str | None:
        return None if target.queue else "give a queue"

    def describe(self, target: Target) -> str:
        return f"{self.what} queue {target.queue}"


async def _queue_rate(app: App, target: Target) -> str:
    assert target.queue is not None and target.limits.rate is not None
    await app.control.aset_queue_rate(target.queue, target.limits.rate)
    return f"queue {target.queue}: {rate_text(target.limits.rate)}"


async def _queue_rate_clear(app: App, target: Target) -> str:
    assert target.queue is not None
    cleared = await app.control.aclear_queue_rate(target.queue)
    return f"queue {target.queue}: " + ("rate cleared" if cleared else "had no rate set")


async def _key_limits(app: App, target: Target) -> str:
    limits = target.limits
    assert limits.key is not None
    override = KeyOverride(
        limits.key, target.queue, limits.concurrency, limits.ordered, limits.rate
    )
    await app.driver.control.key_override_set(override)
    return f"key {_key_in(target)}: {limits.text()}"


async def _key_limits_clear(app: App, target: Target) -> str:
    assert target.limits.key is not None
    cleared = await app.driver.control.key_override_clear(target.limits.key, target.queue)
    return f"key {_key_in(target)}: " + ("limits cleared" if cleared else "had no limits set")


def _key_in(target: Target) -> str:
    where = "every queue" if target.queue is None else f"queue {target.queue}"
    return f"{target.limits.key} in {where}"


class _QueueRateAction(_QueueAction):
    def needs_target(self, target: Target) -> str | None:
        if self.run_it is _queue_rate and target.limits.rate is None:
            return "give a rate, such as 10/s"
        return super().needs_target(target)

    def describe(self, target: Target) -> str:
        rate = target.limits.rate
        to = "" if rate is None else f" to {rate_text(rate)}, over the declared one"
        return f"{self.what} of queue {target.queue}{to}"


class _KeyAction(Action):
    def needs_target(self, target: Target) -> str | None:
        limits = target.limits
        if limits.key is None:
            return "give a key"
        if self.run_it is _key_limits and not limits.text():
            return "give a concurrency, ordered or unordered, or a rate"
        return None

    def describe(self, target: Target) -> str:
        said = f" to {target.limits.text()}" if self.run_it is _key_limits else ""
        return f"{self.what} of key {_key_in(target)}{said}"


ACTIONS: dict[str, Action] = {
    "requeue": Action("re-drive (run again)", _requeue, by_queue=True),
    "purge": Action("delete for good", _purge, by_queue=True),
    "cancel": Action("cancel", _cancel),
    "retry": Action("run again (failed and dead ones)", _retry),
    "delete": Action("delete for good (finished ones)", _delete),
    "run_now": Action("run now", _run_now),
    "pause": _QueueAction("pause", _pause),
    "resume": _QueueAction("resume", _resume),
    "periodic_now": Action("enqueue one run now of schedule", _periodic_now, by_schedule=True),
    "queue_rate": _QueueRateAction("set the rate", _queue_rate),
    "queue_rate_clear": _QueueRateAction(
        "clear the rate set (the declared one applies again)", _queue_rate_clear
    ),
    "key_limits": _KeyAction("set the limits", _key_limits),
    "key_limits_clear": _KeyAction(
        "clear the limits set (the declared ones apply again)", _key_limits_clear
    ),
}


def limits_of(form: FormData) -> Limits:
    """The limits of an action on a queue's rate or a key's limits (fields key, rate, burst,
    concurrency, ordered: "yes", "no" or empty); ConfigurationError when one is not valid."""
    key = field_of(form, "key") or None
    if key is not None:
        check_key(key, setting="key")
    rate_field = (field_of(form, "rate") or "").strip()
    burst_field = (field_of(form, "burst") or "").strip()
    rate = Rate.parse(rate_field) if rate_field else None
    if burst_field:
        if rate is None:
            raise ConfigurationError("burst: goes with a rate")
        rate = Rate(rate.count, rate.per, _whole(burst_field, "burst"))
    concurrency_field = (field_of(form, "concurrency") or "").strip()
    concurrency = _whole(concurrency_field, "concurrency") if concurrency_field else None
    ordered = {"yes": True, "no": False}.get(field_of(form, "ordered") or "")
    return Limits(key, rate, concurrency, ordered)


def _whole(text: str, setting: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"{setting}: a whole number of at least 1, got {text!r}")
    return int(text)


def rate_text(rate: Rate) -> str:
    """A rate as the pages and the CLI say it."""
    return f"rate {rate.count}/{rate.per:g}s burst {rate.burst}"


def match_of(form: FormData) -> TaskQuery | None:
    """The filter of an action on every dead letter matching it (fields match_*), if any."""
    if field_of(form, "match") != "yes":
        return None
    queue = field_of(form, "match_queue") or None
    if queue is not None:
        check_queue_name(queue, setting="match_queue")
    return TaskQuery(
        state="dead",
        queue=queue,
        task_name=field_of(form, "match_task") or None,
        key=field_of(form, "match_key") or None,
        error=field_of(form, "match_error") or None,
        payload=field_of(form, "match_payload") or None,
    )


def field_of(form: FormData, name: str) -> str | None:
    """A text field of a form (None: missing, or a file)."""
    value = form.get(name)
    return value if isinstance(value, str) else None
