"""The chaos suite's harness: real servers, a fresh schema, `txtasks worker`/`cleaner` and the
enqueuing application as subprocesses (as users run them), and the invariants, read from the
database at the end.

    chaos = Chaos(url, tmp_path)               # drops and migrates (`txtasks migrate`)
    workers = [chaos.worker(db_url=proxied) for _ in range(3)]
    chaos.cleaner(db_url=proxied)
    chaos.enqueuer(count=1500)
    ... inject faults ...
    chaos.settle(timeout=30)                   # every committed order's task finished
    report = chaos.report()
    chaos.stop_all()                           # SIGTERM: each must exit within its bound
    chaos.check(report, max_reruns=0)          # every invariant, with the numbers

The invariants (`Report.problems`): 0 committed lost, 0 uncommitted (rolled-back or failed)
run, 0 completed twice beyond the re-runs crashes allow (runs of a task <= 1 + the tasks in
flight at kill -9s), 0 dead-lettered (no task of the suite is designed to fail), every process
alive until told to stop and gone within its grace period plus a bound after SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from sqlalchemy import MetaData, func, select

from tests import pace
from tests.chaos.app import (
    EFFECTS_URL_VAR,
    TASK,
    engine_for,
    failures,
    metadata,
    orders,
    rollbacks,
    runs,
)
from tests.waiting import NotWithin, until_sync
from txtasks.schema.tables import archive, tasks
from txtasks.schema.tables import metadata as txtasks_metadata
from txtasks.worker.outcomes import DRAIN_SECONDS

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.chaos.app:app"

#: Bounds on every database operation of the processes under test (TXTASKS_DB_* environment
#: variables): shorter than the defaults, so that a stall is noticed within a scenario's time.
DB_CONNECT_TIMEOUT = 3.0
DB_COMMAND_TIMEOUT = 5.0
DB_KEEPALIVE_IDLE = 3.0
DB_TIMEOUT_ENV = {
    "TXTASKS_DB_CONNECT_TIMEOUT": str(DB_CONNECT_TIMEOUT),
    "TXTASKS_DB_COMMAND_TIMEOUT": str(DB_COMMAND_TIMEOUT),
    "TXTASKS_DB_KEEPALIVE_IDLE": str(DB_KEEPALIVE_IDLE),
}
#: Seconds a process may take to exit after SIGTERM beyond its grace period: the retries of
#: its last outcome writes, the last of them bounded by the command timeout, and the time to
#: stop Python.
STOP_BOUND = DRAIN_SECONDS + DB_COMMAND_TIMEOUT + 5.0
#: The worker's --shutdown-grace in the suite.
GRACE = 3.0
#: Seconds an enqueuer asked to stop may take to end its transactions (a note of a rollback
#: retries up to the app's NOTE_PATIENCE while the database is away).
ENQUEUER_STOP = 30.0
#: What the workers and the cleaner log when a lease ran out or a task was rescued.
LEASE_WORDS = ("lease", "rescued", "fenced", "sweep=rescuer ok=true")

T = TypeVar("T")


@dataclass
class Proc:
    """A subprocess of the scenario, its output in files."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    #: Killed on purpose (kill -9): its end is no problem.
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.stderr.splitlines()[-lines:])

    def kill_group(self) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(30)


@dataclass
class Report:
    """The invariants' numbers, read from the database."""

    committed: int = 0
    rolled_back: int = 0
    #: Application transactions that failed without being asked to, and the first errors.
    failed: int = 0
    failure_samples: list[str] = field(default_factory=list)
    completed: int = 0
    #: Committed orders whose task is still live (pending, processing, retryable).
    live: int = 0
    #: Committed orders whose task is neither live nor completed (gone, or finished otherwise).
    lost: int = 0
    #: (task id, attempt, reason) of dead-lettered tasks.
    dead: list[tuple[int, int, str]] = field(default_factory=list)
    #: Runs of tasks whose transaction did not commit (rolled back on purpose or failed).
    uncommitted_runs: int = 0
    #: Orders whose task took effect more than once, and the extra runs in all.
    completed_twice: int = 0
    reruns: int = 0
    #: Task ids in the archive and in the live table at once.
    in_both: int = 0

    def problems(self, *, max_reruns: int = 0, allow_failures: bool = False) -> list[str]:
        found = []
        if self.lost or self.live:
            found.append(f"{self.lost} committed task(s) lost, {self.live} never finished")
        if self.uncommitted_runs:
            found.append(f"{self.uncommitted_runs} run(s) of tasks whose transaction rolled back")
        if self.reruns > max_reruns:
            found.append(
                f"{self.completed_twice} task(s) completed twice ({self.reruns} re-runs; "
                f"crashes allow {max_reruns})"
            )
        if self.in_both:
            found.append(f"{self.in_both} task(s) both archived and live")
        if self.dead:
            first = self.dead[0]
            found.append(
                f"{len(self.dead)} task(s) dead-lettered by a fault, e.g. task {first[0]} at "
                f"attempt {first[1]}: {first[2][:300]}"
            )
        if self.failed and not allow_failures:
            found.append(
                f"{self.failed} application transaction(s) failed, e.g. {self.failure_samples}"
            )
        return found

    def summary(self) -> str:
        return (
            f"committed {self.committed}, rolled back {self.rolled_back}, app failures "
            f"{self.failed}, completed {self.completed}, live {self.live}, lost {self.lost}, "
            f"dead {len(self.dead)}, uncommitted runs {self.uncommitted_runs}, completed twice "
            f"{self.completed_twice} ({self.reruns} re-runs)"
        )


class Chaos:
    """One scenario: the database at `url` (the real server's address), its processes."""

    def __init__(self, url: str, directory: Path, *, broker_url: str | None = None) -> None:
        self.url = url
        self.directory = directory
        self.broker_url = broker_url
        self.procs: list[Proc] = []
        #: Problems seen along the way (a process that died, one that would not stop).
        self.notes: list[str] = []
        #: Tasks in flight in the workers killed with SIGKILL: the re-runs crashes allow.
        self.in_flight_at_kills = 0
        self.engine = engine_for(url, pool_pre_ping=True)  # it outlives server restarts
        self.fresh_schema()

    # -- setup ---------------------------------------------------------------------------------

    def fresh_schema(self) -> None:
        """Drop the suite's and txtasks' tables, `txtasks migrate`, create the suite's."""
        with self.engine.begin() as conn:
            metadata.drop_all(conn)
            txtasks_metadata.drop_all(conn)
            leftovers = MetaData()
            leftovers.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
            leftovers.drop_all(conn)
        result = self.run("migrate", db_url=self.url)
        assert result.returncode == 0, f"txtasks migrate failed:\n{result.stderr}"
        with self.engine.begin() as conn:
            metadata.create_all(conn)

    def env(self, db_url: str, broker_url: str | None) -> dict[str, str]:
        env = pace.child_environ()
        env.update(DB_TIMEOUT_ENV)
        env["TXTASKS_DATABASE_URL"] = db_url
        env[EFFECTS_URL_VAR] = self.url
        if broker_url:
            env["TXTASKS_BROKER_URL"] = broker_url
        return env

    def run(self, *args: str, db_url: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One `txtasks` command to its end (within `timeout` at the run's pace)."""
        return subprocess.run(
            [sys.executable, "-m", "txtasks", *args],
            cwd=REPO,
            env=self.env(db_url, None),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=pace.seconds(timeout),
            check=False,
        )

    def start(self, name: str, argv: Sequence[str], db_url: str, broker_url: str | None) -> Proc:
        n = len(self.procs)
        out, err = self.directory / f"{n}-{name}.out", self.directory / f"{n}-{name}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(
                [sys.executable, "-m", *argv],
                cwd=REPO,
                env=self.env(db_url, broker_url),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        proc = Proc(name, popen, out, err)
        self.procs.append(proc)
        return proc

    def worker(
        self,
        db_url: str | None = None,
        *,
        concurrency: int = 8,
        lease: float = 10.0,
        poll: float = 0.2,
        broker_url: str | None = None,
        extra: Sequence[str] = (),
    ) -> Proc:
        """A worker whose lease is `lease` seconds at the run's pace: a live worker starved of
        the CPU (or kept from the database by the faults) past its lease loses its tasks to
        the rescuer, and their re-runs would count against the scenario."""
        args = ["txtasks", "worker", APP_SPEC, "--concurrency", str(concurrency)]
        args += ["--lease", str(pace.seconds(lease)), "--poll-interval", str(poll)]
        args += ["--shutdown-grace", str(GRACE), *extra]
        return self.start("worker", args, db_url or self.url, broker_url)

    def cleaner(
        self, db_url: str | None = None, *, rescue_every: float = 0.5, broker_url: str | None = None
    ) -> Proc:
        args = ["txtasks", "cleaner", APP_SPEC, "--set", f"rescuer.interval={rescue_every}"]
        return self.start("cleaner", args, db_url or self.url, broker_url)

    def enqueuer(
        self,
        count: int,
        *,
        start: int = 0,
        threads: int = 1,
        pause: float = 0.0,
        rollback: float = 0.1,
        max_ms: int = 20,
        keys: int = 0,
        db_url: str | None = None,
        broker_url: str | None = None,
    ) -> Proc:
        """The application: places orders start .. start+count-1 (their tasks over `keys`
        keys, when given), then exits."""
        args = ["tests.chaos.app", "enqueue", "--start", str(start), "--count", str(count)]
        args += ["--threads", str(threads), "--pause", str(pause), "--rollback", str(rollback)]
        args += ["--max-ms", str(max_ms), "--keys", str(keys)]
        return self.start("enqueuer", args, db_url or self.url, broker_url)

    # -- faults and observation ----------------------------------------------------------------

    def kill9(self, proc: Proc) -> int:
        """SIGKILL a worker; the tasks it had in flight (they may run again)."""
        proc.kill_group()
        with self.engine.connect() as conn:
            query = (
                select(func.count())
                .select_from(tasks)
                .where(tasks.c.state == "processing", tasks.c.worker_id.like(f"%:{proc.pid}:%"))
            )
            in_flight = int(conn.execute(query).scalar_one())
        self.in_flight_at_kills += in_flight
        return in_flight

    def wait_until(
        self, probe: Callable[[], T], timeout: float, *, watch: Sequence[Proc] = ()
    ) -> T | None:
        """Poll `probe()` until truthy (its value) or the deadline (None); a watched process
        that exits meanwhile is noted as a problem."""

        def watched() -> T:
            value = probe()
            for proc in () if value else watch:
                if not proc.alive:
                    self.note_exit(proc)
            return value

        try:
            return until_sync(watched, "a chaos probe", timeout=timeout, interval=0.1)
        except NotWithin:
            return None

    def expect(self, condition: object, problem: str) -> None:
        """Note `problem` unless `condition` holds (checked with the invariants at the end)."""
        if not condition:
            self.notes.append(problem)

    def note_exit(self, proc: Proc) -> None:
        note = f"{proc.name} pid {proc.pid} exited ({proc.popen.returncode}):\n{proc.tail()}"
        if note not in self.notes:
            self.notes.append(note)

    def finished_count(self) -> int:
        """Runs recorded so far (a cheap measure of progress)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())

    def progress(self, runs: int) -> Callable[[], bool]:
        """A probe: true once `runs` more runs are recorded than now."""
        target = self.finished_count() + runs
        return lambda: self.finished_count() >= target

    def settled(self) -> bool:
        """No task of the suite is live and every committed order has one finished."""
        with self.engine.connect() as conn:
            live = conn.execute(
                select(func.count()).select_from(tasks).where(tasks.c.task_name == TASK)
            ).scalar_one()
            if live:
                return False
            placed = conn.execute(
                select(func.count()).select_from(orders).where(orders.c.task_id.is_not(None))
            ).scalar_one()
            finished = conn.execute(
                select(func.count())
                .select_from(orders)
                .join(archive, archive.c.id == orders.c.task_id)
            ).scalar_one()
        return bool(placed == finished)

    def settle(self, timeout: float, *, enqueuers: Sequence[Proc] = ()) -> bool:
        """Wait until the enqueuers are done and every task finished; False on the deadline.

        The enqueuers get the first two thirds of `timeout` (at the run's pace): one still
        placing orders then is asked to stop (SIGTERM: it ends the transactions under way and
        exits), since on a slow machine the scenario can be over before all its orders are
        placed. The invariants hold over whatever committed; an enqueuer that does not end
        within `ENQUEUER_STOP` of being asked is noted as a problem."""
        start = time.monotonic()
        deadline = start + pace.seconds(timeout)
        stop_at = start + pace.seconds(timeout) * 2 / 3
        for proc in enqueuers:
            try:
                proc.popen.wait(max(0.1, stop_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.send_signal(signal.SIGTERM)
                try:
                    proc.popen.wait(pace.seconds(ENQUEUER_STOP))
                except subprocess.TimeoutExpired:
                    self.notes.append(
                        f"the enqueuer did not stop within {pace.seconds(ENQUEUER_STOP):g}s "
                        f"of SIGTERM:\n{proc.tail()}"
                    )
                    return False
            if proc.popen.returncode != 0:
                self.note_exit(proc)
        workers = [p for p in self.procs if p.name in ("worker", "cleaner") and p.alive]
        left = max(0.1, deadline - time.monotonic()) / pace.pace()  # wait_until stretches it back
        done = self.wait_until(self.settled, left, watch=workers)
        return bool(done)

    def stop_all(self) -> dict[str, float]:
        """SIGTERM every process still running; note any not gone within GRACE + STOP_BOUND.
        The seconds each took, by name and pid. A worker or cleaner that ended by itself
        before is noted."""
        for proc in self.procs:
            if proc.name != "enqueuer" and not proc.killed and not proc.alive:
                self.note_exit(proc)
        alive = [p for p in self.procs if p.alive]
        for proc in alive:
            proc.popen.send_signal(signal.SIGTERM)
        t = time.monotonic()
        bound = pace.seconds(GRACE + STOP_BOUND)
        took: dict[str, float] = {}
        for proc in alive:
            try:
                proc.popen.wait(max(0.1, t + bound - time.monotonic()))
                took[f"{proc.name} {proc.pid}"] = round(time.monotonic() - t, 2)
            except subprocess.TimeoutExpired:
                self.notes.append(
                    f"{proc.name} pid {proc.pid} still running {bound:.0f}s after "
                    f"SIGTERM:\n{proc.tail()}"
                )
                proc.kill_group()
        return took

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive:
                proc.kill_group()
        self.engine.dispose()

    # -- the invariants ------------------------------------------------------------------------

    def report(self) -> Report:
        with self.engine.connect() as conn:
            placed = {r.n: r.task_id for r in conn.execute(select(orders.c.n, orders.c.task_id))}
            rolled = {r.n for r in conn.execute(select(rollbacks.c.n))}
            errors = [r.error for r in conn.execute(select(failures.c.error))]
            ran = Counter(r.n for r in conn.execute(select(runs.c.n)))
            finished = {
                r.id: r
                for r in conn.execute(
                    select(archive.c.id, archive.c.state, archive.c.attempt, archive.c.last_error)
                )
            }
            live = {r.id for r in conn.execute(select(tasks.c.id).where(tasks.c.task_name == TASK))}
        committed = {n: task_id for n, task_id in placed.items() if task_id is not None}
        report = Report(
            committed=len(committed),
            rolled_back=len(rolled),
            failed=len(errors),
            failure_samples=sorted(set(errors))[:3],
        )
        for task_id in committed.values():
            row = finished.get(task_id)
            if row is not None and row.state == "completed":
                report.completed += 1
            elif task_id in live:
                report.live += 1
            else:
                report.lost += 1
        report.dead = [
            (r.id, r.attempt, r.last_error or "") for r in finished.values() if r.state == "dead"
        ]
        report.uncommitted_runs = sum(count for n, count in ran.items() if n not in committed)
        twice = {n: count - 1 for n, count in ran.items() if n in committed and count > 1}
        report.completed_twice = len(twice)
        report.reruns = sum(twice.values())
        report.in_both = len(live & finished.keys())
        return report

    def archived_starts(self, queue: str) -> list[datetime]:
        """When each archived task of `queue` started (its last attempt's claim), in order."""
        with self.engine.connect() as conn:
            query = select(archive.c.started_at).where(
                archive.c.queue == queue, archive.c.started_at.is_not(None)
            )
            return sorted(conn.execute(query).scalars())

    def most_at_once_per_key(self) -> dict[str, int]:
        """For each key, the most of its tasks' handlers that ran at the same time (from the
        start and end each handler recorded)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(runs.c.key, runs.c.started, runs.c.ended).where(runs.c.key.is_not(None))
            ).all()
        events: dict[str, list[tuple[float, int]]] = {}
        for key, started, ended in rows:
            events.setdefault(key, []).extend([(started, 1), (ended, -1)])
        most = {}
        for key, points in events.items():
            at_once = peak = 0
            for _when, step in sorted(points, key=lambda p: (p[0], p[1])):  # ends first
                at_once += step
                peak = max(peak, at_once)
            most[key] = peak
        return most

    def said(self, words: tuple[str, ...], most: int = 20) -> str:
        """The log lines of the workers and the cleaner holding any of `words`, first `most`."""
        found = [
            f"{proc.name} {proc.pid}: {line}"
            for proc in self.procs
            if proc.name in ("worker", "cleaner")
            for line in proc.stderr.splitlines()
            if any(word in line for word in words)
        ]
        more = f"\n... and {len(found) - most} more" if len(found) > most else ""
        return f"log lines about {', '.join(words)}:\n" + "\n".join(found[:most]) + more

    def check(self, report: Report, *, max_reruns: int = 0, allow_failures: bool = False) -> None:
        """Fail with every broken invariant and the notes, or pass."""
        problems = report.problems(max_reruns=max_reruns, allow_failures=allow_failures)
        if report.reruns > max_reruns:  # why: what the workers and the cleaner said of leases
            problems.append(self.said(LEASE_WORDS))
        problems += self.notes
        if problems:  # how far each application got (asked to stop on a slow machine?)
            problems += [
                f"{p.name} pid {p.pid}: {p.stdout.strip()}"
                for p in self.procs
                if p.name == "enqueuer"
            ]
        assert not problems, "\n".join([report.summary(), *problems])


def metric(port: int, name: str) -> float:
    """One sample of a process's /metrics (0.0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def metrics_port(proc: Proc, timeout: float = 20) -> int:
    """The port a process started with --metrics-port 0 serves on (from its log)."""
    never = f"{proc.name} pid {proc.pid} never said its metrics port"

    def said() -> re.Match[str] | None:
        found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", proc.stderr)
        if not found and not proc.alive:
            raise AssertionError(f"{never} (it exited):\n{proc.tail()}")
        return found

    try:
        found = until_sync(said, "its metrics port in its log", timeout=timeout, interval=0.1)
    except NotWithin:
        raise AssertionError(f"{never}:\n{proc.tail()}") from None
    return int(found.group(1))
