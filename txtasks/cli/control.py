"""`txtasks cancel`, `pause`, `resume`, `inspect` and `tasks`: control from the command line
(see docs/control.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from txtasks.cli.common import (
    broker_url_option,
    database_url_option,
    json_default,
    task_json,
    with_driver,
)
from txtasks.clock import utcnow
from txtasks.types import Cancel, CancelResult, TaskRow, TaskState

if TYPE_CHECKING:
    from txtasks.control import TaskFilter
    from txtasks.driver import Driver

#: Tasks cancelled per transaction by `txtasks cancel --queue/--task/--key`.
CANCEL_BATCH = 1000
STATES = [s.value for s in TaskState]


def _queue_name(value: str | None, param: str) -> str | None:
    """A queue name as given, or a usage error naming the option and the rule."""
    from txtasks._checks import check_queue_name
    from txtasks.errors import TxtasksError

    if value is None:
        return None
    try:
        return check_queue_name(value, setting=param)
    except TxtasksError as exc:
        raise click.BadParameter(str(exc)) from None


def _notify(broker_url: str | None, queues: dict[str, list[int]], *, cancel: bool = False) -> None:
    """Wake the workers of `queues` (queue -> task ids), when a broker is given: one of them
    to claim, or with `cancel` all of them to look for cancels of their running tasks."""
    if not broker_url or not queues:
        return
    from txtasks.cli.common import run_async
    from txtasks.wakeup import notifier_for_url

    notifier = notifier_for_url(broker_url)
    for queue, ids in sorted(queues.items()):
        notifier.notify(queue, ids, cancel=cancel)
    run_async(notifier.close)  # publishes the wake-ups before closing


# -- cancel ------------------------------------------------------------------------------------


@click.command()
@database_url_option
@broker_url_option
@click.argument("ids", nargs=-1, type=click.IntRange(min=1))
@click.option("--queue", help="Every live task of this queue.")
@click.option("--task", "task_name", help="Every live task of this task name.")
@click.option("--key", help="Every live task with this key.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cancel(
    database_url: str | None,
    broker_url: str | None,
    ids: tuple[int, ...],
    queue: str | None,
    task_name: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Cancel tasks by id, or every live task of --queue, --task and --key (those given).

    A waiting task never starts: it is archived as cancelled. A running one is stopped by its
    worker (within a heartbeat; at once with --broker-url) and recorded as cancelled. A
    finished task is left as it is. Exits with 1 when an id names no task."""
    from txtasks.control import TaskFilter

    where = TaskFilter(_queue_name(queue, "--queue"), task_name, key)
    if ids and not where.empty:
        raise click.UsageError("give task ids, or --queue/--task/--key, not both")
    if not ids and where.empty:
        raise click.UsageError("give task ids, or --queue, --task or --key")

    async def go(driver: Driver) -> list[Cancel]:
        if ids:
            return await driver.control.task_cancel_many(list(ids), now=utcnow())
        return await _cancel_where(driver, where)

    from txtasks.control import cancels_by_queue

    results = with_driver(database_url, go)
    _notify(broker_url, cancels_by_queue(results), cancel=True)
    if as_json:
        rows = [{"id": c.id, "result": c.result.value, "state": c.state} for c in results]
        click.echo(json.dumps(rows, default=json_default, indent=2))
    elif ids:
        for c in results:
            click.echo(c.describe())
    else:
        click.echo(_counts_text(results))
    if any(c.result is CancelResult.NOT_FOUND for c in results):
        sys.exit(1)


async def _cancel_where(driver: Driver, where: TaskFilter) -> list[Cancel]:
    results: list[Cancel] = []
    now = utcnow()
    while True:
        found = await driver.control.task_cancel_many(where=where, now=now, limit=CANCEL_BATCH)
        results += found
        if len(found) < CANCEL_BATCH:
            return results


def _counts_text(results: Sequence[Cancel]) -> str:
    cancelled = sum(c.result is CancelResult.CANCELLED for c in results)
    requested = sum(c.result is CancelResult.REQUESTED for c in results)
    return (
        f"cancelled {cancelled} waiting task(s); asked {requested} running task(s) to stop"
        if results
        else "no live task matched: nothing cancelled"
    )


# -- pause and resume --------------------------------------------------------------------------


@click.command()
@database_url_option
@click.argument("queue")
def pause(database_url: str | None, queue: str) -> None:
    """Pause QUEUE: workers start none of its tasks until `txtasks resume` (tasks running
    finish). Enqueues go on as usual."""
    name = _queue_name(queue, "QUEUE")
    assert name is not None
    earlier = with_driver(database_url, lambda d: d.control.queue_pause(name, now=utcnow()))
    if earlier is None:
        click.echo(f"queue {name}: paused")
    else:
        click.echo(f"queue {name}: already paused since {earlier:%Y-%m-%d %H:%M:%S} UTC")


@click.command()
@database_url_option
@broker_url_option
@click.argument("queue")
def resume(database_url: str | None, broker_url: str | None, queue: str) -> None:
    """Resume QUEUE: workers claim its tasks again (at their next poll; at once with
    --broker-url)."""
    name = _queue_name(queue, "QUEUE")
    assert name is not None
    resumed = with_driver(database_url, lambda d: d.control.queue_resume(name))
    if resumed:
        _notify(broker_url, {name: []})
    click.echo(f"queue {name}: {'resumed' if resumed else 'was not paused'}")


# -- inspect and tasks -------------------------------------------------------------------------


def inspect_json(row: TaskRow) -> dict[str, Any]:
    """A task as `txtasks inspect --json` shows it: every stored field, its kept result and
    its last progress report, decoded."""
    data = task_json(row)
    data["result"] = task_result(row)
    data["progress"] = task_progress(row)
    return data


def task_result(row: TaskRow) -> Any:
    """The value the task returned, when its task keeps results (`keep_result`), else None."""
    return None if row.result is None else json.loads(row.result)


def task_progress(row: TaskRow) -> Any:
    """The last progress the task's handler reported (`ctx.progress`), or None."""
    report = row.progress_report
    if report is None:
        return None
    return {
        "done": report.done,
        "total": report.total,
        "fraction": report.fraction,
        "note": report.note,
        "attempt": report.attempt,
    }


#: The lines of `txtasks inspect`, in order: (label, field).
INSPECT_FIELDS = (
    ("state", "state"), ("queue", "queue"), ("task", "task_name"), ("key", "partition_key"),
    ("dedup key", "dedup_key"), ("priority", "priority"), ("attempts", "attempt"),
    ("created", "created_at"), ("run at", "run_at"), ("started", "started_at"),
    ("finished", "finished_at"), ("deadline", "expires_at"), ("worker", "worker_id"),
    ("lease until", "lease_expires_at"), ("cancel asked", "cancel_requested_at"),
    ("headers", "headers"), ("payload", "payload"), ("result", "result"),
    ("progress", "progress"), ("last error", "last_error"),
)  # fmt: skip


def inspect_text(data: dict[str, Any]) -> str:
    lines = [f"task {data['id']}"]
    for label, field in INSPECT_FIELDS:
        value = data.get(field)
        if field == "attempt":
            value = f"{data['attempt']} of {data['max_attempts']}"
        elif field in ("headers", "payload", "result", "progress") and value is not None:
            value = json.dumps(value, default=json_default)  # as `--json` shows them
        text = "-" if value is None else str(value)
        if "\n" in text:
            text = "\n  " + text.replace("\n", "\n  ")
        lines.append(f"{label + ':':<14}{text}")
    return "\n".join(lines)


@click.command()
@database_url_option
@click.argument("task_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(database_url: str | None, task_id: int, as_json: bool) -> None:
    """Everything stored about task ID, live or finished: state, attempts, errors, times,
    headers, key, queue, worker and lease."""
    row = with_driver(database_url, lambda driver: driver.tasks.task_get(task_id))
    if row is None:
        raise click.ClickException(f"task {task_id}: not found (no live or archived task)")
    data = inspect_json(row)
    if as_json:
        click.echo(json.dumps(data, default=json_default, indent=2))
    else:
        click.echo(inspect_text(data))


@click.command()
@database_url_option
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATES),
    help="Only tasks in this state (repeatable); default: every live state. Finished states "
    "are read from the archive.",
)
@click.option("--queue", help="Only this queue.")
@click.option("--task", "task_name", help="Only tasks of this task name.")
@click.option("--key", help="Only tasks with this key.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tasks(
    database_url: str | None,
    states: tuple[str, ...],
    queue: str | None,
    task_name: str | None,
    key: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List tasks: live ones newest first, then finished ones last finished first."""
    from txtasks.cli.tables import Grid, grids_print
    from txtasks.control import TaskFilter
    from txtasks.policy import error_summary

    where = TaskFilter(_queue_name(queue, "--queue"), task_name, key)
    chosen = [TaskState(s) for s in states] or None
    rows = with_driver(
        database_url, lambda d: d.tasks.task_list(states=chosen, where=where, limit=limit)
    )
    if as_json:
        click.echo(json.dumps([task_json(r) for r in rows], default=json_default, indent=2))
        return
    lines = []
    for r in rows:
        lines.append([
            str(r.id),
            r.state.value
            + (" (cancel asked)" if r.cancel_requested_at and r.state.is_live else ""),
            r.queue,
            r.task_name,
            r.partition_key or "",
            f"{r.attempt}/{r.max_attempts}",
            f"{r.run_at:%Y-%m-%d %H:%M:%S}",
            error_summary(r.last_error),
        ])  # fmt: skip
    headers = ["id", "state", "queue", "task", "key", "attempts", "run at", "error"]
    text = frozenset({"state", "queue", "task", "key", "error"})
    grids_print([Grid(f"tasks ({len(rows)})", headers, lines, text=text)])


COMMANDS = (cancel, pause, resume, inspect, tasks)
