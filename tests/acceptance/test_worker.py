"""`txtasks worker` as an operator runs it: real processes, real signals, on every backend.

Each test starts the CLI in subprocesses (`python -m txtasks worker tests.acceptance.apps:app`)
against the `database_url` fixture's database and checks the outcome from the database alone.
Nothing waits on wall-clock time: tests wait for observable state (rows in a state, a log line,
a process exit) with a deadline.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests import pace
from tests.acceptance.apps import (
    APP_SPEC,
    QUEUE,
    Live,
    Proc,
    Processes,
    archived_rows,
    effects_per_task,
    enqueue,
    live_rows,
    run_rows,
    wait_until,
)
from txtasks.clock import utcnow
from txtasks.schema.tables import tasks

pytestmark = pytest.mark.acceptance

BURST = ("--burst", "--burst-horizon", "1", "--poll-interval", "0.05")
#: Seconds a worker may take to exit before the test fails (a hang must not block CI).
EXIT_TIMEOUT = pace.seconds(30)


# -- several workers ----------------------------------------------------------------------------

WORKERS = 3
TASKS = 600


def test_burst_workers_drain_the_queue_running_each_task_once(
    database_url: str, db: Engine, procs: Processes
) -> None:
    # Every task first waits until all WORKERS processes run tasks (a barrier in the database):
    # a worker whose slots are all blocked claims nothing more, so each worker must do work.
    ids = enqueue(db, "acc.record", [{"n": n, "barrier": WORKERS} for n in range(TASKS)])
    workers = [procs.start("worker", APP_SPEC, *BURST, url=database_url) for _ in range(WORKERS)]

    codes = [w.wait(timeout=pace.seconds(120)) for w in workers]

    assert codes == [0] * WORKERS, "\n".join(w.stderr for w in workers)
    effects = effects_per_task(db)
    assert set(effects) == set(ids)
    assert {i: n for i, n in effects.items() if n != 1} == {}, "tasks that ran more than once"
    finished = archived_rows(db)
    assert set(finished) == set(ids)
    assert {(f.state, f.attempt) for f in finished.values()} == {("completed", 1)}
    assert live_rows(db) == {}
    assert {r.pid for r in run_rows(db)} == {w.pid for w in workers}


# -- graceful stop ------------------------------------------------------------------------------


@dataclass
class Blocked:
    """A worker whose every slot holds a running handler that waits at `gate`."""

    ids: list[int]
    worker: Proc
    gate: Path
    running: set[int]


def start_blocked(
    db: Engine,
    procs: Processes,
    tmp_path: Path,
    url: str,
    task: str,
    *,
    tasks: int,
    slots: int,
    options: tuple[str, ...] = (),
) -> Blocked:
    """Enqueue `tasks` gated tasks and start a worker with `slots` slots; return once its
    `slots` handlers run (rows only claimed, not started yet, would be handed back at a stop)."""
    gate, started = tmp_path / "gate", tmp_path / "started"
    started.mkdir()
    payloads = [{"n": n, "gate": str(gate), "started": str(started)} for n in range(tasks)]
    ids = enqueue(db, task, payloads)
    worker = procs.start(
        "worker", APP_SPEC, "-c", str(slots), "--poll-interval", "0.05", *options, url=url
    )

    def running() -> set[int]:
        return {int(p.name) for p in started.iterdir()}

    wait_until(lambda: len(running()) == slots, f"{slots} handlers running", watch=[worker])
    return Blocked(ids, worker, gate, running())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_lets_inflight_tasks_finish_and_loses_nothing(
    database_url: str, db: Engine, procs: Processes, tmp_path: Path, signum: signal.Signals
) -> None:
    blocked = start_blocked(db, procs, tmp_path, database_url, "acc.gated", tasks=20, slots=5)
    ids, worker, gate = blocked.ids, blocked.worker, blocked.gate
    running = blocked.running
    assert running == {i for i, row in live_rows(db).items() if row.state == "processing"}

    worker.signal(signum)
    name = signal.Signals(signum).name
    wait_until(lambda: f"{name} received" in worker.stderr, f"{name} to be logged", watch=[worker])
    gate.touch()  # the in-flight tasks may now finish, within the grace period

    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
    finished = archived_rows(db)
    seen = f"live {live_rows(db)}; runs {run_rows(db)}; worker log:\n{worker.stderr}"
    assert set(finished) == running, seen
    assert {(f.state, f.attempt) for f in finished.values()} == {("completed", 1)}
    live = live_rows(db)
    assert set(live) == set(ids) - running, "a stopping worker claimed more tasks"
    assert set(live.values()) == {Live("pending", 0, None)}
    assert effects_per_task(db) == dict.fromkeys(running, 1)
    if signum != signal.SIGTERM:
        return  # the rest is the same for both signals

    burst = procs.start("worker", APP_SPEC, *BURST, url=database_url)
    assert burst.wait(timeout=EXIT_TIMEOUT) == 0, burst.stderr
    assert live_rows(db) == {}
    finished = archived_rows(db)
    assert set(finished) == set(ids)
    assert {(f.state, f.attempt) for f in finished.values()} == {("completed", 1)}
    assert effects_per_task(db) == dict.fromkeys(ids, 1)


@pytest.mark.parametrize("task", ["acc.gated", "acc.gated_sync"], ids=["async", "sync"])
def test_task_outliving_the_grace_period_is_handed_back(
    database_url: str, db: Engine, procs: Processes, tmp_path: Path, task: str
) -> None:
    grace = ("--shutdown-grace", "0.2")
    blocked = start_blocked(
        db, procs, tmp_path, database_url, task, tasks=2, slots=2, options=grace
    )
    ids, worker = blocked.ids, blocked.worker  # the gate never opens

    worker.signal(signal.SIGTERM)

    # The handlers would block for a minute; the worker gives them 0.2 s.
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
    assert "handed back" in worker.stderr
    assert archived_rows(db) == {}
    assert live_rows(db) == dict.fromkeys(ids, Live("pending", 0, None))
    assert run_rows(db) == []


@pytest.mark.parametrize("task", ["acc.gated", "acc.gated_sync"], ids=["async", "sync"])
def test_second_sigint_stops_at_once(
    database_url: str, db: Engine, procs: Processes, tmp_path: Path, task: str
) -> None:
    grace = ("--shutdown-grace", "300")
    blocked = start_blocked(
        db, procs, tmp_path, database_url, task, tasks=2, slots=2, options=grace
    )
    ids, worker = blocked.ids, blocked.worker  # the gate never opens

    worker.signal(signal.SIGINT)
    wait_until(lambda: "SIGINT received" in worker.stderr, "the first SIGINT", watch=[worker])
    worker.signal(signal.SIGINT)

    # Well within the 300 s grace the first SIGINT granted.
    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
    assert "stopping now" in worker.stderr
    assert archived_rows(db) == {}
    assert live_rows(db) == dict.fromkeys(ids, Live("pending", 0, None))
    assert run_rows(db) == []


def test_a_burst_worker_with_sync_handlers_exits_through_its_exit_hooks(
    database_url: str, db: Engine, procs: Processes, tmp_path: Path
) -> None:
    """Only a sync handler still running past the grace period makes the worker skip the
    interpreter's exit (and with it `atexit` hooks: telemetry flushes, log handlers); idle
    threads of the pool do not."""
    hook = tmp_path / "exited"
    ids = enqueue(db, "acc.record", [{"n": n, "at_exit": str(hook)} for n in range(3)])
    worker = procs.start("worker", APP_SPEC, *BURST, url=database_url)

    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
    assert effects_per_task(db) == dict.fromkeys(ids, 1)
    assert hook.exists(), "the worker exited without running its atexit hooks"


def test_idle_worker_stops_at_once(database_url: str, db: Engine, procs: Processes) -> None:
    """A worker waiting for its next poll does not sleep through a SIGTERM."""
    worker = procs.start("worker", APP_SPEC, "--poll-interval", "600", url=database_url)
    wait_until(lambda: "serving acc" in worker.stderr, "the worker to start", watch=[worker])

    worker.signal(signal.SIGTERM)

    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
    assert "stopped" in worker.stderr


# -- bad rows -----------------------------------------------------------------------------------


def test_bad_rows_are_dead_lettered_and_the_worker_goes_on(
    database_url: str, db: Engine, procs: Processes
) -> None:
    """Also: with --no-archive-completed, completed tasks leave no row; dead letters stay."""
    now = utcnow()
    row = {
        "queue": QUEUE,
        "state": "pending",
        "priority": 0,
        "run_at": now,
        "attempt": 0,
        "max_attempts": 3,
        "created_at": now,
        "task_name": "acc.record",
        "payload": b"{}",
        "content_type": "application/json",
    }
    bad_rows = {
        "unknown task": {**row, "task_name": "acc.no_such_task"},
        "not json": {**row, "payload": b"\xff\xfe{not json"},
        "pickle": {**row, "payload": b"\x80\x04K\x01.", "content_type": "application/x-pickle"},
        "no attempts": {**row, "max_attempts": 0},
    }
    with db.begin() as conn:  # inserted first: the worker meets them before the good tasks
        bad = {
            kind: conn.execute(tasks.insert().values(**values)).inserted_primary_key[0]
            for kind, values in bad_rows.items()
        }
    good = enqueue(db, "acc.record", [{"n": n} for n in range(5)])

    options = ("-c", "2", "--no-archive-completed")
    worker = procs.start("worker", APP_SPEC, *options, *BURST, url=database_url)

    assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
    finished = archived_rows(db)
    assert set(finished) == set(bad.values())
    assert {kind: finished[i].state for kind, i in bad.items()} == dict.fromkeys(bad, "dead")
    reasons = {kind: finished[i].last_error or "" for kind, i in bad.items()}
    assert "acc.no_such_task" in reasons["unknown task"]
    assert "no task named" in reasons["unknown task"]
    assert "cannot decode payload" in reasons["not json"]
    assert "not valid JSON" in reasons["not json"]
    assert "application/x-pickle" in reasons["pickle"]
    assert "max_attempts" in reasons["no attempts"]
    assert live_rows(db) == {}
    assert effects_per_task(db) == dict.fromkeys(good, 1)
