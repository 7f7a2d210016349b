"""`txtasks status`: queues (depth by state, backlog, oldest ready task, rates, paused), the
busiest keys and the sections of installed services (txtasks.services: the backlog of deferred
Spark writes), as tables that fit the terminal, as JSON, once or refreshed until interrupted.

The JSON document (`--json`) is stable: fields are added, never renamed or removed, and
`version` changes if that ever has to happen. See docs/cli.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from txtasks.cli.common import (
    database_url_option,
    error_message,
    json_default,
    resolve_url,
    with_driver,
)
from txtasks.cli.tables import Grid, console_for, grids_print
from txtasks.clock import utcnow
from txtasks.services import StatusSection, age_text, status_sections
from txtasks.types import KeyStats, QueueRates, QueueStats, TaskState

if TYPE_CHECKING:
    from rich.console import Console

    from txtasks.driver import Driver

#: The version of the `--json` document.
JSON_VERSION = 1
#: Seconds over which arrivals and finishes are counted.
WINDOW = 60.0
STATES = [s.value for s in TaskState]


@dataclass(frozen=True)
class Snapshot:
    """What one look at the database saw."""

    at: datetime
    queues: list[QueueStats]
    rates: dict[str, QueueRates]
    keys: list[KeyStats]
    #: What the installed services report (the backlog of deferred Spark writes, `deferred`).
    sections: list[StatusSection] = field(default_factory=list)
    #: Cleaners whose heartbeat row is alive (txtasks.processes).
    cleaners_alive: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "at": _utc(self.at),
            "window_seconds": WINDOW,
            "queues": [self._queue_json(q) for q in self.queues],
            "keys": [_key_json(k) for k in self.keys],
            "cleaners_alive": self.cleaners_alive,
            **{section.key: dict(section.document) for section in self.sections},
        }

    def _queue_json(self, q: QueueStats) -> dict[str, Any]:
        rates = self.rates.get(q.queue) or QueueRates(q.queue, WINDOW)
        return {
            "queue": q.queue,
            "counts": q.counts,
            "ready": q.ready,
            "oldest_ready_age": q.oldest_ready_age,
            "paused": q.paused_at is not None,
            "paused_at": _utc(q.paused_at),
            "enqueued": rates.enqueued,
            "finished": rates.finished,
            "enqueued_per_second": rates.enqueued_per_second,
            "finished_per_second": rates.finished_per_second,
        }


def _key_json(k: KeyStats) -> dict[str, Any]:
    return {
        "queue": k.queue,
        "key": k.key,
        "waiting": k.waiting,
        "processing": k.processing,
        "rate_limited": k.rate_limited_until is not None,
        "rate_limited_until": _utc(k.rate_limited_until),
    }


def _utc(at: datetime | None) -> datetime | None:
    """Times are stored as naive UTC; in JSON they say so (`...+00:00`)."""
    return None if at is None else at.replace(tzinfo=timezone.utc)


async def snapshot_take(driver: Driver, keys: int) -> Snapshot:
    now = utcnow()
    queues = await driver.admin.queue_stats(now=now)
    rates = {r.queue: r for r in await driver.admin.queue_rates(now=now, window=WINDOW)}
    for queue in rates.keys() - {q.queue for q in queues}:  # all its tasks were purged since
        queues.append(QueueStats(queue))
    busiest = await driver.admin.key_stats(now=now, limit=keys) if keys else []
    sections = await status_sections(driver, now)
    processes = await driver.processes.process_list()
    cleaners = sum(1 for p in processes if p.kind == "cleaner" and p.alive(now))
    ordered = sorted(queues, key=lambda q: q.queue)
    return Snapshot(now, ordered, rates, busiest, sections, cleaners)


# -- tables ------------------------------------------------------------------------------------


def snapshot_grids(snapshot: Snapshot) -> list[Grid]:
    """The queue table, and the busiest keys' when there are any. States with no task in any
    queue get no column (`--json` has every count)."""
    shown = [s for s in STATES if any(q.counts.get(s) for q in snapshot.queues)]
    headers = ["queue", "ready", "oldest ready", *shown, "in/min", "done/min", "paused"]
    rows = []
    for q in snapshot.queues:
        rates = snapshot.rates.get(q.queue) or QueueRates(q.queue, WINDOW)
        age = "-" if q.oldest_ready_age is None else age_text(q.oldest_ready_age)
        counts = [str(q.counts.get(s, 0)) for s in shown]
        done = str(sum(rates.finished.values()))
        paused = "" if q.paused_at is None else "yes"
        rows.append([q.queue, str(q.ready), age, *counts, str(rates.enqueued), done, paused])
    grids = [Grid(f"txtasks status at {snapshot.at:%Y-%m-%d %H:%M:%S} UTC", headers, rows)]
    if snapshot.keys:
        keys = []
        for k in snapshot.keys:
            until = k.rate_limited_until
            limited = "" if until is None else f"{until:%H:%M:%S.%f}"[:-3]
            keys.append([k.queue, k.key, str(k.waiting), str(k.processing), limited])
        columns = ["queue", "key", "waiting", "processing", "limited until"]
        grids.append(Grid("busiest keys", columns, keys, text=frozenset({"key"})))
    for section in snapshot.sections:
        if section.rows:
            rows = [list(row) for row in section.rows]
            grids.append(Grid(section.title, list(section.headers), rows))
    return grids


#: What `status` says when no cleaner is alive.
NO_CLEANER = (
    "no cleaner is alive (no heartbeat row): the tasks of a worker that dies stay processing "
    "and periodic schedules do not fire; start one: txtasks cleaner APP"
)


def snapshot_print(snapshot: Snapshot, console: Console | None = None) -> Console:
    """Print the snapshot's tables at the console's width (see `console_for`), and a line
    when no cleaner is alive."""
    console = grids_print(snapshot_grids(snapshot), console)
    if not snapshot.cleaners_alive:
        console.print(NO_CLEANER, style="bold", markup=False)
    return console


# -- the command -------------------------------------------------------------------------------


@click.command()
@database_url_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (see docs/cli.md).")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 2) until Ctrl-C; with --json, one document a line.",
)
@click.option(
    "--keys",
    "key_count",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many of the busiest keys to show.",
)
def status(database_url: str | None, as_json: bool, watch: float | None, key_count: int) -> None:
    """Queues: tasks per state, ready tasks and the age of the oldest, tasks enqueued and
    finished in the last minute, paused or not; and the busiest keys."""
    if watch is None:
        snapshot = with_driver(database_url, lambda driver: snapshot_take(driver, key_count))
        if as_json:
            click.echo(json.dumps(snapshot.to_json(), default=json_default, indent=2))
            return
        snapshot_print(snapshot)
        return
    url = resolve_url(database_url)
    with_driver(url, lambda driver: _watch(driver, url, watch, key_count, as_json))


async def _watch(driver: Driver, url: str, interval: float, key_count: int, as_json: bool) -> None:
    """Refresh until SIGINT or SIGTERM: in place on a terminal, one snapshot after another
    otherwise (and always with --json). The first look must succeed (a wrong URL or schema
    ends the command); after it, a database that does not answer is reported on stderr once,
    retried every interval, and reported again when it answers."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    failing = False
    try:
        with Screen(as_json) as screen:
            screen.show(await snapshot_take(driver, key_count))
            while not await _stopped(stop, interval):
                try:
                    snapshot = await snapshot_take(driver, key_count)
                except Exception as exc:
                    message = error_message(exc, url)
                    if message is None:  # a bug: a traceback
                        raise
                    if not failing:
                        _note(f"{message}; trying again every {interval:g}s")
                    failing = True
                    continue
                if failing:
                    _note("the database answers again")
                failing = False
                screen.show(snapshot)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _stopped(stop: asyncio.Event, interval: float) -> bool:
    """Wait `interval` seconds or until stopped; whether stopped."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), interval)
    return stop.is_set()


def _note(text: str) -> None:
    click.echo(f"{utcnow():%Y-%m-%d %H:%M:%S} UTC: {text}", err=True)


class Screen:
    """Where `--watch` shows snapshots: rich Live on a terminal, else printed in turn."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.live: Any = None

    def __enter__(self) -> Screen:
        return self

    def show(self, snapshot: Snapshot) -> None:
        if self.as_json:
            click.echo(json.dumps(snapshot.to_json(), default=json_default))
            return
        from rich.console import Group
        from rich.live import Live
        from rich.text import Text

        grids = snapshot_grids(snapshot)
        console = console_for(grids)
        if not console.is_terminal:
            snapshot_print(snapshot, console)
            console.file.flush()
            return
        group = Group(*(table for g in grids for table in g.render(console.width)))
        if not snapshot.cleaners_alive:
            group.renderables.append(Text(NO_CLEANER, style="bold"))
        if self.live is None:
            self.live = Live(group, console=console, auto_refresh=False)
            self.live.start()
        self.live.update(group, refresh=True)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
