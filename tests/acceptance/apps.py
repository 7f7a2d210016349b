"""The application the acceptance tests run in `txtasks worker` subprocesses, and their helpers.

`tests.acceptance.apps:app` is loaded by `python -m txtasks worker` with the repository root as
its working directory and on PYTHONPATH. Its database comes from TXTASKS_DATABASE_URL.

Every handler that succeeds records one row in `txtasks_acc_runs` (task id, attempt, worker pid)
in the same database, at the END of its attempt: a test counts the effects of each task from the
database. An attempt interrupted before that row is written took no effect.

The second half of the module is what the test files share: the subprocess environment, a
runner for one-shot commands, a registry of long-running worker processes that kills leftovers,
and waiting on observable state with a deadline.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    func,
    insert,
    select,
)

from tests import pace
from tests.waiting import NotWithin, until, until_sync
from txtasks import App
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import backend_name, url_sync
from txtasks.schema.tables import Id, archive, tasks
from txtasks.worker.context import TaskContext

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.acceptance.apps:app"
QUEUE = "acc"
POISON_ATTEMPTS = 2
#: How long a handler waits for a gate file or for its fellow workers before giving up.
HANDLER_PATIENCE = 60.0

# -- the application ------------------------------------------------------------------------

metadata = MetaData()
runs = Table(
    "txtasks_acc_runs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("task_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("task_name", String(255), nullable=False),
    Column("payload", Text, nullable=True),
)
workers_seen = Table(
    "txtasks_acc_workers",
    metadata,
    Column("pid", Integer, primary_key=True, autoincrement=False),
)

app = App("acceptance", default_queue=QUEUE)


@cache
def effects_engine() -> Engine:
    """The handlers' own connection to the test database (one engine per worker process)."""
    url = os.environ["TXTASKS_DATABASE_URL"]
    engine = create_engine(url_sync(url), pool_size=10, max_overflow=10)
    if backend_name(url) == "sqlite":
        sqlite_connection_setup(engine)
    return engine


def record(ctx: TaskContext, payload: Any) -> None:
    """The effect of a successful attempt: one row, committed on its own."""
    with effects_engine().begin() as conn:
        conn.execute(
            insert(runs).values(
                task_id=ctx.task_id,
                attempt=ctx.attempt,
                pid=os.getpid(),
                task_name=ctx.task.name,
                payload=json.dumps(payload),
            )
        )


_arrived = threading.Event()
_arrival_lock = threading.Lock()
_registered = False


def wait_for_workers(count: int) -> None:
    """Block until `count` worker processes have each started a task (a cross-process barrier).

    A worker whose slots are all blocked here cannot claim more, so the others must claim
    tasks too: with `count` = the number of workers, every worker does some of the work.
    """
    global _registered
    if _arrived.is_set():
        return
    with _arrival_lock:
        if not _registered:
            with effects_engine().begin() as conn:
                conn.execute(insert(workers_seen).values(pid=os.getpid()))
            _registered = True

    def arrived() -> bool:
        with effects_engine().connect() as conn:
            seen = conn.execute(select(func.count()).select_from(workers_seen)).scalar_one()
        return bool(seen >= count)

    until_sync(arrived, f"{count} workers to arrive", timeout=HANDLER_PATIENCE)
    _arrived.set()


@app.task(name="acc.record")
def record_task(payload: Any, ctx: TaskContext) -> None:
    """Records its run; with {"barrier": n} first waits until n workers run tasks; with
    {"at_exit": path} the process creates that file as it exits (an `atexit` hook)."""
    if isinstance(payload, dict) and payload.get("barrier"):
        wait_for_workers(int(payload["barrier"]))
    if isinstance(payload, dict) and payload.get("at_exit"):
        atexit.register(Path(payload["at_exit"]).touch)
    record(ctx, payload)


def mark_started(payload: dict[str, Any], ctx: TaskContext) -> None:
    """With payload["started"] (a directory), leave a file named after the task: its handler
    runs (a task claimed by a worker that is stopping may be handed back unstarted)."""
    if payload.get("started"):
        (Path(payload["started"]) / str(ctx.task_id)).touch()


@app.task(name="acc.gated")
async def gated(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Async: waits until the file payload["gate"] exists, then records its run."""
    await asyncio.to_thread(mark_started, payload, ctx)
    gate = Path(payload["gate"])
    opened = partial(asyncio.to_thread, gate.exists)
    await until(opened, f"gate {gate} to open", timeout=HANDLER_PATIENCE)
    await asyncio.to_thread(record, ctx, payload)


@app.task(name="acc.gated_sync")
def gated_sync(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Sync (runs in the worker's thread pool): waits for the gate file, then records."""
    mark_started(payload, ctx)
    gate = Path(payload["gate"])
    until_sync(gate.exists, f"gate {gate} to open", timeout=HANDLER_PATIENCE, interval=0.01)
    record(ctx, payload)


@app.task(name="acc.order_a", subscribe="acc.order", group="acc-a")
def order_a(payload: Any, ctx: TaskContext) -> None:
    """One group of the topic `acc.order`: records its run."""
    record(ctx, payload)


@app.task(name="acc.order_b", queue="other", subscribe=["acc.order"], group="acc-b")
def order_b(payload: Any, ctx: TaskContext) -> None:
    """Another group of `acc.order`, in another queue: records its run."""
    record(ctx, payload)


@app.task(name="acc.poison", max_attempts=POISON_ATTEMPTS, retry=0)
def poison(payload: Any) -> None:
    """Always fails: dead-lettered after POISON_ATTEMPTS attempts."""
    raise RuntimeError(f"poison task {payload!r} always fails")


# -- the test database ----------------------------------------------------------------------


def db_engine(url: str) -> Engine:
    """An engine for the test process itself (reads, enqueues, direct SQL)."""
    sqlite = backend_name(url) == "sqlite"
    return create_engine(url_sync(url), connect_args={"timeout": 30} if sqlite else {})


def create_app_tables(engine: Engine) -> None:
    """The app's own tables, fresh (the txtasks schema is reset by the `database_url` fixture)."""
    with engine.begin() as conn:
        metadata.drop_all(conn)
        metadata.create_all(conn)


def enqueue(engine: Engine, name: str, payloads: Iterable[Any], **options: Any) -> list[int]:
    """Enqueue in one transaction of the test's engine; the new ids in order."""
    with engine.begin() as conn:
        return app.enqueue_many_tx(conn, [app.new_task(name, p, **options) for p in payloads])


@dataclass(frozen=True)
class Live:
    state: str
    attempt: int
    worker_id: str | None


@dataclass(frozen=True)
class Finished:
    state: str
    attempt: int
    last_error: str | None


def live_rows(engine: Engine) -> dict[int, Live]:
    with engine.connect() as conn:
        rows = conn.execute(select(tasks.c.id, tasks.c.state, tasks.c.attempt, tasks.c.worker_id))
        return {r.id: Live(r.state, r.attempt, r.worker_id) for r in rows}


def archived_rows(engine: Engine) -> dict[int, Finished]:
    with engine.connect() as conn:
        query = select(archive.c.id, archive.c.state, archive.c.attempt, archive.c.last_error)
        return {r.id: Finished(r.state, r.attempt, r.last_error) for r in conn.execute(query)}


def effects_per_task(engine: Engine) -> Counter[int]:
    """How many effect rows each task left (one per successful attempt)."""
    return Counter(r.task_id for r in run_rows(engine))


def count_state(engine: Engine, state: str) -> int:
    with engine.connect() as conn:
        query = select(func.count()).select_from(tasks).where(tasks.c.state == state)
        return int(conn.execute(query).scalar_one())


def run_rows(engine: Engine) -> list[Any]:
    """Every recorded effect: (task_id, attempt, pid, task_name, payload)."""
    with engine.connect() as conn:
        query = select(runs.c.task_id, runs.c.attempt, runs.c.pid, runs.c.task_name, runs.c.payload)
        return list(conn.execute(query.order_by(runs.c.id)))


# -- subprocesses ---------------------------------------------------------------------------


def cli_env(url: str | None) -> dict[str, str]:
    """The environment of a `txtasks` subprocess: no inherited TXTASKS_* settings (but the
    test run's pace)."""
    env = pace.child_environ()
    env["COLUMNS"] = "200"  # rich tables: one line per row
    env["NO_COLOR"] = "1"
    if url is not None:
        env["TXTASKS_DATABASE_URL"] = url
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "txtasks", *args]


def _spawn(args: Sequence[str], url: str | None, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(*args),
        cwd=REPO,
        env=cli_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: children (demo workers) go with it
        **kwargs,
    )


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """Kill whatever is left of a process and of the children it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _finish(
    proc: subprocess.Popen[str], timeout: float, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(input, timeout=pace.seconds(timeout))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(map(str, proc.args))} did not finish in {pace.seconds(timeout):g}s; stderr:\n{err}"
        ) from None
    finally:
        _kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(
    *args: str, url: str | None, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one `txtasks` command to its end; a hang fails the test instead of blocking."""
    stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
    return _finish(_spawn(args, url, stdin=stdin), timeout, input)


def cli_many(
    commands: Sequence[tuple[Sequence[str], str | None]], *, timeout: float = 60
) -> list[subprocess.CompletedProcess[str]]:
    """Run independent commands, each `(args, database_url)`, at the same time; their results
    in order."""
    started = [_spawn(args, url, stdin=subprocess.DEVNULL) for args, url in commands]
    try:
        return [_finish(proc, timeout) for proc in started]
    finally:
        for proc in started:
            _kill_group(proc)
            proc.wait()


@dataclass
class Proc:
    """A long-running `txtasks` process, its output going to files (read them any time)."""

    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (with the process's stderr) if it does not exit."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"txtasks pid {self.pid} still running after {timeout}s; stderr:\n{self.stderr}"
            ) from None


class Processes:
    """Starts `txtasks` processes and kills whatever is still running at the end of a test."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Proc] = []

    def start(self, *args: str, url: str | None) -> Proc:
        n = len(self.started)
        out, err = self.directory / f"proc{n}.out", self.directory / f"proc{n}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(
                command(*args),
                cwd=REPO,
                env=cli_env(url),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # its own process group: children are killed with it
            )
        proc = Proc(popen, out, err)
        self.started.append(proc)
        return proc

    def close(self) -> None:
        """Kill every process group first, then reap them: a process slow to go cannot leave
        the ones after it running."""
        for proc in self.started:
            _kill_group(proc.popen)
        for proc in self.started:
            proc.popen.wait(timeout=pace.seconds(30))


T = TypeVar("T")


def http_get(url: str) -> tuple[int, Any]:
    """Status and JSON body of a GET (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=pace.seconds(10)) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def wait_until(
    probe: Callable[[], T],
    what: str,
    *,
    timeout: float = 30.0,
    watch: Sequence[Proc] = (),
) -> T:
    """Poll observable state until `probe()` is truthy; fail on the deadline or if a watched
    process exits meanwhile."""

    def watched() -> T:
        value = probe()
        for proc in () if value else watch:
            if proc.popen.poll() is not None:
                raise AssertionError(
                    f"pid {proc.pid} exited with {proc.popen.returncode} while waiting for "
                    f"{what}; stderr:\n{proc.stderr}"
                )
        return value

    return until_sync(watched, what, timeout=timeout)


# -- the cleaner's tests (tests/acceptance/test_cleaner.py) ---------------------------------

SUICIDE_ATTEMPTS = 2


@app.task(name="acc.suicide", max_attempts=SUICIDE_ATTEMPTS, retry=0)
def suicide(payload: Any, ctx: TaskContext) -> None:
    """Kills its own worker process (SIGKILL): only the cleaner can decide this task.

    It first waits until the worker has written the outcomes of the tasks it finished before
    (outcomes are flushed in batches): the tasks run alongside it then complete exactly once.
    """
    others = (
        select(func.count())
        .select_from(tasks)
        .where(
            tasks.c.worker_id == ctx.worker_id,
            tasks.c.state == "processing",
            tasks.c.id != ctx.task_id,
        )
    )

    def flushed() -> bool:
        with effects_engine().connect() as conn:
            return bool(conn.execute(others).scalar_one() == 0)

    with contextlib.suppress(NotWithin):  # dies all the same
        until_sync(flushed, "the other outcomes written", timeout=HANDLER_PATIENCE, interval=0.01)
    os.kill(os.getpid(), signal.SIGKILL)


#: A second application for the periodic tests: its schedule fires only where it is loaded, so
#: the cleaners of the other tests (which load `app`) never enqueue ticks.
PERIODIC_APP_SPEC = "tests.acceptance.apps:periodic_app"
PERIODIC_QUEUE = "acc-periodic"
PERIODIC_EVERY = 0.2
PERIODIC_NAME = "acc.every-200ms"

periodic_app = App("acceptance-periodic", default_queue=PERIODIC_QUEUE)


@periodic_app.task(name="acc.tick")
def tick(payload: Any, ctx: TaskContext) -> None:
    """Records its run (the payload recorded is the task's headers, with its fire time)."""
    record(ctx, ctx.headers)


# catch_up="all": a fire time a loaded machine's cleaners reach late is still enqueued, so the
# fire times a test sees have no gaps.
periodic_app.periodic(tick, every=PERIODIC_EVERY, name=PERIODIC_NAME, catch_up="all")
