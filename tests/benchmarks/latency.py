"""Commit→handler-start latency of txtasks, with PGQueuer's LISTEN/NOTIFY as the reference.

One task at a time to an idle worker running in its own process: the benchmark commits a
transaction that enqueued one task, reads `time.monotonic()` as the commit returns, and waits
for the worker's handler to report the `time.monotonic()` it read as it started (one UDP
datagram; CLOCK_MONOTONIC is machine-wide on Linux). Latency = handler start - commit return.

    python -m tests.benchmarks.latency --help
    python -m tests.benchmarks.latency --start-servers            # private servers, all backends
    TXTASKS_BENCH_POSTGRES_URL=postgresql://... TXTASKS_BENCH_AMQP_URL=amqp://... \\
        python -m tests.benchmarks.latency --sqlite --output latency.md
    python -m tests.benchmarks.latency --start-servers --profile  # where the time goes

See tests/benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from tests.benchmarks import latency_apps
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import backend_name, url_async, url_sync
from txtasks.schema.migrate import migrate
from txtasks.schema.tables import metadata as txtasks_metadata
from txtasks.wakeup import NullNotifier, notifier_for_url
from txtasks.wakeup.amqp import amqp_queue_name

REPO = Path(__file__).resolve().parents[2]
LOCK_NAME = "txtasks_latency_bench"
BACKENDS = ("postgresql", "mysql", "sqlite")
BACKEND_LABELS = {"postgresql": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}
MODES = ("rabbitmq", "polling")
#: Seconds to wait for the first task of a worker (process start, imports, connections).
FIRST_TIMEOUT = 60.0
#: This many timeouts in a row end a case: the worker is not getting the tasks.
MAX_TIMEOUTS_IN_A_ROW = 3
#: The targets (see `verdict`).
BARE_MARGIN_MS = 0.2
NOTIFY_P50_RATIO = 0.8


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def masked(value: str) -> str:
    """URLs with their passwords hidden (`scheme://user:***@host`)."""
    return re.sub(r"(://[^:/@\s]+:)[^@\s]+@", r"\1***@", value)


# -- statistics -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Summary:
    n: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> Summary:
        return cls(
            len(values_ms),
            percentile(values_ms, 50),
            percentile(values_ms, 90),
            percentile(values_ms, 99),
            max(values_ms) if values_ms else math.nan,
        )


# -- reports from the workers ---------------------------------------------------------------------


@dataclass
class Report:
    task_id: int
    started: float
    extra: dict[str, Any] | None


class Reports(asyncio.DatagramProtocol):
    """Receives `run task_id start [json]` datagrams and resolves the matching waiter."""

    def __init__(self) -> None:
        self.run = ""
        self.waiting: dict[int, asyncio.Future[Report]] = {}
        self.port = 0

    def new_run(self) -> str:
        self.run = uuid.uuid4().hex[:12]
        self.waiting.clear()
        return self.run

    def expect(self, task_id: int) -> asyncio.Future[Report]:
        future: asyncio.Future[Report] = asyncio.get_running_loop().create_future()
        self.waiting[task_id] = future
        return future

    def forget(self, task_id: int) -> None:
        self.waiting.pop(task_id, None)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        parts = data.decode(errors="replace").split(" ", 3)
        if len(parts) < 3 or parts[0] != self.run:
            return
        try:
            task_id, started = int(parts[1]), float(parts[2])
            extra = json.loads(parts[3]) if len(parts) > 3 else None
        except ValueError:
            return
        future = self.waiting.get(task_id)
        if future is not None and not future.done():
            future.set_result(Report(task_id, started, extra))


async def open_reports() -> tuple[Reports, asyncio.DatagramTransport]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Reports, local_addr=("127.0.0.1", 0))
    protocol.port = transport.get_extra_info("sockname")[1]
    return protocol, transport


# -- worker processes -----------------------------------------------------------------------------

STARTED_PIDS: set[int] = set()


class WorkerProcess:
    """A worker in its own process (own session, so a terminal's Ctrl-C reaches only us)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.exited: asyncio.Task[int] | None = None

    @property
    def command(self) -> str:
        return masked(shlex.join(["python", *self.argv[1:]]))

    async def start(self) -> None:
        with self.log_path.open("wb") as out:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        STARTED_PIDS.add(self.process.pid)
        self.exited = asyncio.ensure_future(self.process.wait())

    def log_tail(self, lines: int = 30) -> str:
        try:
            content = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(content[-lines:])

    async def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful stop), SIGKILL after `timeout`; the exit code."""
        if self.process is None or self.exited is None:
            return None
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            done, _ = await asyncio.wait({self.exited}, timeout=timeout)
            if not done:
                log(f"  {self.name} ignored SIGTERM for {timeout:.0f}s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.exited
        STARTED_PIDS.discard(self.process.pid)
        code = self.process.returncode
        if code not in (0, None):
            log(f"  {self.name} exited with {code}; its log ({self.log_path}):\n{self.log_tail()}")
        return code


class ProcessGroup:
    """Several processes watched as one: `exited` is done when any of them exits."""

    def __init__(self, processes: Sequence[WorkerProcess]) -> None:
        self.processes = list(processes)
        self.exited: asyncio.Future[Any] | None = None

    async def start(self) -> None:
        for process in self.processes:
            await process.start()
        watched = [p.exited for p in self.processes if p.exited is not None]
        self.exited = asyncio.ensure_future(
            asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        )

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(f"[{p.name}]\n{p.log_tail(lines)}" for p in self.processes)

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processes))
        if self.exited is not None:
            self.exited.cancel()


def worker_env(reports: Reports, run: str, *, profile: bool = False) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TXTASKS_DATABASE_URL", "TXTASKS_BROKER_URL", "TXTASKS_CONCURRENCY")
        and not k.startswith("PGQUEUER_")
    }
    env[latency_apps.ENV_REPORT] = f"127.0.0.1:{reports.port}"
    env[latency_apps.ENV_RUN] = run
    env[latency_apps.ENV_PROFILE] = "1" if profile else "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# -- one measured series --------------------------------------------------------------------------

#: Enqueue one task and commit: (task id, its report's future, time before commit, commit return).
Enqueue = Callable[[], Awaitable[tuple[int, "asyncio.Future[Report]", float, float]]]


@dataclass
class Sample:
    task_id: int
    before_commit: float
    committed: float
    report: Report

    @property
    def latency_ms(self) -> float:
        return (self.report.started - self.committed) * 1000


@dataclass
class Series:
    samples: list[Sample] = field(default_factory=list)
    timeouts: int = 0

    @property
    def latencies_ms(self) -> list[float]:
        return [s.latency_ms for s in self.samples]


class CaseError(RuntimeError):
    pass


async def measure(
    label: str,
    enqueue: Enqueue,
    reports: Reports,
    worker: WorkerProcess | ProcessGroup,
    *,
    n: int,
    warmup: int,
    pause: Callable[[], float],
    timeout: float,
) -> Series:
    """Warm up, then `n` tasks one at a time, each after a pause that leaves the worker idle."""
    assert worker.exited is not None
    series = Series()
    in_a_row = 0
    total = warmup + n
    for i in range(total):
        await asyncio.sleep(pause())
        task_id, future, before_commit, committed = await enqueue()
        limit = FIRST_TIMEOUT if i == 0 else timeout
        try:
            done, _ = await asyncio.wait(
                {future, worker.exited}, timeout=limit, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            reports.forget(task_id)
        if future in done:
            in_a_row = 0
            if i >= warmup:
                series.samples.append(Sample(task_id, before_commit, committed, future.result()))
        elif worker.exited in done:
            raise CaseError(f"{label}: the worker exited:\n{worker.log_tail()}")
        else:
            future.cancel()
            in_a_row += 1
            if i >= warmup:
                series.timeouts += 1
            if in_a_row >= MAX_TIMEOUTS_IN_A_ROW:
                raise CaseError(
                    f"{label}: {in_a_row} tasks in a row not started within {limit:.1f}s; "
                    f"worker log:\n{worker.log_tail()}"
                )
        done_count = i + 1 - warmup
        if done_count > 0 and done_count % 100 == 0 and done_count < n:
            log(f"    {done_count}/{n}")
    return series


# -- databases ------------------------------------------------------------------------------------


def tables_reset(url: str) -> None:
    """Drop the txtasks tables of this (benchmark-only) database and apply the migrations."""
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            txtasks_metadata.drop_all(conn)
            leftovers = MetaData()
            leftovers.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
            leftovers.drop_all(conn)
        with engine.begin() as conn:
            migrate(conn)
    finally:
        engine.dispose()


def tables_drop(url: str) -> None:
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            txtasks_metadata.drop_all(conn)
    finally:
        engine.dispose()


class DatabaseLock:
    """A session lock per server database, so two benchmark runs never share one."""

    def __init__(self) -> None:
        self.engines: list[Any] = []
        self.connections: list[Any] = []

    def acquire(self, url: str) -> None:
        backend = backend_name(url)
        if backend == "sqlite":
            return
        engine = create_engine(url_sync(url))
        conn = engine.connect()
        if backend == "postgresql":
            got = conn.execute(text("SELECT pg_try_advisory_lock(hashtext(:n))"), {"n": LOCK_NAME})
        else:
            got = conn.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": LOCK_NAME})
        if not got.scalar():
            conn.close()
            engine.dispose()
            raise SystemExit(f"another latency benchmark is running on {masked(url)}")
        conn.commit()
        self.engines.append(engine)
        self.connections.append(conn)

    def release(self) -> None:
        for conn in self.connections:
            with contextlib.suppress(Exception):
                conn.close()  # ends the session, and with it the lock
        for engine in self.engines:
            engine.dispose()


def server_info(url: str) -> dict[str, str]:
    backend = backend_name(url)
    if backend == "sqlite":
        return {"SQLite": sqlite3.sqlite_version}
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            if backend == "postgresql":
                row = conn.execute(
                    text(
                        "SELECT current_setting('server_version'), current_setting('fsync'), "
                        "current_setting('synchronous_commit')"
                    )
                ).one()
                return {"PostgreSQL": f"{row[0]} (fsync={row[1]}, synchronous_commit={row[2]})"}
            row = conn.execute(
                text("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin")
            ).one()
            return {
                "MariaDB": f"{row[0]} (innodb_flush_log_at_trx_commit={row[1]}, log_bin={row[2]})"
            }
    finally:
        engine.dispose()


async def rabbitmq_version(url: str) -> str:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        properties = connection.transport.connection.server_properties
        return str(properties.get("version", "?"))
    finally:
        await connection.close()


async def wakeup_queue_delete(url: str) -> None:
    """Delete this benchmark's wake-up queue (its hints are stale once the worker is gone)."""
    import aio_pika

    with contextlib.suppress(Exception):
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            await channel.queue_delete(amqp_queue_name(latency_apps.QUEUE))
        finally:
            await connection.close()


# -- the cases ------------------------------------------------------------------------------------


@dataclass
class Case:
    system: str  # "txtasks", "bare" (the floor) or "pgqueuer"
    backend: str
    mode: str  # "rabbitmq", "polling", "notify"
    #: Tasks per second of a steady load beside the measured tasks (0: none).
    load: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        mode = f"{self.mode}+load" if self.load else self.mode
        return (self.system, self.backend, mode)


@dataclass
class Settings:
    urls: dict[str, str]
    amqp_url: str | None
    n: int
    warmup: int
    runs: int
    gap: float
    poll_interval: float
    wakeup_poll_interval: float
    concurrency: int | None
    handler: str
    timeout: float
    worker_log_level: str
    #: "asyncio" or "uvloop": the txtasks worker's and the bare design's.
    worker_loop: str
    log_dir: Path
    load_rate: float = 0.0
    load_workers: int = 2
    load_concurrency: int = 500


class Bench:
    def __init__(self, settings: Settings, reports: Reports) -> None:
        self.settings = settings
        self.reports = reports
        self.commands: dict[str, str] = {}

    def label(self, case: Case) -> str:
        s = self.settings
        if case.system == "pgqueuer":
            return "PGQueuer LISTEN/NOTIFY (reference)"
        if case.system == "bare":
            return "bare design: INSERT, publish after commit, claim by id (floor)"
        if case.mode == "rabbitmq" and case.load:
            return (
                f"txtasks + RabbitMQ, under a load of {case.load:,.0f} tasks/s "
                f"({s.load_workers} x concurrency {s.load_concurrency})"
            )
        if case.mode == "rabbitmq":
            return f"txtasks + RabbitMQ wake-up (poll {s.wakeup_poll_interval:g} s)"
        return f"txtasks polling only (poll {s.poll_interval:g} s)"

    def pause(self, case: Case) -> Callable[[], float]:
        """Time before each enqueue: the worker is idle again, and commits fall at a random phase.

        Polling: an extra uniform(0, poll interval), so the commit→poll wait is ~U(0, interval)
        instead of locked to the worker's cycle.
        """
        gap = self.settings.gap
        if case.mode == "polling":
            interval = self.settings.poll_interval
            return lambda: gap + random.uniform(0, interval)
        return lambda: gap * random.uniform(1, 2)

    def timeout(self, case: Case) -> float:
        if case.mode == "polling":
            return self.settings.poll_interval * 1.2 + self.settings.timeout
        return self.settings.timeout

    async def run_case(self, case: Case, *, profile: bool = False) -> Series:
        if case.system == "pgqueuer":
            return await self.run_pgqueuer(case)
        if case.system == "bare":
            return await self.run_bare(case)
        return await self.run_txtasks(case, profile=profile)

    async def run_txtasks(self, case: Case, *, profile: bool = False) -> Series:
        s = self.settings
        url = s.urls[case.backend]
        app = latency_apps.app
        task = app.get_task(
            latency_apps.ASYNC_TASK if s.handler == "async" else latency_apps.SYNC_TASK
        )
        await asyncio.to_thread(tables_reset, url)
        rabbitmq = case.mode == "rabbitmq"
        if rabbitmq:
            assert s.amqp_url is not None
            await wakeup_queue_delete(s.amqp_url)
        notifier = notifier_for_url(s.amqp_url) if rabbitmq else NullNotifier()
        app.use_notifier(notifier)
        engine = create_async_engine(url_async(url))
        if case.backend == "sqlite":
            sqlite_connection_setup(engine.sync_engine)
        run = self.reports.new_run()
        argv = [
            sys.executable,
            "-m",
            "txtasks",
            "worker",
            "tests.benchmarks.latency_apps:app",
            "--database-url",
            url,
        ]
        if rabbitmq:
            argv += ["--broker-url", str(s.amqp_url)]
        interval = s.wakeup_poll_interval if rabbitmq else s.poll_interval
        concurrency = s.load_concurrency if case.load else s.concurrency
        if concurrency is not None:  # else the worker's default
            argv += ["--concurrency", str(concurrency)]
        argv += [
            "--poll-interval",
            f"{interval:g}",
            "--log-level",
            s.worker_log_level,
            "--loop",
            s.worker_loop,
        ]
        env = worker_env(self.reports, run, profile=profile)
        name = f"txtasks-{case.backend}-{case.key[2]}"
        processes = [
            WorkerProcess(f"{name}-{i}", argv, env, s.log_dir)
            for i in range(s.load_workers if case.load else 1)
        ]
        if case.load:
            assert s.amqp_url is not None
            load_argv = [
                sys.executable,
                "-m",
                "tests.benchmarks.latency_apps",
                "load",
                url,
                s.amqp_url,
                f"{case.load:g}",
            ]
            loader = WorkerProcess(f"load-{case.backend}", load_argv, env, s.log_dir)
            processes.append(loader)
            self.commands[f"load, {BACKEND_LABELS[case.backend]}"] = loader.command
        worker = ProcessGroup(processes)
        self.commands[f"txtasks worker, {BACKEND_LABELS[case.backend]}, {case.key[2]}"] = processes[
            0
        ].command + (f" (x {s.load_workers})" if case.load else "")

        async def enqueue() -> tuple[int, asyncio.Future[Report], float, float]:
            async with engine.connect() as conn:
                async with conn.begin():
                    task_id = await task.aenqueue_tx(conn, None)
                    future = self.reports.expect(task_id)
                    before_commit = time.monotonic()
                committed = time.monotonic()
            return task_id, future, before_commit, committed

        await worker.start()
        try:
            return await measure(
                f"{case.backend}/{case.key[2]}",
                enqueue,
                self.reports,
                worker,
                n=s.n,
                warmup=s.warmup,
                pause=self.pause(case),
                timeout=self.timeout(case),
            )
        finally:
            await worker.stop()
            if case.load:
                log(f"  {processes[-1].log_tail(1)}; left ready: {await ready_left(engine)}")
            await notifier.close()
            app.use_notifier(NullNotifier())
            await engine.dispose()
            await asyncio.to_thread(tables_drop, url)
            if rabbitmq:
                assert s.amqp_url is not None
                await wakeup_queue_delete(s.amqp_url)

    async def run_bare(self, case: Case) -> Series:
        """The floor: what any design must do, written by hand (`latency_apps.bare_worker`)."""
        import aio_pika

        s = self.settings
        url = s.urls[case.backend]
        assert s.amqp_url is not None
        await asyncio.to_thread(tables_reset, url)
        run = self.reports.new_run()
        argv = [sys.executable, "-m", "tests.benchmarks.latency_apps", "bare"]
        env = worker_env(self.reports, run)
        env[latency_apps.ENV_BARE_URL] = url
        env[latency_apps.ENV_BARE_AMQP] = s.amqp_url
        env[latency_apps.ENV_UVLOOP] = "1" if s.worker_loop == "uvloop" else "0"
        worker = WorkerProcess(f"bare-{case.backend}", argv, env, s.log_dir)
        self.commands[f"bare design worker, {BACKEND_LABELS[case.backend]}"] = worker.command
        connection = await aio_pika.connect(s.amqp_url)
        channel = await connection.channel(publisher_confirms=False)
        await channel.queue_delete(latency_apps.BARE_QUEUE)
        await channel.declare_queue(latency_apps.BARE_QUEUE, auto_delete=False)
        underlay = await channel.get_underlay_channel()
        insert, close = await bare_inserter(url)

        async def enqueue() -> tuple[int, asyncio.Future[Report], float, float]:
            task_id, before_commit, committed = await insert()
            future = self.reports.expect(task_id)
            await underlay.basic_publish(
                str(task_id).encode(), routing_key=latency_apps.BARE_QUEUE, wait=False
            )
            return task_id, future, before_commit, committed

        await worker.start()
        try:
            return await measure(
                f"{case.backend}/bare",
                enqueue,
                self.reports,
                worker,
                n=s.n,
                warmup=s.warmup,
                pause=self.pause(case),
                timeout=self.timeout(case),
            )
        finally:
            await worker.stop()
            await close()
            with contextlib.suppress(Exception):
                await channel.queue_delete(latency_apps.BARE_QUEUE)
            await connection.close()
            await asyncio.to_thread(tables_drop, url)

    async def run_pgqueuer(self, case: Case) -> Series:
        s = self.settings
        latency_apps.pgqueuer_env()
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        dsn = asyncpg_dsn(s.urls["postgresql"])
        connection = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(connection))
        if await queries.schema_is_installed():
            await queries.uninstall()
        await queries.install()
        run = self.reports.new_run()
        argv = [sys.executable, "-m", "tests.benchmarks.latency_apps", "pgqueuer"]
        env = worker_env(self.reports, run)
        env[latency_apps.ENV_PGQUEUER_DSN] = dsn
        env["PGQUEUER_PREFIX"] = latency_apps.PGQUEUER_PREFIX
        worker = WorkerProcess("pgqueuer", argv, env, s.log_dir)
        self.commands["PGQueuer worker"] = worker.command

        async def enqueue() -> tuple[int, asyncio.Future[Report], float, float]:
            async with connection.transaction():
                (job_id,) = await queries.enqueue(latency_apps.PGQUEUER_ENTRYPOINT, None)
                future = self.reports.expect(int(job_id))
                before_commit = time.monotonic()
            committed = time.monotonic()
            return int(job_id), future, before_commit, committed

        await worker.start()
        try:
            return await measure(
                "postgresql/pgqueuer",
                enqueue,
                self.reports,
                worker,
                n=s.n,
                warmup=s.warmup,
                pause=self.pause(case),
                timeout=self.timeout(case),
            )
        finally:
            await worker.stop()
            try:
                await queries.uninstall()
            finally:
                await connection.close()


#: The bare design's INSERT: the columns txtasks needs, the rest left to their defaults.
BARE_INSERT = (
    "INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority, "
    "run_at, attempt, max_attempts, created_at) VALUES ({values})"
)
BARE_ROW = ("{q}", "{q}", "{q}", "'application/json'", "'pending'", "0", "{q}", "0", "1", "{q}")


def bare_insert_sql(mark: str, returning: bool) -> str:
    """`BARE_INSERT` with the parameter marks of a driver (`$n` numbered, or `%s` / `?`)."""
    values = []
    n = 0
    for value in BARE_ROW:
        if value == "{q}":
            n += 1
            value = f"${n}" if mark == "$" else mark
        values.append(value)
    sql = BARE_INSERT.format(values=", ".join(values))
    return sql + " RETURNING id" if returning else sql


async def bare_inserter(
    url: str,
) -> tuple[Callable[[], Awaitable[tuple[int, float, float]]], Callable[[], Awaitable[None]]]:
    """`insert() -> (task id, before commit, commit returned)` on one connection of the
    database's own driver, and `close()`."""
    from txtasks.clock import utcnow

    backend = backend_name(url)
    row = lambda now: (latency_apps.QUEUE, latency_apps.ASYNC_TASK, b"null", now, now)  # noqa: E731
    if backend == "postgresql":
        import asyncpg

        pg = await asyncpg.connect(asyncpg_dsn(url))
        pg_sql = bare_insert_sql("$", returning=True)

        async def insert_pg() -> tuple[int, float, float]:
            async with pg.transaction():
                task_id = await pg.fetchval(pg_sql, *row(utcnow()))
                before = time.monotonic()
            return int(task_id), before, time.monotonic()

        return insert_pg, pg.close
    if backend == "sqlite":
        lite = sqlite3.connect(make_url(url).database or "", isolation_level=None)
        lite.execute("PRAGMA busy_timeout = 5000")
        lite.execute("PRAGMA synchronous = NORMAL")
        lite_sql = bare_insert_sql("?", returning=False)

        async def insert_sqlite() -> tuple[int, float, float]:
            lite.execute("BEGIN IMMEDIATE")
            task_id = lite.execute(lite_sql, row(utcnow().isoformat(" "))).lastrowid
            before = time.monotonic()
            lite.execute("COMMIT")
            return int(task_id or 0), before, time.monotonic()

        async def close_sqlite() -> None:
            lite.close()

        return insert_sqlite, close_sqlite
    import aiomysql

    parsed = make_url(url)
    my = await aiomysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        db=parsed.database,
    )
    my_sql = bare_insert_sql("%s", returning=False)

    async def insert_mysql() -> tuple[int, float, float]:
        await my.begin()
        async with my.cursor() as cursor:
            await cursor.execute(my_sql, row(utcnow()))
            task_id = cursor.lastrowid
        before = time.monotonic()
        await my.commit()
        return int(task_id), before, time.monotonic()

    async def close_mysql() -> None:
        my.close()

    return insert_mysql, close_mysql


async def ready_left(engine: Any) -> int:
    """Tasks still waiting in the benchmark's queue (a load the workers kept up with: few)."""
    async with engine.connect() as conn:
        query = text(
            "SELECT count(*) FROM txtasks_tasks WHERE queue = :q AND state IN ('pending', 'retryable')"
        )
        return int((await conn.execute(query, {"q": latency_apps.QUEUE})).scalar_one())


def loop_of(choice: str) -> str:
    """`--worker-loop`: auto is uvloop when it is installed (txtasks' own `--loop auto`)."""
    if choice != "auto":
        return choice
    return "uvloop" if util.find_spec("uvloop") is not None else "asyncio"


def asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pgqueuer_version() -> str | None:
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return None
    return metadata.version("pgqueuer")


# -- profile --------------------------------------------------------------------------------------

#: (from mark, to mark, what happens in between), along the critical path.
PROFILE_SEGMENTS = [
    ("before_commit", "notify", "enqueuer: COMMIT round trip, up to txtasks' after-commit hook"),
    ("notify", "committed", "enqueuer: after-commit hook → commit returns to the caller"),
    ("committed", "publish_start", "enqueuer: commit returned → the publisher sends"),
    (
        "publish_start",
        "publish_end",
        "enqueuer: the publish call (handed to the connection writer)",
    ),
    ("publish_end", "wakeup", "RabbitMQ → worker's wake-up handler runs"),
    ("wakeup", "claim_start", "worker: wake-up → claim starts"),
    ("claim_start", "do_ping_start", "claim: txtasks + SQLAlchemy up to the pool pre-ping"),
    ("do_ping_start", "do_ping_end", "claim: pool pre-ping (asyncpg: BEGIN; ping; ROLLBACK)"),
    ("do_ping_end", "checkout", "claim: pre-ping → pool checkout done"),
    ("checkout", "sa_begin", "claim: checkout → SQLAlchemy transaction begins"),
    ("sa_begin", "execute_start", "claim: transaction begun → UPDATE issued"),
    ("execute_start", "begin_start", "claim: SQLAlchemy cursor → BEGIN"),
    ("begin_start", "begin_end", "claim: BEGIN round trip"),
    ("begin_end", "execute_end", "claim: UPDATE ... RETURNING round trip"),
    ("execute_end", "do_commit_start", "claim: rows → TaskRow, up to COMMIT"),
    ("do_commit_start", "do_commit_end", "claim: COMMIT round trip"),
    ("do_commit_end", "claim_end", "claim: connection returned to the pool, rows sorted"),
    ("claim_end", "started", "worker: claim returned → handler starts"),
]
PROFILE_TOTALS = [
    ("committed", "wakeup", "commit returned → wake-up in the worker"),
    ("wakeup", "started", "wake-up in the worker → handler starts"),
    ("claim_start", "claim_end", "the whole claim"),
    ("committed", "started", "commit returned → handler starts (the latency)"),
]


class PublishTimes:
    """In the benchmark process: when each task's hint was handed over and published."""

    def __init__(self) -> None:
        self.notified: dict[int, float] = {}
        self.published: dict[int, tuple[float, float]] = {}

    def install(self) -> None:
        from txtasks.wakeup.amqp import notifier, publisher

        notified, published = self.notified, self.published
        notify = notifier.AmqpNotifier.notify
        publish = publisher._PublishLink.publish

        def timed_notify(publisher: Any, queue: str, ids: Sequence[int] = ()) -> None:
            now = time.monotonic()
            for task_id in ids:
                notified[task_id] = now
            notify(publisher, queue, ids)

        async def timed_publish(link: Any, queue: str, ids: list[int]) -> None:
            start = time.monotonic()
            await publish(link, queue, ids)
            end = time.monotonic()
            for task_id in ids:
                published[task_id] = (start, end)

        notifier.AmqpNotifier.notify = timed_notify  # type: ignore[method-assign]
        publisher._PublishLink.publish = timed_publish  # type: ignore[method-assign]


def profile_marks(sample: Sample, times: PublishTimes) -> dict[str, float]:
    marks: dict[str, float] = {
        "before_commit": sample.before_commit,
        "committed": sample.committed,
        "started": sample.report.started,
    }
    if sample.task_id in times.notified:
        marks["notify"] = times.notified[sample.task_id]
    if sample.task_id in times.published:
        marks["publish_start"], marks["publish_end"] = times.published[sample.task_id]
    for name, value in (sample.report.extra or {}).items():
        if isinstance(value, int | float):
            marks[name] = float(value)
    return marks


def profile_table(series: Series, times: PublishTimes) -> str:
    all_marks = [profile_marks(s, times) for s in series.samples]
    lines = [
        "| segment | median ms | mean ms | p90 ms | samples |",
        "|---|---:|---:|---:|---:|",
    ]

    def row(start: str, end: str, what: str, bold: bool = False) -> None:
        values = [(m[end] - m[start]) * 1000 for m in all_marks if start in m and end in m]
        if not values:
            return
        name = f"**{what}**" if bold else what
        lines.append(
            f"| {name} | {statistics.median(values):.3f} | {statistics.fmean(values):.3f} | "
            f"{percentile(values, 90):.3f} | {len(values)} |"
        )

    for start, end, what in PROFILE_SEGMENTS:
        row(start, end, what)
    for start, end, what in PROFILE_TOTALS:
        row(start, end, what, bold=True)
    return "\n".join(lines)


# -- servers --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(count: int) -> int:
    """The first of `count` consecutive free ports (RabbitMQ uses port, port+1, port+2)."""
    for _ in range(200):
        first = random.randint(20000, 60000)
        if all(port_is_free(first + i) for i in range(count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports found")


class Servers:
    """Private PostgreSQL (durable settings), MariaDB and RabbitMQ from tests/services.sh."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="txtasks-latency-", dir="/tmp"))
        self.started = False

    def start(self, services: Sequence[str]) -> dict[str, str]:
        env = {
            **os.environ,
            "SERVICES": " ".join(services),
            "PG_PORT": str(free_port()),
            "MY_PORT": str(free_port()),
            "RMQ_PORT": str(free_port_run(3)),
            "PG_FAST": "0",
            "SVC_DB": "bench",
        }
        log(f"starting {', '.join(services)} in {self.base} (tests/services.sh, PG_FAST=0)")
        self.started = True
        subprocess.run(
            ["bash", str(REPO / "tests" / "services.sh"), "start", str(self.base)],
            env=env,
            check=True,
            stdout=sys.stderr,
        )
        values: dict[str, str] = {}
        for line in (self.base / "services.env").read_text().splitlines():
            key, _, value = line.partition("=")
            values[key] = value
        return values

    def stop(self) -> None:
        if self.started:
            subprocess.run(
                ["bash", str(REPO / "tests" / "services.sh"), "stop", str(self.base)],
                check=False,
                stdout=sys.stderr,
            )
            self.started = False
        subprocess.run(["rm", "-rf", str(self.base)], check=False)


# -- report ---------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in (
        "txtasks",
        "SQLAlchemy",
        "asyncpg",
        "aiomysql",
        "aiosqlite",
        "aio-pika",
        "pgqueuer",
    ):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "txtasks"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        found["txtasks"] += f" (git {head}{', txtasks/ modified' if dirty else ''})"
    return found


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def machine_info() -> list[str]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return [
        f"CPUs: {os.cpu_count()} (usable by this process: {affinity}), {cpu_model()}",
        f"Platform: {platform.platform()}",
        f"Python: {platform.python_version()} ({platform.python_implementation()})",
    ]


def fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def fmt_range(values: Sequence[float]) -> str:
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


@dataclass
class Row:
    case: Case
    label: str
    runs: list[Series] = field(default_factory=list)
    error: str | None = None

    def summaries(self) -> list[Summary]:
        return [Summary.of(series.latencies_ms) for series in self.runs if series.samples]


def results_table(rows: list[Row], runs: int) -> str:
    many = runs > 1
    head = "| backend | mode | n | p50 ms | p90 ms | p99 ms | max ms | timeouts |"
    if many:
        head = (
            "| backend | mode | runs x n | p50 ms median (min-max) | p90 ms median | "
            "p99 ms median (min-max) | max ms | timeouts |"
        )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        backend = BACKEND_LABELS[row.case.backend]
        summaries = row.summaries()
        if not summaries:
            lines.append(f"| {backend} | {row.label} | 0 | - | - | - | - | {row.error or ''} |")
            continue
        timeouts = sum(series.timeouts for series in row.runs)
        n = f"{len(summaries)} x {summaries[0].n}" if many else str(summaries[0].n)
        lines.append(
            f"| {backend} | {row.label} | {n} | {fmt_range([x.p50 for x in summaries])} | "
            f"{fmt(statistics.median([x.p90 for x in summaries]))} | "
            f"{fmt_range([x.p99 for x in summaries])} | "
            f"{fmt(max(x.max for x in summaries))} | {timeouts} |"
        )
    return "\n".join(lines)


def draw_chart(rows: list[Row], path: Path) -> None:
    """p50 and p99 of each case, medians of the runs (matplotlib; docs/images/latency.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [row for row in rows if row.summaries()]
    names = [f"{BACKEND_LABELS[row.case.backend]}: {row.label}" for row in shown]
    p50 = [median_of(row, "p50") or 0.0 for row in shown]
    p99 = [median_of(row, "p99") or 0.0 for row in shown]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(shown) + 1.6))
    at = list(range(len(shown)))
    colors = [
        "#1f77b4" if row.case.system == "txtasks" else "#2ca02c" if row.case.system == "bare"
        else "#999999"
        for row in shown
    ]  # fmt: skip
    ax.barh([i + 0.2 for i in at], p99, height=0.4, color=colors, alpha=0.45, label="p99")
    ax.barh([i - 0.2 for i in at], p50, height=0.4, color=colors, label="p50")
    for i in at:
        ax.text(p50[i], i - 0.2, f" {p50[i]:.2f}", va="center", fontsize=7)
        ax.text(p99[i], i + 0.2, f" {p99[i]:.2f}", va="center", fontsize=7)
    ax.set_yticks(at, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from COMMIT returned to handler start (lower is better)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(
        "txtasks latency: p50 (solid), p99 (light); green: the bare design, grey: PGQueuer",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def median_of(row: Row | None, what: str) -> float | None:
    summaries = row.summaries() if row else []
    return statistics.median([getattr(x, what) for x in summaries]) if summaries else None


def verdict(rows: list[Row]) -> list[str]:
    """The targets of the RabbitMQ wake-up: p50 within `BARE_MARGIN_MS` of the bare design on
    every backend; on PostgreSQL also p50 <= `NOTIFY_P50_RATIO` x PGQueuer's and p99 <= its."""
    by_key = {row.case.key: row for row in rows}
    ref_p50 = median_of(by_key.get(("pgqueuer", "postgresql", "notify")), "p50")
    ref_p99 = median_of(by_key.get(("pgqueuer", "postgresql", "notify")), "p99")
    lines = []
    for row in rows:
        if row.case.system != "txtasks" or row.case.mode != "rabbitmq" or row.case.load:
            continue
        p50, p99 = median_of(row, "p50"), median_of(row, "p99")
        if p50 is None or p99 is None:
            continue
        checks = []
        bare = median_of(by_key.get(("bare", row.case.backend, "rabbitmq")), "p50")
        if bare is not None:
            ok = p50 - bare <= BARE_MARGIN_MS
            checks.append(
                f"p50 {p50:.2f} within {BARE_MARGIN_MS} ms of the bare design's {bare:.2f} "
                f"(+{p50 - bare:.2f}): {'yes' if ok else 'NO'}"
            )
        if ref_p50 is not None and ref_p99 is not None and row.case.backend == "postgresql":
            ok50 = p50 <= NOTIFY_P50_RATIO * ref_p50
            ok99 = p99 <= ref_p99
            checks.append(
                f"p50 {p50:.2f} <= {NOTIFY_P50_RATIO} x PGQueuer's {ref_p50:.2f} "
                f"({p50 / ref_p50:.2f}x): {'yes' if ok50 else 'NO'}"
            )
            checks.append(f"p99 {p99:.2f} <= PGQueuer's {ref_p99:.2f}: {'yes' if ok99 else 'NO'}")
        if checks:
            lines.append(f"- {BACKEND_LABELS[row.case.backend]}, RabbitMQ: " + "; ".join(checks))
    return lines


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.latency",
        description=(
            "Commit→handler-start latency of txtasks (RabbitMQ wake-ups, polling only) on "
            "PostgreSQL, MariaDB and SQLite, with PGQueuer's LISTEN/NOTIFY on the same "
            "PostgreSQL as the reference. Databases must be dedicated to benchmarks: the "
            "txtasks tables in them are dropped and recreated."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    env = os.environ.get
    servers = parser.add_argument_group("servers (a backend without a URL is skipped)")
    servers.add_argument(
        "--postgres-url",
        default=env("TXTASKS_BENCH_POSTGRES_URL"),
        help="PostgreSQL database for benchmarks [env TXTASKS_BENCH_POSTGRES_URL]",
    )
    servers.add_argument(
        "--mysql-url",
        default=env("TXTASKS_BENCH_MYSQL_URL"),
        help="MariaDB database for benchmarks [env TXTASKS_BENCH_MYSQL_URL]",
    )
    servers.add_argument(
        "--amqp-url",
        default=env("TXTASKS_BENCH_AMQP_URL"),
        help="RabbitMQ for the wake-up mode [env TXTASKS_BENCH_AMQP_URL]",
    )
    servers.add_argument(
        "--sqlite",
        nargs="?",
        const="auto",
        default=env("TXTASKS_BENCH_SQLITE_PATH"),
        metavar="FILE",
        help="benchmark SQLite too, in FILE (default: a temporary file) "
        "[env TXTASKS_BENCH_SQLITE_PATH]",
    )
    servers.add_argument(
        "--start-servers",
        action="store_true",
        help="start private PostgreSQL (durable defaults), MariaDB and RabbitMQ with "
        "tests/services.sh on free ports, and SQLite in a temporary file; stop them at the "
        "end (URLs from options and env are then ignored)",
    )
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated subset of postgresql,mysql,sqlite",
    )
    what.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of rabbitmq,polling"
    )
    what.add_argument("--no-pgqueuer", action="store_true", help="skip the PGQueuer reference")
    what.add_argument(
        "--no-bare",
        action="store_true",
        help="skip the bare design (INSERT, publish after commit, claim by id): the floor",
    )
    what.add_argument(
        "--profile",
        action="store_true",
        help="instead of the table: one run of the RabbitMQ mode on PostgreSQL with "
        "timestamps along the path, and the median of each segment",
    )
    how = parser.add_argument_group("how")
    how.add_argument("-n", "--tasks", type=int, default=500, help="measured tasks per run")
    how.add_argument("--warmup", type=int, default=20, help="tasks before measuring")
    how.add_argument(
        "--runs", type=int, default=1, help="repeat every case; report medians and min-max"
    )
    how.add_argument(
        "--gap",
        type=float,
        default=0.05,
        help="seconds between a task's start and the next enqueue: gapxU(1,2); polling "
        "mode adds U(0, poll interval)",
    )
    how.add_argument(
        "--poll-interval", type=float, default=1.0, help="worker poll interval, polling mode"
    )
    how.add_argument(
        "--wakeup-poll-interval",
        type=float,
        default=30.0,
        help="worker poll interval in the RabbitMQ mode (long, so only wake-ups count)",
    )
    how.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="txtasks worker --concurrency (default: none given, the worker's own default)",
    )
    how.add_argument(
        "--load-rate",
        type=float,
        default=0.0,
        help="also measure txtasks + RabbitMQ while a steady load of this many tasks/s runs "
        "on the same queue (enqueued in batches every 10 ms by a process of its own); "
        "e.g. half the tuned burn-down rate of tests/benchmarks/throughput.py",
    )
    how.add_argument(
        "--load-workers", type=int, default=2, help="worker processes of the load case"
    )
    how.add_argument(
        "--load-concurrency", type=int, default=500, help="--concurrency of the load case"
    )
    how.add_argument(
        "--handler",
        choices=("async", "sync"),
        default="async",
        help="txtasks handler kind (sync handlers run in the worker's thread pool)",
    )
    how.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds a task may take to start before it counts as a timeout "
        "(polling mode: plus 1.2 x poll interval)",
    )
    how.add_argument(
        "--worker-loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop of the txtasks worker (`txtasks worker --loop`) and of the bare "
        "design's worker; auto: uvloop when installed, as txtasks and pgq run choose",
    )
    how.add_argument(
        "--worker-log-level", default="warning", choices=("debug", "info", "warning", "error")
    )
    how.add_argument("--output", type=Path, help="also write the Markdown report to this file")
    how.add_argument(
        "--chart", type=Path, help="also draw p50 and p99 of each case into this PNG (matplotlib)"
    )
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for backend in args.backends:
        if backend not in BACKENDS:
            parser.error(f"--backends: unknown backend {backend!r}")
    for mode in args.modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r}")
    if args.tasks < 1 or args.warmup < 0 or args.runs < 1:
        parser.error("--tasks and --runs must be >= 1, --warmup >= 0")
    return args


def plan_cases(args: argparse.Namespace, urls: dict[str, str], amqp: str | None) -> list[Case]:
    if args.profile:  # the first of --backends with a URL
        backend = next((b for b in args.backends if b in urls), None)
        if backend is None or not amqp:
            raise SystemExit("--profile needs a database and RabbitMQ (URLs or --start-servers)")
        return [Case("txtasks", backend, "rabbitmq")]
    cases: list[Case] = []
    for backend in args.backends:
        if backend not in urls:
            log(f"skipping {BACKEND_LABELS[backend]}: no URL given")
            continue
        for mode in args.modes:
            if mode == "rabbitmq" and not amqp:
                log(f"skipping {BACKEND_LABELS[backend]} + RabbitMQ: no AMQP URL given")
                continue
            cases.append(Case("txtasks", backend, mode))
        if "rabbitmq" in args.modes and amqp and not args.no_bare:
            cases.append(Case("bare", backend, "rabbitmq"))
        if "rabbitmq" in args.modes and amqp and args.load_rate > 0:
            cases.append(Case("txtasks", backend, "rabbitmq", load=args.load_rate))
        if backend == "postgresql" and not args.no_pgqueuer:
            if pgqueuer_version() is None:
                log(
                    "skipping the PGQueuer reference: pgqueuer is not importable here "
                    "(install it into this environment only: pip install pgqueuer)"
                )
            else:
                cases.append(Case("pgqueuer", "postgresql", "notify"))
    if not cases:
        raise SystemExit(
            "nothing to run: give --postgres-url/--mysql-url/--sqlite or --start-servers"
        )
    return cases


async def amain(
    args: argparse.Namespace, urls: dict[str, str], amqp: str | None, log_dir: Path
) -> str:
    cases = plan_cases(args, urls, amqp)
    settings = Settings(
        urls=urls,
        amqp_url=amqp,
        n=args.tasks,
        warmup=args.warmup,
        runs=1 if args.profile else args.runs,
        gap=args.gap,
        poll_interval=args.poll_interval,
        wakeup_poll_interval=args.wakeup_poll_interval,
        concurrency=args.concurrency,
        handler=args.handler,
        timeout=args.timeout,
        worker_log_level=args.worker_log_level,
        worker_loop=loop_of(args.worker_loop),
        log_dir=log_dir,
        load_rate=args.load_rate,
        load_workers=args.load_workers,
        load_concurrency=args.load_concurrency,
    )
    reports, transport = await open_reports()
    bench = Bench(settings, reports)
    times = PublishTimes()
    if args.profile:
        times.install()
    info: dict[str, str] = {}
    for backend in {c.backend for c in cases}:
        info.update(await asyncio.to_thread(server_info, urls[backend]))
    if amqp and any(c.mode == "rabbitmq" for c in cases):
        info["RabbitMQ"] = await rabbitmq_version(amqp)
    load_before = os.getloadavg()
    rows = {case.key: Row(case, bench.label(case)) for case in cases}
    started = time.monotonic()
    try:
        for run in range(settings.runs):
            for case in cases:
                row = rows[case.key]
                if row.error:
                    continue
                log(
                    f"[run {run + 1}/{settings.runs}] {BACKEND_LABELS[case.backend]}: "
                    f"{row.label}, {settings.warmup} + {settings.n} tasks"
                )
                try:
                    series = await bench.run_case(case, profile=args.profile)
                except CaseError as exc:
                    log(f"  FAILED: {exc}")
                    row.error = "failed"
                    continue
                row.runs.append(series)
                woken = [
                    (
                        x.report.extra["wakeup"] - x.committed,
                        x.report.started - x.report.extra["wakeup"],
                    )
                    for x in series.samples
                    if x.report.extra and "wakeup" in x.report.extra
                ]
                if woken:
                    to_wakeup = statistics.median(a for a, _ in woken) * 1000
                    to_start = statistics.median(b for _, b in woken) * 1000
                    log(f"  commit → wake-up p50 {to_wakeup:.3f} ms, → start p50 {to_start:.3f}")
                summary = Summary.of(series.latencies_ms)
                log(
                    f"  p50 {fmt(summary.p50)} ms, p90 {fmt(summary.p90)}, p99 {fmt(summary.p99)}, "
                    f"max {fmt(summary.max)}, timeouts {series.timeouts}"
                )
    finally:
        transport.close()
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()

    if args.chart and not args.profile:
        draw_chart(list(rows.values()), args.chart)
        log(f"chart written to {args.chart}")
    out: list[str] = []
    title = "txtasks latency profile" if args.profile else "txtasks commit→handler-start latency"
    out += [f"## {title}", ""]
    ordered = list(rows.values())
    out += [results_table(ordered, settings.runs), ""]
    if args.profile:
        series = rows[cases[0].key].runs
        if series:
            out += [
                "Where the time goes (PostgreSQL, RabbitMQ wake-up; medians of each segment "
                "over the measured tasks — medians of segments need not add up to the median "
                "total, means do; the timestamps themselves add a few µs):",
                "",
                profile_table(series[0], times),
                "",
            ]
    else:
        lines = verdict(ordered)
        if lines:
            out += [
                f"Targets (RabbitMQ p50 within {BARE_MARGIN_MS} ms of the bare design; on "
                f"PostgreSQL p50 <= {NOTIFY_P50_RATIO} x and p99 <= PGQueuer's):",
                "",
                *lines,
                "",
            ]
    uvloop = util.find_spec("uvloop") is not None
    notes = [
        "Latency: handler start (time.monotonic() in the worker process) minus the moment the "
        "enqueuing transaction's COMMIT returned (time.monotonic() in the benchmark process); "
        f"one task at a time to an idle worker, after {settings.warmup} warm-up tasks, with "
        f"{settings.gap:g}xU(1,2) s between a start and the next enqueue"
        + (
            f" (polling mode: plus U(0, {settings.poll_interval:g}) s, so the expected "
            f"polling latency is ~U(0, {settings.poll_interval:g}) s)"
            if any(c.mode == "polling" for c in cases)
            else ""
        )
        + ".",
        "txtasks worker: "
        + (
            f"`--concurrency {settings.concurrency}`"
            if settings.concurrency is not None
            else "no `--concurrency` (its default)"
        )
        + f", {settings.handler} handler, "
        f"{settings.worker_loop} event loop; enqueue with "
        "`await task.aenqueue_tx(conn, None)` in `engine.connect()` + `conn.begin()` "
        "(SQLAlchemy AsyncEngine).",
    ]
    if any(c.system == "pgqueuer" for c in cases):
        notes.append(
            "PGQueuer: a QueueManager on one asyncpg connection run by `pgqueuer.run` (what "
            "`pgq run` runs) with the default batch size and dequeue timeout, on "
            f"{'uvloop' if uvloop else 'asyncio'} (pgq's choice when uvloop is installed); "
            "enqueue with `Queries(AsyncpgDriver(conn)).enqueue(...)` inside "
            "`conn.transaction()`, one job per transaction."
        )
    out += ["Method:", "", *[f"- {note}" for note in notes], ""]
    out += ["Worker commands:", ""]
    out += [f"- {name}: `{command}`" for name, command in bench.commands.items()]
    out += ["", "Machine and versions:", ""]
    out += [f"- {line}" for line in machine_info()]
    out.append("- " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    out += [f"- {name}: {value}" for name, value in sorted(info.items())]
    out.append(
        f"- load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after: {' '.join(f'{x:.2f}' for x in load_after)}; wall time {elapsed:.0f} s"
    )
    command = masked(shlex.join(["python", "-m", "tests.benchmarks.latency", *sys.argv[1:]]))
    out += ["", f"Command: `{command}`", ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def terminate(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    servers: Servers | None = None
    lock = DatabaseLock()
    with tempfile.TemporaryDirectory(prefix="txtasks-latency-") as scratch:
        scratch_dir = Path(scratch)
        try:
            urls: dict[str, str] = {}
            if args.start_servers:
                servers = Servers()
                wanted = [b for b in args.backends if b != "sqlite"]
                if args.profile:
                    wanted = ["postgresql"]
                services = [{"postgresql": "pg", "mysql": "mariadb"}[b] for b in wanted]
                if args.profile or "rabbitmq" in args.modes:
                    services.append("rabbitmq")
                values = servers.start(services) if services else {}
                if "PG_DSN" in values:
                    urls["postgresql"] = values["PG_DSN"]
                if "MYSQL_DSN" in values:
                    urls["mysql"] = values["MYSQL_DSN"]
                amqp = values.get("AMQP_URL")
                if "sqlite" in args.backends:
                    urls["sqlite"] = f"sqlite:///{servers.base / 'latency.sqlite3'}"
            else:
                if args.postgres_url:
                    urls["postgresql"] = args.postgres_url
                if args.mysql_url:
                    urls["mysql"] = args.mysql_url
                if args.sqlite:
                    path = scratch_dir / "latency.sqlite3" if args.sqlite == "auto" else args.sqlite
                    urls["sqlite"] = f"sqlite:///{Path(path).resolve()}"
                amqp = args.amqp_url
            for url in urls.values():
                lock.acquire(url)
            report = asyncio.run(amain(args, urls, amqp, scratch_dir))
        except KeyboardInterrupt:
            log("interrupted")
            return 130
        finally:
            for pid in list(STARTED_PIDS):  # workers left behind by an interruption
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            lock.release()
            if servers is not None:
                servers.stop()
    print(report)
    if args.output:
        args.output.write_text(report + "\n")
        log(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
