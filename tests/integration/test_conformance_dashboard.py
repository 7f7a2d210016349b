"""Conformance suite: the dashboard's reads (the `Dashboard` role) give the same answers in
memory and on every database, for one small seeded set of tasks.

Time is passed in (`NOW`): the seeded tasks were enqueued and finished at known minutes of the
hour before it, so every answer below is written out in full.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from tests.integration.conformance import at, claim, get, new, write
from txtasks.driver import Driver
from txtasks.driver.base import QueueDepth, TaskPage, TaskQuery, task_cursor
from txtasks.keys import KeyLimits
from txtasks.types import KeyStats, NewTask, Outcome, OutcomeKind, TaskState

#: The dashboard's "now": ten minutes after T0 (03:04:05 on 2030-01-02), so its last hour of
#: minutes starts at 02:15 (slot 0) and T0's minute is slot 49.
NOW = at(600)
#: The slots of the minutes the seeded tasks were enqueued and finished in.
SLOT = {"03:02": 47, "03:04": 49, "03:05": 50, "03:06": 51, "03:07": 52, "03:09": 54}


@dataclasses.dataclass
class Seeded:
    """The ids of the seeded tasks, by name."""

    ids: dict[str, int]

    def __getitem__(self, name: str) -> int:
        return self.ids[name]


def made(task: NewTask, *, created: datetime, name: str | None = None) -> NewTask:
    return dataclasses.replace(task, created_at=created, task_name=name or task.task_name)


async def seed(driver: Driver) -> Seeded:
    """Queue a: ready tasks with and without a key, one scheduled later. Queue b: one task
    processing, one waiting for its retry, one each completed, dead and failed. Queue c: two
    dead letters enqueued before the hour."""
    ids: dict[str, int] = {}

    async def insert(name: str, task: NewTask) -> None:
        [ids[name]] = await driver.tasks.task_insert_many([task])

    await insert("a1", made(new(queue="a", run_at=at(0)), created=at(0), name="other.task"))
    await insert("a2", made(new(queue="a", run_at=at(3600)), created=at(0)))
    await insert("a3", made(new(queue="a", run_at=at(10), key="k1"), created=at(0)))
    await insert("a4", made(new(queue="a", run_at=at(10), key="k1"), created=at(0)))
    await insert("a5", made(new(queue="a", run_at=at(10), key="k2"), created=at(0)))
    for name in ("b1", "b2", "b3", "b4", "b5"):
        await insert(name, made(new(queue="b"), created=at(-120)))
    for name in ("c1", "c2"):
        await insert(name, made(new(queue="c"), created=at(-7200)))
    claimed = {r.id: r.key for r in await claim(driver, ["b", "c"], now=at(20))}
    assert len(claimed) == 7

    def outcome(
        name: str, kind: OutcomeKind, error: str | None = None, run_at: datetime | None = None
    ) -> Outcome:
        return Outcome(claimed[ids[name]], kind, error=error, run_at=run_at)

    await write(driver, outcome("b2", OutcomeKind.COMPLETE), now=at(60))
    await write(driver, outcome("b3", OutcomeKind.DEAD, error="disk full"), now=at(130))
    await write(driver, outcome("b4", OutcomeKind.FAIL, error="bad row 4"), now=at(200))
    retry = outcome("b5", OutcomeKind.RETRY, error="boom: Upstream timed out", run_at=at(7200))
    await write(driver, retry, now=at(250))
    dead = [outcome(n, OutcomeKind.DEAD, error=f"{n}: disk full") for n in ("c1", "c2")]
    await write(driver, *dead, now=at(300))
    return Seeded(ids)


@pytest.fixture
async def seeded(driver: Driver) -> Seeded:
    return await seed(driver)


async def test_depths_per_queue(driver: Driver, seeded: Seeded) -> None:
    depths = await driver.dashboard.depths(now=NOW)
    assert depths == {
        "a": QueueDepth("a", ready=4, scheduled=1, oldest_ready=at(0)),
        "b": QueueDepth("b", scheduled=1, processing=1, dead=1),
        "c": QueueDepth("c", dead=2),
    }


async def test_depths_stop_at_their_cap(driver: Driver, seeded: Seeded) -> None:
    depths = await driver.dashboard.depths(now=NOW, cap=2)
    assert depths["c"] == QueueDepth("c", dead=2, capped=True)
    assert depths["b"] == QueueDepth("b", scheduled=1, processing=1, dead=1)


async def test_busy_keys(driver: Driver, seeded: Seeded) -> None:
    assert await driver.dashboard.busy_keys(now=NOW) == [
        KeyStats("a", "k1", 2, 0),
        KeyStats("a", "k2", 1, 0),
    ]
    assert await driver.dashboard.busy_keys(now=NOW, limit=1) == [KeyStats("a", "k1", 2, 0)]
    assert await driver.dashboard.busy_keys(now=NOW, cap=1) == [
        KeyStats("a", "k1", 1, 0),
        KeyStats("a", "k2", 1, 0),
    ]


async def test_finished_and_arrived_per_minute(driver: Driver, seeded: Seeded) -> None:
    def series(minute: str, count: int) -> list[int]:
        found = [0] * 60
        found[SLOT[minute]] = count
        return found

    assert await driver.dashboard.finished_per_minute(now=NOW) == {
        "b": {
            "completed": series("03:05", 1),
            "dead": series("03:06", 1),
            "failed": series("03:07", 1),
        },
        "c": {"dead": series("03:09", 2)},
    }
    # queue c's tasks were enqueued before the hour: finished in it, but not arrived
    assert await driver.dashboard.arrived_per_minute(now=NOW) == {
        "a": series("03:04", 5),
        "b": series("03:02", 5),
    }
    # a shorter window: the last 7 minutes (03:08 to 03:14)
    assert await driver.dashboard.finished_per_minute(now=NOW, minutes=7) == {
        "c": {"dead": [0, 2, 0, 0, 0, 0, 0]}
    }
    assert await driver.dashboard.arrived_per_minute(now=NOW, minutes=7) == {}


async def page_of(driver: Driver, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
    return await driver.dashboard.task_page(query, cursor, limit)


async def test_pages_of_live_tasks(driver: Driver, seeded: Seeded) -> None:
    s = seeded
    live = [s["b5"], s["b1"], s["a5"], s["a4"], s["a3"], s["a2"], s["a1"]]  # newest first
    first = await page_of(driver, TaskQuery(), None, 3)
    assert [r.id for r in first.rows] == live[:3]
    assert first.next_cursor == str(live[2])
    second = await page_of(driver, TaskQuery(), first.next_cursor, 3)
    assert [r.id for r in second.rows] == live[3:6]
    last = await page_of(driver, TaskQuery(), second.next_cursor, 3)
    assert ([r.id for r in last.rows], last.next_cursor) == ([s["a1"]], None)
    assert first.rows[0] == await get(driver, s["b5"])  # whole rows

    by = {
        TaskQuery(queue="a", key="k1"): [s["a4"], s["a3"]],
        TaskQuery(state="retryable"): [s["b5"]],
        TaskQuery(state="processing", queue="b"): [s["b1"]],
        TaskQuery(task_name="other.task"): [s["a1"]],
        TaskQuery(queue="c"): [],
        TaskQuery(error="upstream"): [s["b5"]],  # case-insensitive
        TaskQuery(state="pending", error="upstream"): [],
    }
    for query, expected in by.items():
        page = await page_of(driver, query, None, 10)
        assert ([r.id for r in page.rows], page.next_cursor) == (expected, None), query


async def test_pages_of_finished_tasks(driver: Driver, seeded: Seeded) -> None:
    s = seeded
    dead = TaskQuery(state="dead")
    first = await page_of(driver, dead, None, 2)
    c1 = await get(driver, s["c1"])
    assert [r.id for r in first.rows] == [s["c2"], s["c1"]]  # last finished, then by id
    assert first.next_cursor == task_cursor(c1, live=False) == f"{at(300).isoformat()}~{c1.id}"
    second = await page_of(driver, dead, first.next_cursor, 2)
    assert ([r.id for r in second.rows], second.next_cursor) == ([s["b3"]], None)
    assert second.rows[0].state is TaskState.DEAD and second.rows[0].last_error == "disk full"

    by = {
        TaskQuery(state="dead", queue="b"): [s["b3"]],
        TaskQuery(state="completed"): [s["b2"]],
        TaskQuery(state="failed", error="BAD ROW"): [s["b4"]],
        TaskQuery(state="cancelled"): [],
    }
    for query, expected in by.items():
        page = await page_of(driver, query, None, 10)
        assert ([r.id for r in page.rows], page.next_cursor) == (expected, None), query

    # more tasks with the text than the page holds: the page ends at the last one shown
    disk = TaskQuery(state="dead", error="disk")
    page = await page_of(driver, disk, None, 1)
    assert [r.id for r in page.rows] == [s["c2"]]
    page = await page_of(driver, disk, page.next_cursor, 1)
    assert [r.id for r in page.rows] == [s["c1"]]
    page = await page_of(driver, disk, page.next_cursor, 1)
    assert ([r.id for r in page.rows], page.next_cursor) == ([s["b3"]], None)


async def test_run_now_makes_a_waiting_task_due_and_its_key_looked_at(
    driver: Driver, seeded: Seeded
) -> None:
    s = seeded
    [later] = await driver.tasks.task_insert_many([new(queue="d", run_at=at(3600), key="k3")])
    keys = {"d": KeyLimits(concurrency=1)}
    assert await claim(driver, ["d"], now=NOW, keys=keys) == []  # not due yet
    assert await driver.control.task_run_now(later, now=NOW) == "d"
    assert (await get(driver, later)).run_at == NOW
    assert [r.id for r in await claim(driver, ["d"], now=NOW, keys=keys)] == [later]
    # not waiting: processing, retrying is waiting, finished, unknown
    assert await driver.control.task_run_now(later, now=NOW) is None
    assert await driver.control.task_run_now(s["b5"], now=NOW) == "b"
    assert await driver.control.task_run_now(s["b2"], now=NOW) is None
    assert await driver.control.task_run_now(999_999, now=NOW) is None
    depths = await driver.dashboard.depths(now=NOW)
    assert (depths["b"].ready, depths["b"].scheduled, depths["b"].oldest_ready) == (1, 0, NOW)


async def test_running_tasks_by_worker(driver: Driver, seeded: Seeded) -> None:
    """b1 is running on worker w1 (claimed at T0 + 20 s); two more claimed by w2 a second
    apart: each worker's tasks in the order it started them, up to `per_worker`, and how many
    it runs."""
    later = [
        await driver.tasks.task_insert_many([made(new(queue="d", key=k), created=at(0))])
        for k in (None, "k9")
    ]
    [first] = await claim(driver, ["d"], 1, now=at(30), worker="w2")
    [second] = await claim(driver, ["d"], 1, now=at(31), worker="w2")
    assert [first.id, second.id] == [i for [i] in later]
    busy = await driver.dashboard.running_by_worker(per_worker=10)
    assert sorted(busy) == ["w1", "w2"]
    [b1] = busy["w1"].tasks
    assert (b1.id, b1.queue, b1.attempt, b1.started_at) == (seeded["b1"], "b", 1, at(20))
    assert busy["w1"].total == 1
    assert b1.lease_expires_at is not None and b1.worker_id == "w1"
    assert [t.id for t in busy["w2"].tasks] == [first.id, second.id]
    assert busy["w2"].tasks[1].partition_key == "k9"
    one = await driver.dashboard.running_by_worker(per_worker=1)
    assert [t.id for t in one["w2"].tasks] == [first.id] and one["w2"].total == 2


async def test_finished_times_and_their_percentiles(driver: Driver, seeded: Seeded) -> None:
    from txtasks.driver.timings import TaskTimings, task_timings

    found = await driver.dashboard.finished_times(since=at(0), limit=10)
    # last finished first: queue c's two dead letters, then b4, b3, b2 (claimed at 20 s)
    assert [r.state for r in found] == ["dead", "dead", "failed", "dead", "completed"]
    assert [r.finished_at for r in found][2:] == [at(200), at(130), at(60)]
    assert {r.started_at for r in found} == {at(20)} and {r.run_at for r in found} == {at(0)}
    assert task_timings(found) == [
        TaskTimings("conformance.task", 5, 4, 20.0, 20.0, 180.0, 280.0),
    ]
    # at most `limit` of each state; finished since `since` only
    some = await driver.dashboard.finished_times(since=at(0), limit=1)
    assert sorted(r.state for r in some) == ["completed", "dead", "failed"]
    later = await driver.dashboard.finished_times(since=at(100), limit=10)
    assert [r.state for r in later] == ["dead", "dead", "failed", "dead"]


async def test_pages_of_tasks_with_text_in_their_payload(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many(
        [
            new({"order": "A-17"}, queue="p"),
            new(b"\xff raw a-17", queue="p"),  # not UTF-8: its bytes are read as UTF-8
            new({"order": "B-2"}, queue="p"),
            new({"order": "a-17 again"}, queue="p2"),
        ]
    )
    [claimed] = await claim(driver, ["p2"], now=at(20))
    await write(driver, Outcome(claimed.key, OutcomeKind.DEAD, error="boom"), now=at(30))
    by = {
        TaskQuery(queue="p", payload="A-17"): [ids[1], ids[0]],
        TaskQuery(payload="b-2"): [ids[2]],
        TaskQuery(state="dead", payload="a-17"): [ids[3]],
        TaskQuery(state="dead", payload="a-17", error="BOOM"): [ids[3]],
        TaskQuery(state="dead", payload="a-17", error="nope"): [],
        TaskQuery(payload="not there"): [],
    }
    for query, expected in by.items():
        page = await page_of(driver, query, None, 10)
        assert ([r.id for r in page.rows], page.next_cursor) == (expected, None), query
    first = await page_of(driver, TaskQuery(payload="a-17"), None, 1)
    assert [r.id for r in first.rows] == [ids[1]] and first.next_cursor == str(ids[1])
    second = await page_of(driver, TaskQuery(payload="a-17"), first.next_cursor, 1)
    assert ([r.id for r in second.rows], second.next_cursor) == ([ids[0]], None)
