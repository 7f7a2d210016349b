"""`txtasks cleaner` as an operator runs it: real processes, real signals, on every backend.

Workers and cleaners run as subprocesses (`python -m txtasks worker|cleaner APP`) against the
`database_url` fixture's database; outcomes are checked from the database alone. Nothing waits
on wall-clock time: tests wait for observable state (rows in a state, a log line, a process
exit) with a deadline.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from tests import pace
from tests.acceptance.apps import (
    APP_SPEC,
    PERIODIC_APP_SPEC,
    PERIODIC_EVERY,
    PERIODIC_NAME,
    REPO,
    SUICIDE_ATTEMPTS,
    Live,
    Proc,
    Processes,
    archived_rows,
    cli,
    cli_env,
    cli_many,
    count_state,
    effects_per_task,
    enqueue,
    http_get,
    live_rows,
    run_rows,
    wait_until,
)
from txtasks.clock import utcnow
from txtasks.periodic import EPOCH
from txtasks.schema.tables import archive, tasks

pytestmark = pytest.mark.acceptance

SWEEPS = {
    "rescuer",
    "reannouncer",
    "archiver",
    "retention",
    "periodic",
    "stats",
    "publisher",
    "staged_purge",
}
#: A cleaner that only rescues, often (the default pass interval is 5 s).
RESCUER = ("--only", "rescuer", "--set", "rescuer.interval=0.2")
POLL = ("--poll-interval", "0.05")
#: Seconds a process may take to exit before the test fails (a hang must not block CI).
EXIT_TIMEOUT = pace.seconds(30)
#: Seconds a test waits for the work it started to be done (generous: CI machines are slow).
DONE_TIMEOUT = 60


def processing(db: Engine) -> set[int]:
    return {i for i, row in live_rows(db).items() if row.state == "processing"}


#: What a worker and a cleaner log once they handle SIGTERM (a process still starting up would
#: die of it instead).
STARTED = re.compile(r"worker \S+ serving|cleaner started")


def started(proc: Proc) -> None:
    wait_until(lambda: STARTED.search(proc.stderr), f"pid {proc.pid} to start", watch=[proc])


def stop(*procs: Proc) -> None:
    """SIGTERM each process once it has started, then require a clean exit from every one."""
    for proc in procs:
        started(proc)
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=EXIT_TIMEOUT) == 0, proc.stderr


def rescued(cleaner: Proc) -> Counter[str]:
    """What the cleaner's rescue passes did, summed from its log ("sweep=rescuer ok=true ...")."""
    total: Counter[str] = Counter()
    for line in cleaner.stderr.splitlines():
        if "sweep=rescuer ok=true" in line:
            total.update(
                {
                    k: int(v)
                    for k, v in re.findall(r"(retried|dead|finished|skipped|cancelled)=(\d+)", line)
                }
            )
    return total


# -- dead workers -------------------------------------------------------------------------------

TASKS = 12
SLOTS = 4


def test_tasks_of_a_killed_worker_are_rescued_and_run_once(
    database_url: str, db: Engine, procs: Processes, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    ids = enqueue(db, "acc.gated", [{"n": n, "gate": str(gate)} for n in range(TASKS)])
    options = ("-c", str(SLOTS), "--lease", str(pace.seconds(2)), *POLL)
    doomed = procs.start("worker", APP_SPEC, *options, url=database_url)
    # Every slot holds a task blocked on the gate: the worker cannot claim more.
    wait_until(lambda: len(processing(db)) == SLOTS, f"{SLOTS} tasks processing", watch=[doomed])
    in_flight = processing(db)

    doomed.signal(signal.SIGKILL)
    assert doomed.wait(timeout=EXIT_TIMEOUT) == -signal.SIGKILL
    # Its tasks stay claimed by a worker that is gone: only their lease says so.
    assert processing(db) == in_flight

    cleaner = procs.start("cleaner", APP_SPEC, *RESCUER, url=database_url)
    worker = procs.start("worker", APP_SPEC, "-c", str(SLOTS), *POLL, url=database_url)
    gate.touch()
    wait_until(
        lambda: len(archived_rows(db)) == TASKS,
        f"all {TASKS} tasks finished",
        timeout=DONE_TIMEOUT,
        watch=[cleaner, worker],
    )
    stop(cleaner, worker)

    finished = archived_rows(db)
    seen = f"runs {run_rows(db)}; cleaner log:\n{cleaner.stderr}"
    assert set(finished) == set(ids), seen
    assert {i: (f.state, f.attempt) for i, f in finished.items()} == {
        i: ("completed", 2 if i in in_flight else 1) for i in ids
    }, seen
    assert live_rows(db) == {}
    assert effects_per_task(db) == dict.fromkeys(ids, 1), "each task takes effect exactly once"
    assert {r.pid for r in run_rows(db)} == {worker.pid}, "the killed worker finished nothing"
    assert rescued(cleaner) == {
        "retried": SLOTS,
        "dead": 0,
        "finished": 0,
        "skipped": 0,
        "cancelled": 0,
    }, seen


def test_task_that_kills_its_worker_is_dead_lettered(
    database_url: str, db: Engine, procs: Processes
) -> None:
    """A poison task that takes its worker down with it on every attempt still ends: each
    attempt counts at claim time, and the cleaner dead-letters it after the last one."""
    before = enqueue(db, "acc.record", [{"n": n} for n in range(5)])
    [poison] = enqueue(db, "acc.suicide", [{"poison": True}])
    after = enqueue(db, "acc.record", [{"n": n} for n in range(5, 10)])
    normal = before + after

    cleaner = procs.start("cleaner", APP_SPEC, *RESCUER, url=database_url)
    # a live worker starved past its lease would lose the poison to the rescuer while it runs
    worker_options = ("-c", "1", "--lease", str(pace.seconds(1)), *POLL)
    workers = [procs.start("worker", APP_SPEC, *worker_options, url=database_url)]

    def replace_dead_worker() -> None:
        """The poison took the worker down (as an operator's supervisor would, start another)."""
        if workers[-1].popen.poll() is not None:
            assert workers[-1].popen.returncode == -signal.SIGKILL, workers[-1].stderr
            assert len(workers) <= SUICIDE_ATTEMPTS, "the poison ran more than max_attempts"
            workers.append(procs.start("worker", APP_SPEC, *worker_options, url=database_url))

    def poison_done() -> bool:
        replace_dead_worker()
        return poison in archived_rows(db)

    wait_until(poison_done, "the poison task to be archived", timeout=DONE_TIMEOUT, watch=[cleaner])
    replace_dead_worker()
    wait_until(
        lambda: set(archived_rows(db)) == {poison, *normal},
        "the other tasks to finish",
        timeout=DONE_TIMEOUT,
        watch=[cleaner, workers[-1]],
    )
    stop(cleaner, workers[-1])

    seen = f"live {live_rows(db)}; cleaner log:\n{cleaner.stderr}"
    dead = archived_rows(db)[poison]
    assert (dead.state, dead.attempt) == ("dead", SUICIDE_ATTEMPTS), seen
    assert "lease expired" in (dead.last_error or ""), dead.last_error
    killed = [w for w in workers if w.popen.returncode == -signal.SIGKILL]
    assert len(killed) == SUICIDE_ATTEMPTS, "one worker killed per attempt"
    finished = archived_rows(db)
    assert {(finished[i].state, finished[i].attempt) for i in normal} == {("completed", 1)}
    assert effects_per_task(db) == dict.fromkeys(normal, 1), seen
    assert live_rows(db) == {}
    assert rescued(cleaner) == {
        "retried": SUICIDE_ATTEMPTS - 1,
        "dead": 1,
        "finished": 0,
        "skipped": 0,
        "cancelled": 0,
    }, seen


# -- periodic tasks -----------------------------------------------------------------------------

FIRES = 15


def fire_times(db: Engine) -> list[datetime]:
    """The fire time of every periodic task enqueued, live or finished, one entry per task."""
    found: list[datetime] = []
    with db.connect() as conn:
        for table in (tasks, archive):
            for (headers,) in conn.execute(select(table.c.headers)):
                found.append(datetime.fromisoformat(json.loads(headers)["txtasks-fire-time"]))
    return found


def test_two_cleaners_enqueue_each_fire_time_once(
    database_url: str, db: Engine, procs: Processes
) -> None:
    # Passes every 10 ms: the two cleaners' passes overlap often, so the fence on the stored
    # fire time decides many fires (without it, this test sees duplicates on every backend).
    periodic = ("--only", "periodic", "--set", "periodic.interval=0.01")
    cleaners = [procs.start("cleaner", PERIODIC_APP_SPEC, *periodic, url=database_url)]
    cleaners.append(procs.start("cleaner", PERIODIC_APP_SPEC, *periodic, url=database_url))
    worker = procs.start("worker", PERIODIC_APP_SPEC, "-c", "4", *POLL, url=database_url)
    wait_until(
        lambda: len(run_rows(db)) >= FIRES,
        f"{FIRES} periodic tasks to run",
        timeout=DONE_TIMEOUT,
        watch=[*cleaners, worker],
    )

    stop(*cleaners)
    # No cleaner enqueues any more: let the worker finish what they enqueued.
    wait_until(lambda: live_rows(db) == {}, "the last ticks to run", watch=[worker])
    stop(worker)

    logs = "\n".join(c.stderr for c in cleaners)
    times = fire_times(db)
    assert len(times) >= FIRES
    assert {t: n for t, n in Counter(times).items() if n > 1} == {}, "fire times enqueued twice"
    step = timedelta(seconds=PERIODIC_EVERY)
    assert {t for t in times if (t - EPOCH) % step} == set(), "fire times off the 0.2 s grid"
    times.sort()
    gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != step]
    assert gaps == [], f"missed fire times between {gaps}\n{logs}"
    finished = archived_rows(db)
    assert {(f.state, f.attempt) for f in finished.values()} == {("completed", 1)}
    assert effects_per_task(db) == dict.fromkeys(finished, 1)
    assert {json.loads(r.payload)["txtasks-periodic"] for r in run_rows(db)} == {PERIODIC_NAME}
    assert all("cleaner stopped" in c.stderr for c in cleaners), logs
    assert "ok=false" not in logs, "a periodic pass failed"
    assert "Traceback" not in logs


# -- operating the daemon -----------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_health_endpoint_and_graceful_stop(database_url: str, procs: Processes) -> None:
    options = ("--health-port", "0", "--health-host", "127.0.0.1")
    cleaner = procs.start("cleaner", APP_SPEC, *options, url=database_url)
    address = re.compile(r"health checks on http://([\d.]+):(\d+)/livez")
    found = wait_until(
        lambda: address.search(cleaner.stderr), "the health endpoint's address", watch=[cleaner]
    )
    assert found is not None
    base = f"http://{found[1]}:{found[2]}"

    def connected_livez() -> Any:
        status, live = http_get(f"{base}/livez")
        assert status == 200, live  # live from the first answer, while it connects too
        assert live["live"] is True
        return None if live.get("connecting") else live

    live = wait_until(connected_livez, "/livez once connected", watch=[cleaner])
    assert set(live["sweeps"]) == SWEEPS

    def ready_answer() -> Any:
        status, body = http_get(f"{base}/readyz")
        return body if status == 200 else None

    # Ready once every sweep has finished its first pass (they start at once).
    ready = wait_until(ready_answer, "/readyz to answer 200", watch=[cleaner])
    assert ready["live"] is True and ready["ready"] is True, ready
    assert {name: s["last_ok"] for name, s in ready["sweeps"].items()} == dict.fromkeys(
        SWEEPS, True
    )
    assert http_get(f"{base}/healthz")[0] == 200
    assert http_get(f"{base}/nowhere")[0] == 404

    cleaner.signal(signal.SIGTERM)

    assert cleaner.wait(timeout=EXIT_TIMEOUT) == 0, cleaner.stderr
    assert "SIGTERM received" in cleaner.stderr
    assert "cleaner stopped" in cleaner.stderr
    assert "Traceback" not in cleaner.stderr


def expire(db: Engine, task_id: int, *, attempt: int, lease_ago: float, worker: str) -> None:
    """Make a task look claimed by `worker`, its lease running out `lease_ago` seconds ago."""
    now = utcnow()
    with db.begin() as conn:
        conn.execute(
            update(tasks)
            .where(tasks.c.id == task_id)
            .values(
                state="processing",
                attempt=attempt,
                worker_id=worker,
                started_at=now - timedelta(seconds=60),
                lease_expires_at=now - timedelta(seconds=lease_ago),
            )
        )


def test_once_runs_each_sweep_once_and_rescues_expired_tasks(
    database_url: str, db: Engine, procs: Processes
) -> None:
    result = cli("cleaner", APP_SPEC, "--once", url=database_url)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) == SWEEPS
    # `python -m cleaner` is the same command.
    direct = subprocess.run(
        [sys.executable, "-m", "cleaner", APP_SPEC, "--once", "--only", "archiver"],
        cwd=REPO,
        env=cli_env(database_url),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=pace.seconds(60),
    )
    assert direct.returncode == 0, direct.stderr
    assert json.loads(direct.stdout) == {"archiver": {"archived": 0}}

    retry, last, alive = enqueue(db, "acc.record", [{"n": n} for n in range(3)])
    expire(db, retry, attempt=1, lease_ago=10, worker="gone-1")
    expire(db, last, attempt=5, lease_ago=10, worker="gone-2")  # its last attempt (default 5)
    expire(db, alive, attempt=1, lease_ago=-600, worker="busy")  # a lease still running

    result = cli("cleaner", APP_SPEC, "--once", "--only", "rescuer", url=database_url)

    assert result.returncode == 0, result.stderr
    rescue = {"retried": 1, "dead": 1, "finished": 0, "skipped": 0, "cancelled": 0}
    assert json.loads(result.stdout) == {"rescuer": rescue}
    live = live_rows(db)
    assert live == {retry: Live("retryable", 1, None), alive: Live("processing", 1, "busy")}
    assert set(archived_rows(db)) == {last}
    dead = archived_rows(db)[last]
    assert (dead.state, dead.attempt) == ("dead", 5)
    assert "lease expired" in (dead.last_error or "") and "gone-2" in (dead.last_error or "")
    with db.connect() as conn:
        error = conn.execute(select(tasks.c.last_error).where(tasks.c.id == retry)).scalar_one()
    assert "lease expired" in error and "gone-1" in error

    # The rescued task runs again, as its second attempt.
    worker = procs.start("worker", APP_SPEC, *POLL, url=database_url)
    wait_until(lambda: retry in archived_rows(db), "the rescued task to run", watch=[worker])
    stop(worker)
    assert archived_rows(db)[retry].state == "completed"
    assert [(r.task_id, r.attempt) for r in run_rows(db)] == [(retry, 2)]
    assert count_state(db, "processing") == 1  # the running lease was left alone


#: `--set` values that must be refused, and words the one-line error must contain.
BAD_SETTINGS = {
    "rescuer.nonsense=1": ("nonsense",),
    "rescuer.interval=-1": ("interval", "-1"),
    "rescuer.interval=soon": ("rescuer.interval", "soon"),
    "nosuchsweep.interval=1": ("nosuchsweep",),
    "retention.keep.completed=-5": ("completed",),
    "rescuer.grace=inf": ("grace", "inf"),
    "reannouncer.after=nan": ("after", "nan"),
    "retention.keep.dead=inf": ("dead", "inf"),
}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_bad_settings_are_one_line_errors(database_url: str) -> None:
    runs = cli_many(
        [(("cleaner", APP_SPEC, "--once", "--set", s), database_url) for s in BAD_SETTINGS]
    )
    for (setting, words), result in zip(BAD_SETTINGS.items(), runs, strict=True):
        output = f"--set {setting}: exit {result.returncode}\n{result.stdout}{result.stderr}"
        assert result.returncode != 0, output
        assert result.stdout == "", output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), output
        assert all(word in lines[0] for word in words), output


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_interval_too_long_to_schedule_is_a_one_line_error(database_url: str) -> None:
    result = cli(
        "cleaner",
        APP_SPEC,
        "--only",
        "rescuer",
        "--set",
        "rescuer.interval=inf",
        url=database_url,
        timeout=20,
    )
    output = f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert result.returncode != 0, output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    assert "interval" in lines[0], output
