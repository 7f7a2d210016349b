"""Conformance suite: the heartbeat rows of workers and cleaners, on every database and in
memory: a first beat makes the row, later ones move its beat and what it runs (not when it
started), an ended process has no row, and rows expired long enough are forgotten."""

from __future__ import annotations

from datetime import timedelta

from tests.integration.conformance import at
from txtasks.driver import Driver
from txtasks.types import ProcessRow


def beat(pid: int, kind: str, second: float, runs: str, running: int | None = None) -> ProcessRow:
    return ProcessRow(
        id=f"{kind}-{pid}",
        kind=kind,
        host="host-1",
        pid=pid,
        runs=runs,
        running=running,
        started_at=at(second),
        beat_at=at(second),
        expires_at=at(second + 30),
    )


async def test_beats_make_and_move_a_row_per_process(driver: Driver) -> None:
    assert await driver.processes.process_list() == []
    await driver.processes.process_beat(beat(2, "worker", 0, "mail", 0), forget_before=at(-3600))
    await driver.processes.process_beat(
        beat(1, "cleaner", 1, "rescuer,archiver"), forget_before=at(-3600)
    )
    await driver.processes.process_beat(
        beat(2, "worker", 10, "mail,reports", 7), forget_before=at(-3600)
    )
    await driver.processes.process_beat(
        beat(2, "worker", 10, "mail,reports", 7), forget_before=at(-3600)
    )
    cleaner, worker = await driver.processes.process_list()
    assert cleaner == beat(1, "cleaner", 1, "rescuer,archiver")
    assert (worker.id, worker.runs, worker.running) == ("worker-2", "mail,reports", 7)
    assert (worker.started_at, worker.beat_at, worker.expires_at) == (at(0), at(10), at(40))
    assert worker.alive(at(39)) and not worker.alive(at(40))

    await driver.processes.process_end("worker-2")
    await driver.processes.process_end("worker-2")  # again: nothing to do
    assert [p.id for p in await driver.processes.process_list()] == ["cleaner-1"]


async def test_rows_expired_before_the_horizon_are_forgotten(driver: Driver) -> None:
    await driver.processes.process_beat(beat(1, "cleaner", 0, "rescuer"), forget_before=at(-3600))
    await driver.processes.process_beat(beat(2, "worker", 20, "mail", 0), forget_before=at(-3600))
    # cleaner-1 expired at 30 s: kept while the horizon is before that, forgotten after
    await driver.processes.process_beat(beat(2, "worker", 50, "mail", 0), forget_before=at(30))
    assert [p.id for p in await driver.processes.process_list()] == ["cleaner-1", "worker-2"]
    later = at(31) + timedelta(microseconds=1)
    await driver.processes.process_beat(beat(2, "worker", 60, "mail", 0), forget_before=later)
    assert [p.id for p in await driver.processes.process_list()] == ["worker-2"]
