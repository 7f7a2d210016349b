"""The progress writer: reports coalesced per attempt, one write per interval at most, each
report stored within an interval, reports kept across a failed write. The rest between writes
is a hook the test opens, so no test waits for a clock."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime

from tests.waiting import until
from txtasks.clock import utcnow
from txtasks.types import TaskKey
from txtasks.worker.progress import ProgressWriter

A, B = TaskKey(1, 1), TaskKey(2, 1)


class Store:
    """The driver's `lease_extend_many`, recording each write (or failing on demand)."""

    def __init__(self) -> None:
        self.writes: list[dict[TaskKey, str]] = []
        self.fail = False
        #: Rows another transaction holds: left out of the next write.
        self.locked: set[TaskKey] = set()
        #: The role the progress writer uses is this object.
        self.claims = self

    async def lease_extend_many(
        self,
        keys: Sequence[TaskKey],
        *,
        lease_until: datetime,
        worker_id: str | None = None,
        progress: Mapping[TaskKey, str] | None = None,
        left_out: set[TaskKey] | None = None,
    ) -> int:
        if self.fail:
            raise ConnectionError("database away")
        assert progress is not None and set(keys) == set(progress) and worker_id == "w"
        assert left_out is not None
        left_out.update(k for k in keys if k in self.locked)
        self.writes.append({k: v for k, v in progress.items() if k not in self.locked})
        self.locked.clear()
        return len(keys)


class Gate:
    """The writer's rest: entered after each write, left when the test opens it."""

    def __init__(self) -> None:
        self.resting = asyncio.Event()
        self.opened = asyncio.Event()

    async def rest(self, stop: asyncio.Event) -> bool:
        self.resting.set()
        await self.opened.wait()
        self.opened.clear()
        self.resting.clear()
        return stop.is_set()

    async def rested(self) -> None:
        await asyncio.wait_for(self.resting.wait(), 10)


def writer(store: Store, gate: Gate, held: set[TaskKey] | None = None) -> ProgressWriter:
    return ProgressWriter(
        store,  # type: ignore[arg-type]
        utcnow,
        interval=1.0,
        lease=30.0,
        worker_id="w",
        held=held,
        rest=gate.rest,
    )


async def test_reports_are_coalesced_and_written_at_most_once_per_interval() -> None:
    store, gate, stop = Store(), Gate(), asyncio.Event()
    progress = writer(store, gate)
    running = asyncio.create_task(progress.run(stop))
    try:
        for n in range(1000):  # a burst of reports: one write, the latest of each attempt
            progress.report(A, f"a{n}")
        progress.report(B, "b0")
        await gate.rested()
        assert store.writes == [{A: "a999", B: "b0"}]

        progress.report(A, "a1000")  # while the writer rests: no write until the interval ends
        progress.report(A, "a1001")
        await asyncio.sleep(0)
        assert len(store.writes) == 1 and progress.pending == {A: "a1001"}
        gate.opened.set()  # the interval is over: the pending report is written at once
        await until(lambda: len(store.writes) == 2, "the second write")
        assert store.writes[1] == {A: "a1001"}
        await gate.rested()
        gate.opened.set()  # nothing reported meanwhile: no write
        await until(lambda: not gate.resting.is_set(), "the writer waits for reports")
        assert len(store.writes) == 2 and progress.writes == 2
    finally:
        stop.set()
        gate.opened.set()
        await asyncio.wait_for(running, 10)


async def test_a_failed_write_keeps_its_reports_unless_newer_ones_came() -> None:
    store = Store()
    progress = writer(store, Gate())
    progress.report(A, "a1")
    progress.report(B, "b1")
    store.fail = True
    await progress.write()
    assert store.writes == [] and progress.pending == {A: "a1", B: "b1"}
    progress.pending[A] = "a2"  # reported while the write failed (the dict is bounded:
    store.fail = False  # one entry per attempt)
    await progress.write()
    assert store.writes == [{A: "a2", B: "b1"}] and progress.pending == {}


async def test_stop_writes_what_is_left() -> None:
    store, stop = Store(), asyncio.Event()
    gate = Gate()
    progress = writer(store, gate)
    running = asyncio.create_task(progress.run(stop))
    progress.report(A, "a1")
    await gate.rested()
    progress.report(A, "a2")
    stop.set()
    gate.opened.set()
    await asyncio.wait_for(running, 10)
    assert store.writes == [{A: "a1"}, {A: "a2"}]


async def test_a_report_left_out_is_written_next_time_while_its_attempt_runs() -> None:
    """A row another transaction held (a claim passing by) is left out of a write: its report
    waits for the next one, unless its attempt has ended here meanwhile."""
    store, held = Store(), {A, B}
    progress = writer(store, Gate(), held)
    progress.report(A, "a1")
    progress.report(B, "b1")
    store.locked = {A, B}
    held.discard(B)  # B's attempt ended: its outcome is written, its report is not needed
    await progress.write()
    assert store.writes == [{}] and progress.pending == {A: "a1"}
    await progress.write()
    assert store.writes[1] == {A: "a1"} and progress.pending == {}
