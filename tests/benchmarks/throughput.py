"""Throughput of txtasks beside PGQueuer, procrastinate and the raw SQL limit, in one run.

    python -m tests.benchmarks.throughput --help
    python -m tests.benchmarks.throughput --start-servers --output throughput.md \\
        --chart docs/images/throughput.png

1. Burn-down: N no-op tasks preloaded, workers started (each in its own process), tasks/s from
   the first handler start to the exit of the last worker (every system stops by itself once
   its queue is empty; the exit includes writing the last outcomes).
2. Enqueue: one task per transaction through SQLAlchemy (the application's path), and bulk;
   against asyncpg doing the same inserts by hand (PostgreSQL).
3. Cost per task on PostgreSQL: commits, rows written and WAL bytes (`pg_stat_database`,
   `pg_current_wal_lsn`) over each burn-down, divided by N.

See tests/benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.benchmarks import throughput_apps as apps
from tests.benchmarks.latency import (
    REPO,
    DatabaseLock,
    Servers,
    asyncpg_dsn,
    log,
    machine_info,
    masked,
    server_info,
    tables_drop,
    tables_reset,
    versions,
)
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import url_async, url_sync

BACKENDS = ("postgresql", "mysql", "sqlite")
LABELS = {"postgresql": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}
PROCRASTINATE_SCHEMA = "procrastinate_bench"
#: Rows per transaction when preloading, and in the bulk enqueue.
CHUNK = 5000
INSERT_COLUMNS = (
    "queue, task_name, payload, content_type, state, priority, run_at, attempt, max_attempts, "
    "created_at"
)
RAW_INSERT = (
    f"INSERT INTO txtasks_tasks ({INSERT_COLUMNS}) "
    "VALUES ($1, $2, $3, 'application/json', 'pending', 0, $4, 0, 3, $4) RETURNING id"
)
RAW_INSERT_MANY = (
    f"INSERT INTO txtasks_tasks ({INSERT_COLUMNS}) "
    "VALUES ($1, $2, $3, 'application/json', 'pending', 0, $4, 0, 3, $4)"
)


# -- worker processes -----------------------------------------------------------------------------


class FirstStarts(asyncio.DatagramProtocol):
    """Collects the `run first-start` datagrams of the current run's worker processes."""

    def __init__(self) -> None:
        self.run = ""
        self.starts: list[float] = []
        #: CPU seconds each process had used by its first task (start-up, imports).
        self.startup_cpu: list[float] = []
        self.port = 0

    def new_run(self) -> str:
        self.run = uuid.uuid4().hex[:12]
        self.starts = []
        self.startup_cpu = []
        return self.run

    def datagram_received(self, data: bytes, addr: Any) -> None:
        run, *values = data.decode(errors="replace").split(" ")
        if run == self.run:
            with contextlib.suppress(ValueError, IndexError):
                started, cpu = float(values[0]), float(values[1])
                self.starts.append(started)
                self.startup_cpu.append(cpu)


async def open_first_starts() -> tuple[FirstStarts, asyncio.DatagramTransport]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(
        FirstStarts, local_addr=("127.0.0.1", 0)
    )
    protocol.port = transport.get_extra_info("sockname")[1]
    return protocol, transport


async def run_processes(
    argvs: Sequence[list[str]], env: dict[str, str], log_dir: Path, timeout: float
) -> tuple[float, float]:
    """Start every process at once; the monotonic time the last one exited (0 exits only) and
    the CPU seconds (user and system) the processes used in all."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = used.ru_utime + used.ru_stime
    logs = [log_dir / f"worker-{uuid.uuid4().hex[:6]}.log" for _ in argvs]
    processes = []
    for argv, path in zip(argvs, logs, strict=True):
        with path.open("wb") as out:
            processes.append(
                await asyncio.create_subprocess_exec(
                    *argv, cwd=REPO, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT
                )
            )
    try:
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in processes)), timeout)
    except asyncio.TimeoutError:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        raise RuntimeError(f"workers did not drain the queue in {timeout:.0f}s") from None
    ended = time.monotonic()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the exited processes, reaped above
    cpu = used.ru_utime + used.ru_stime - cpu_before
    for code, path in zip(codes, logs, strict=True):
        if code != 0:
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"a worker exited with {code}; its log ({path}):\n{tail}")
    return ended, cpu


# -- the cases ------------------------------------------------------------------------------------


@dataclass
class Burn:
    """One burn-down configuration."""

    key: str
    system: str  # txtasks, pgqueuer, procrastinate, raw
    backend: str
    label: str
    n: int
    processes: int
    options: list[str] = field(default_factory=list)
    archive: bool = True

    def argvs(self, url: str) -> list[list[str]]:
        if self.system == "txtasks":
            argv = [
                sys.executable,
                "-m",
                "txtasks",
                "worker",
                "tests.benchmarks.throughput_apps:app",
                "--database-url",
                url,
                "--burst",
                "--burst-horizon",
                "0",
                "--log-level",
                "warning",
                *self.options,
            ]
        else:
            dsn = asyncpg_dsn(url)
            if self.system == "procrastinate":
                dsn = procrastinate_dsn(url)
            argv = [sys.executable, "-m", "tests.benchmarks.throughput_apps", self.system]
            argv += ["--dsn", dsn, *self.options]
        return [argv] * self.processes

    def command(self, url: str) -> str:
        argv = self.argvs(url)[0]
        shown = ["python", *argv[1:]]
        return (f"{self.processes} x " if self.processes > 1 else "") + shlex.join(shown)


def procrastinate_dsn(url: str) -> str:
    """A libpq conninfo whose sessions use procrastinate's own schema."""
    base = asyncpg_dsn(url)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{PROCRASTINATE_SCHEMA}"


def burn_cases(args: argparse.Namespace, urls: dict[str, str]) -> list[Burn]:
    cases: list[Burn] = []
    tuned = ["--concurrency", str(args.tuned_concurrency)]
    for backend in BACKENDS:
        if backend not in urls:
            continue
        n = args.tasks if backend == "postgresql" else args.tasks_other
        cases.append(
            Burn(f"{backend}/txtasks/defaults", "txtasks", backend, "txtasks, defaults", n, 1)
        )
        processes = 1 if backend == "sqlite" else args.tuned_processes
        label = f"txtasks, tuned ({processes} x concurrency {args.tuned_concurrency})"
        cases.append(
            Burn(f"{backend}/txtasks/tuned", "txtasks", backend, label, n, processes, tuned)
        )
        cases.append(
            Burn(
                f"{backend}/txtasks/tuned-no-archive",
                "txtasks",
                backend,
                label.replace("tuned", "tuned, no archive"),
                n,
                processes,
                [*tuned, "--no-archive-completed"],
                archive=False,
            )
        )
    if "postgresql" in urls and not args.no_peers:
        n = args.tasks
        if module_version("pgqueuer"):
            cases.append(
                Burn(
                    "postgresql/pgqueuer/defaults",
                    "pgqueuer",
                    "postgresql",
                    "PGQueuer, defaults (batch 10)",
                    n,
                    1,
                )
            )
            cases.append(
                Burn(
                    "postgresql/pgqueuer/tuned",
                    "pgqueuer",
                    "postgresql",
                    "PGQueuer, tuned (2 x batch 500)",
                    n,
                    2,
                    ["--batch", "500"],
                )
            )
        else:
            log("skipping PGQueuer: not importable (pip install pgqueuer)")
        if module_version("procrastinate"):
            for concurrency in (1, 10):
                cases.append(
                    Burn(
                        f"postgresql/procrastinate/c{concurrency}",
                        "procrastinate",
                        "postgresql",
                        f"procrastinate, concurrency {concurrency}",
                        args.tasks_procrastinate,
                        1,
                        ["--concurrency", str(concurrency)],
                    )
                )
        else:
            log("skipping procrastinate: not importable (pip install procrastinate)")
        cases.append(
            Burn(
                "postgresql/raw",
                "raw",
                "postgresql",
                "raw SQL limit (asyncpg, 4 claimers x 500)",
                n,
                1,
                ["--claimers", "4", "--batch", "500"],
            )
        )
    only = [k for k in (args.only or "").split(",") if k]
    return [c for c in cases if not only or any(o in c.key for o in only)]


def module_version(name: str) -> str | None:
    from importlib import metadata, util

    if util.find_spec(name) is None:
        return None
    return metadata.version(name)


# -- preparing the queues -------------------------------------------------------------------------


async def txtasks_preload(url: str, n: int) -> None:
    tables_reset(url)
    app = apps.app
    app_db = type(app)("throughput-preload", database_url=url)
    try:
        for start in range(0, n, CHUNK):
            rows = [apps.noop.new({"n": i}) for i in range(start, min(n, start + CHUNK))]
            await app_db.aenqueue_many(rows)
    finally:
        await app_db.aclose()


async def pgqueuer_preload(url: str, n: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        queries = Queries(AsyncpgDriver(connection))
        if await queries.schema_is_installed():
            await queries.uninstall()
        await queries.install()
        for start in range(0, n, CHUNK):
            size = min(n, start + CHUNK) - start
            payloads = [json.dumps({"n": i}).encode() for i in range(start, start + size)]
            await queries.enqueue([apps.PGQUEUER_ENTRYPOINT] * size, payloads, [0] * size)
    finally:
        await connection.close()


async def pgqueuer_uninstall(url: str) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        queries = Queries(AsyncpgDriver(connection))
        if await queries.schema_is_installed():
            await queries.uninstall()
    finally:
        await connection.close()


async def procrastinate_preload(url: str, n: int) -> None:
    import asyncpg

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await connection.execute(f"DROP SCHEMA IF EXISTS {PROCRASTINATE_SCHEMA} CASCADE")
        await connection.execute(f"CREATE SCHEMA {PROCRASTINATE_SCHEMA}")
    finally:
        await connection.close()
    proc = apps.procrastinate_app(procrastinate_dsn(url))
    async with proc.open_async():
        await proc.schema_manager.apply_schema_async()
        task = proc.tasks[apps.PROCRASTINATE_TASK]
        for start in range(0, n, CHUNK):
            await task.batch_defer_async(*({"n": i} for i in range(start, min(n, start + CHUNK))))


async def procrastinate_drop(url: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await connection.execute(f"DROP SCHEMA IF EXISTS {PROCRASTINATE_SCHEMA} CASCADE")
    finally:
        await connection.close()


async def left_over(case: Burn, url: str) -> str | None:
    """What is wrong with the queue after a burn-down, or None when every task ran."""
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            if case.system in ("txtasks", "raw"):
                live = conn.execute(text("SELECT count(*) FROM txtasks_tasks")).scalar_one()
                if live:
                    return f"{live} tasks left in txtasks_tasks"
                if case.system == "txtasks" and case.archive:
                    done = conn.execute(
                        text("SELECT count(*) FROM txtasks_archive WHERE state = 'completed'")
                    ).scalar_one()
                    if done != case.n:
                        return f"{done} completed tasks archived, expected {case.n}"
            elif case.system == "pgqueuer":
                left = conn.execute(text("SELECT count(*) FROM pgqueuer")).scalar_one()
                if left:
                    return f"{left} jobs left in pgqueuer"
            else:
                done = conn.execute(
                    text(
                        f"SELECT count(*) FROM {PROCRASTINATE_SCHEMA}.procrastinate_jobs "
                        "WHERE status = 'succeeded'"
                    )
                ).scalar_one()
                if done != case.n:
                    return f"{done} procrastinate jobs succeeded, expected {case.n}"
    finally:
        engine.dispose()
    return None


# -- cost per task (PostgreSQL) -------------------------------------------------------------------

COST_SQL = """
SELECT xact_commit, tup_inserted + tup_updated + tup_deleted,
       pg_current_wal_lsn() - '0/0'::pg_lsn
  FROM pg_stat_database WHERE datname = current_database()
"""


def pg_counters(url: str) -> tuple[int, int, int]:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            row = conn.execute(text(COST_SQL)).one()
            return int(row[0]), int(row[1]), int(row[2])
    finally:
        engine.dispose()


# -- measuring ------------------------------------------------------------------------------------


@dataclass
class Series:
    """The measured runs of one case."""

    key: str
    label: str
    backend: str
    command: str = ""
    n: int = 0
    rates: list[float] = field(default_factory=list)
    costs: list[tuple[float, float, float]] = field(default_factory=list)
    #: CPU microseconds per task of the worker processes, start-up left out.
    cpus: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


async def burn_once(
    case: Burn,
    url: str,
    starts: FirstStarts,
    log_dir: Path,
    timeout: float,
    wrap: Callable[[int, list[str]], list[str]] | None = None,
) -> tuple[float, tuple[float, float, float] | None, float | None]:
    if case.system == "pgqueuer":
        await pgqueuer_preload(url, case.n)
    elif case.system == "procrastinate":
        await procrastinate_preload(url, case.n)
    else:
        await txtasks_preload(url, case.n)
    before = pg_counters(url) if case.backend == "postgresql" else None
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXTASKS_")}
    env[apps.ENV_REPORT] = f"127.0.0.1:{starts.port}"
    env[apps.ENV_RUN] = starts.new_run()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        argvs = case.argvs(url)
        if wrap is not None:
            argvs = [wrap(i, argv) for i, argv in enumerate(argvs)]
        ended, cpu = await run_processes(argvs, env, log_dir, timeout)
        if not starts.starts:
            raise RuntimeError("no worker reported a first task")
        seconds = ended - min(starts.starts)
        # every process reports its start-up; one that never ran a task was all start-up
        cpu_us = (
            (cpu - sum(starts.startup_cpu)) / case.n * 1e6
            if len(starts.starts) == len(argvs)
            else None
        )
        problem = await left_over(case, url)
        if problem:
            raise RuntimeError(problem)
        cost = None
        if before is not None:
            await asyncio.sleep(1.0)  # backends flush their statistics as they exit
            after = pg_counters(url)
            cost = tuple((a - b) / case.n for a, b in zip(after, before, strict=True))
        return case.n / seconds, cost, cpu_us  # type: ignore[return-value]
    finally:
        if case.system == "pgqueuer":
            await pgqueuer_uninstall(url)
        elif case.system == "procrastinate":
            await procrastinate_drop(url)


@contextlib.asynccontextmanager
async def application(url: str) -> AsyncIterator[tuple[Any, Any, Any]]:
    """An application's own AsyncEngine (SQLite set up as the docs say), an App on the same
    database and its no-op task."""
    engine = create_async_engine(url_async(url))
    if url.startswith("sqlite"):
        sqlite_connection_setup(engine.sync_engine)
    app = type(apps.app)("throughput-enqueue", database_url=url)
    task = app.task(name=apps.TASK, queue=apps.QUEUE)(apps.noop.handler)
    try:
        yield engine, app, task
    finally:
        await engine.dispose()
        await app.aclose()


async def enqueue_single_txtasks(url: str, m: int) -> float:
    """`aenqueue_tx` in an AsyncConnection transaction of the application's own, m times."""
    async with application(url) as (engine, _app, task):
        started = time.perf_counter()
        for i in range(m):
            async with engine.begin() as conn:
                await task.aenqueue_tx(conn, {"n": i})
        return m / (time.perf_counter() - started)


async def enqueue_bulk_txtasks(url: str, n: int) -> float:
    """`aenqueue_many_tx` of CHUNK rows per application transaction, n rows in all."""
    async with application(url) as (engine, app, task):
        started = time.perf_counter()
        for start in range(0, n, CHUNK):
            rows = [task.new({"n": i}) for i in range(start, min(n, start + CHUNK))]
            async with engine.begin() as conn:
                await app.aenqueue_many_tx(conn, rows)
        return n / (time.perf_counter() - started)


async def enqueue_single_raw(url: str, m: int) -> float:
    """asyncpg: BEGIN, one INSERT ... RETURNING id, COMMIT; m times."""
    import asyncpg

    from txtasks.clock import utcnow

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        started = time.perf_counter()
        for i in range(m):
            async with connection.transaction():
                payload = json.dumps({"n": i}).encode()
                await connection.fetchval(RAW_INSERT, apps.QUEUE, apps.TASK, payload, utcnow())
        return m / (time.perf_counter() - started)
    finally:
        await connection.close()


async def enqueue_single_raw_sqlalchemy(url: str, m: int) -> float:
    """The same INSERT written by hand, in the same kind of AsyncConnection transaction."""
    from txtasks.clock import utcnow

    engine = create_async_engine(url_async(url))
    insert = text(
        RAW_INSERT.replace("$1", ":queue").replace("$2", ":name").replace("$3", ":payload")
        .replace("$4", ":now")
    )  # fmt: skip
    try:
        started = time.perf_counter()
        for i in range(m):
            async with engine.begin() as conn:
                payload = json.dumps({"n": i}).encode()
                params = {"queue": apps.QUEUE, "name": apps.TASK, "payload": payload}
                (await conn.execute(insert, {**params, "now": utcnow()})).scalar_one()
        return m / (time.perf_counter() - started)
    finally:
        await engine.dispose()


async def enqueue_bulk_raw(url: str, n: int) -> float:
    """asyncpg `executemany` of CHUNK rows per transaction, n rows in all."""
    import asyncpg

    from txtasks.clock import utcnow

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        started = time.perf_counter()
        for start in range(0, n, CHUNK):
            now = utcnow()
            rows = [
                (apps.QUEUE, apps.TASK, json.dumps({"n": i}).encode(), now)
                for i in range(start, min(n, start + CHUNK))
            ]
            async with connection.transaction():
                await connection.executemany(RAW_INSERT_MANY, rows)
        return n / (time.perf_counter() - started)
    finally:
        await connection.close()


@dataclass
class Enqueue:
    key: str
    backend: str
    label: str
    count: int
    measure: Callable[[str, int], Awaitable[float]]


def enqueue_cases(args: argparse.Namespace, urls: dict[str, str]) -> list[Enqueue]:
    cases: list[Enqueue] = []
    for backend in BACKENDS:
        if backend not in urls:
            continue
        cases.append(
            Enqueue(
                f"{backend}/enqueue/single",
                backend,
                "txtasks: one task per transaction (SQLAlchemy AsyncConnection, aenqueue_tx)",
                args.single,
                enqueue_single_txtasks,
            )
        )
        if backend == "postgresql":
            cases.append(
                Enqueue(
                    "postgresql/enqueue/single-raw-sa",
                    backend,
                    "raw: the INSERT ... RETURNING id by hand, same AsyncConnection transaction",
                    args.single,
                    enqueue_single_raw_sqlalchemy,
                )
            )
            cases.append(
                Enqueue(
                    "postgresql/enqueue/single-raw",
                    backend,
                    "raw: asyncpg, BEGIN + INSERT ... RETURNING id + COMMIT",
                    args.single,
                    enqueue_single_raw,
                )
            )
        cases.append(
            Enqueue(
                f"{backend}/enqueue/bulk",
                backend,
                f"txtasks: bulk, {CHUNK} per transaction (aenqueue_many_tx)",
                args.bulk,
                enqueue_bulk_txtasks,
            )
        )
        if backend == "postgresql":
            cases.append(
                Enqueue(
                    "postgresql/enqueue/bulk-raw",
                    backend,
                    f"raw: asyncpg executemany, {CHUNK} per transaction",
                    args.bulk,
                    enqueue_bulk_raw,
                )
            )
    only = [k for k in (args.only or "").split(",") if k]
    return [c for c in cases if not only or any(o in c.key for o in only)]


# -- report ---------------------------------------------------------------------------------------


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_range(values: Sequence[float]) -> str:
    return f"{fmt_rate(min(values))}-{fmt_rate(max(values))}" if values else "-"


def ratio(series: dict[str, Series], a: str, b: str) -> float | None:
    if a in series and b in series and series[a].rates and series[b].rates:
        return series[a].median / series[b].median
    return None


def report(
    series: dict[str, Series],
    runs: int,
    info: dict[str, str],
    argv: Sequence[str],
    chart: Path | None,
) -> str:
    lines = ["## Burn-down (tasks/s, median of runs)", ""]
    lines += [
        "| backend | system | N | runs | tasks/s median | min-max | worker CPU us/task | commits/task | rows written/task | WAL bytes/task |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in series.values():
        if "/enqueue/" in s.key:
            continue
        if s.error:
            lines.append(f"| {LABELS[s.backend]} | {s.label} | | | failed: {s.error} | | | | | |")
            continue
        cost = ["-", "-", "-"]
        if s.costs:
            cost = [f"{statistics.median(c[i] for c in s.costs):.2f}" for i in range(2)]
            cost.append(f"{statistics.median(c[2] for c in s.costs):,.0f}")
        cpu = f"{statistics.median(s.cpus):.1f}" if s.cpus else "-"
        lines.append(
            f"| {LABELS[s.backend]} | {s.label} | {s.n:,} | {len(s.rates)} | "
            f"{fmt_rate(s.median)} | {fmt_range(s.rates)} | {cpu} | {' | '.join(cost)} |"
        )
    lines += ["", "## Enqueue (tasks/s, median of runs)", ""]
    lines += [
        "| backend | path | tasks per run | tasks/s median | min-max |",
        "|---|---|---:|---:|---:|",
    ]
    for s in series.values():
        if "/enqueue/" not in s.key:
            continue
        value = f"failed: {s.error}" if s.error else fmt_rate(s.median)
        lines.append(
            f"| {LABELS[s.backend]} | {s.label} | {s.n:,} | {value} | {fmt_range(s.rates)} |"
        )
    lines += ["", "## Against the targets (PostgreSQL, ratios of medians in this run)", ""]
    checks = [
        (
            "burn-down, txtasks tuned / PGQueuer tuned",
            "postgresql/txtasks/tuned",
            "postgresql/pgqueuer/tuned",
            2.0,
        ),
        ("burn-down, txtasks tuned / raw limit", "postgresql/txtasks/tuned", "postgresql/raw", 0.5),
        (
            "burn-down, txtasks tuned without archive / raw limit",
            "postgresql/txtasks/tuned-no-archive",
            "postgresql/raw",
            0.5,
        ),
        (
            "burn-down, txtasks defaults / PGQueuer defaults",
            "postgresql/txtasks/defaults",
            "postgresql/pgqueuer/defaults",
            1.0,
        ),
        (
            "enqueue, one per transaction / the same INSERT by hand in the same transaction",
            "postgresql/enqueue/single",
            "postgresql/enqueue/single-raw-sa",
            0.9,
        ),
        (
            "enqueue, one per transaction / raw asyncpg",
            "postgresql/enqueue/single",
            "postgresql/enqueue/single-raw",
            0.9,
        ),
        (
            "enqueue, bulk / raw executemany",
            "postgresql/enqueue/bulk",
            "postgresql/enqueue/bulk-raw",
            1.0,
        ),
    ]
    for what, a, b, target in checks:
        value = ratio(series, a, b)
        if value is None:
            continue
        verdict = "met" if value >= target else "NOT met"
        lines.append(f"- {what}: **{value:.2f}x** (target >= {target:g}x: {verdict})")
    lines += ["", "## Commands", ""]
    for s in series.values():
        if s.command:
            lines.append(f"- {s.label}: `{masked(s.command)}`")
    lines += ["", "## Machine and versions", ""]
    lines += [f"- {line}" for line in machine_info()]
    lines += [f"- {name}: {value}" for name, value in {**versions(), **info}.items()]
    for extra in ("pgqueuer", "procrastinate", "psycopg", "uvloop"):
        version = module_version(extra)
        if version:
            lines.append(f"- {extra}: {version}")
    lines.append(f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    lines.append(
        f"- Command: `{masked(shlex.join(['python', '-m', 'tests.benchmarks.throughput', *argv]))}`"
    )
    if chart is not None:
        lines.append(f"- Chart: `{chart}`")
    return "\n".join(lines) + "\n"


def draw_chart(series: dict[str, Series], path: Path) -> None:
    """Two panels: burn-down and enqueue, medians with min-max whiskers (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    burn = [s for s in series.values() if "/enqueue/" not in s.key and s.rates]
    enq = [s for s in series.values() if "/enqueue/" in s.key and s.rates]
    fig, axes = plt.subplots(
        2,
        1,
        figsize=(10, 0.42 * (len(burn) + len(enq)) + 2.2),
        height_ratios=[len(burn) or 1, len(enq) or 1],
    )
    for ax, group, title in (
        (axes[0], burn, "Burn-down: no-op tasks/s"),
        (axes[1], enq, "Enqueue: tasks/s"),
    ):
        names = [f"{LABELS[s.backend]}: {s.label}" for s in group]
        medians = [s.median for s in group]
        low = [s.median - min(s.rates) for s in group]
        high = [max(s.rates) - s.median for s in group]
        colors = ["#1f77b4" if "txtasks" in s.label else "#999999" for s in group]
        ax.barh(range(len(group)), medians, xerr=[low, high], color=colors, capsize=3)
        ax.set_yticks(range(len(group)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")  # procrastinate and the raw limit are 100x apart
        if medians:
            ax.set_xlim(min(min(s.rates) for s in group) / 2, max(max(s.rates) for s in group) * 3)
        ax.set_title(title + " (log scale)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        for i, value in enumerate(medians):
            ax.text(value, i, f" {value:,.0f}", va="center", fontsize=7)
    fig.suptitle(
        "txtasks throughput (median of runs, min-max whiskers); grey: other systems", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- where the time goes (py-spy) ------------------------------------------------------------------

#: Where a sample of a worker process is counted: the first rule whose frame is on its stack
#: (innermost rules first), else "other".
PROFILE_RULES = [
    ("claim: the UPDATE ... RETURNING round trip and decoding the rows", "task_claim_many"),
    ("outcomes: building and writing the batches", "OutcomeBuffer"),
    ("per task: queuing the claimed row and waking a runner", "Worker._start"),
    ("per task: queuing the claimed row and waking a runner", "Runner.dispatch"),
    ("per task: decoding, context, the handler call, the outcome", "Runner._execute"),
    ("per task: the handler itself (no-op)", "throughput_apps.py"),
    ("event loop: socket I/O and asyncpg's protocol (C code, no Python frames)", "Runner.run"),
    ("event loop: scheduling (asyncio)", "_run_once"),
    ("start-up and shut-down: imports (not timed)", "_find_and_load"),
]


def profile_summary(raw_files: Sequence[Path]) -> str:
    """py-spy raw stacks of the worker processes, summed by PROFILE_RULES, as a table."""
    counts: dict[str, int] = {}
    total = 0
    for path in raw_files:
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            total += int(n)
            frames = stack.split(";")
            where = "other"
            for label, marker in sorted(PROFILE_RULES, key=lambda r: -deepest(frames, r[1])):
                if deepest(frames, marker) >= 0:
                    where = label
                    break
            counts[where] = counts.get(where, 0) + int(n)
    startup = counts.pop(PROFILE_RULES[-1][0], 0)
    timed = max(total - startup, 1)
    lines = ["| where (while running tasks) | share of worker samples |", "|---|---:|"]
    for label, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {label} | {100 * n / timed:.1f}% |")
    return (
        "\n".join(lines)
        + f"\n\n({timed} samples at 250 Hz over {len(raw_files)} processes while running tasks; "
        + f"{startup} more in imports at start-up, before the first task)\n"
    )


def deepest(frames: Sequence[str], marker: str) -> int:
    """The depth of the innermost frame containing `marker`, -1 when none does."""
    for depth in range(len(frames) - 1, -1, -1):
        if marker in frames[depth]:
            return depth
    return -1


async def profile_case(args: argparse.Namespace, urls: dict[str, str]) -> str:
    """One run of the chosen case with every worker process under `py-spy record`."""
    cases = [c for c in burn_cases(args, urls) if c.key == args.profile]
    if not cases:
        keys = ", ".join(c.key for c in burn_cases(args, urls))
        raise SystemExit(f"--profile: no case {args.profile!r}; cases: {keys}")
    case = cases[0]
    log_dir = Path(tempfile.mkdtemp(prefix="txtasks-throughput-profile-"))
    raw = [log_dir / f"py-spy-{i}.txt" for i in range(case.processes)]

    def wrap(i: int, argv: list[str]) -> list[str]:
        return ["py-spy", "record", "-r", "250", "-f", "raw", "-o", str(raw[i]), "--", *argv]

    starts, transport = await open_first_starts()
    try:
        rate, _, _ = await burn_once(case, urls[case.backend], starts, log_dir, args.timeout, wrap)
    finally:
        transport.close()
        tables_drop(urls[case.backend])
    return (
        f"## Where the time goes: {LABELS[case.backend]}, {case.label}, N={case.n:,}\n\n"
        f"{rate:,.0f} tasks/s under the profiler (py-spy slows it down).\n\n"
        + profile_summary(raw)
        + f"\nRaw stacks: {log_dir}\n"
    )


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.throughput",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    servers = parser.add_argument_group("servers")
    servers.add_argument(
        "--start-servers",
        action="store_true",
        help="start private servers (tests/services.sh, PostgreSQL with durable defaults)",
    )
    servers.add_argument(
        "--sqlite",
        nargs="?",
        const="",
        default=None,
        help="also SQLite (a file; default a temporary one)",
    )
    what = parser.add_argument_group("what")
    what.add_argument("--runs", type=int, default=3, help="runs of every case (interleaved)")
    what.add_argument("--tasks", type=int, default=100_000, help="burn-down N on PostgreSQL")
    what.add_argument(
        "--tasks-other", type=int, default=20_000, help="burn-down N on MariaDB and SQLite"
    )
    what.add_argument(
        "--tasks-procrastinate", type=int, default=5_000, help="burn-down N for procrastinate"
    )
    what.add_argument("--tuned-processes", type=int, default=2)
    what.add_argument("--tuned-concurrency", type=int, default=500)
    what.add_argument(
        "--single", type=int, default=2_000, help="tasks enqueued one per transaction"
    )
    what.add_argument("--bulk", type=int, default=100_000, help="tasks enqueued in bulk")
    what.add_argument("--no-peers", action="store_true", help="txtasks only")
    what.add_argument("--no-enqueue", action="store_true", help="burn-downs only")
    what.add_argument(
        "--only", help="comma-separated substrings of case keys, e.g. postgresql/txtasks"
    )
    what.add_argument("--timeout", type=float, default=900.0, help="seconds a burn-down may take")
    what.add_argument(
        "--profile",
        metavar="CASE",
        help="instead: one run of CASE (e.g. postgresql/txtasks/tuned) under py-spy, "
        "and where the worker processes spend their time",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--output", type=Path, help="write the report (markdown) here too")
    out.add_argument("--chart", type=Path, help="draw the chart (PNG) here")
    return parser.parse_args(argv)


async def amain(args: argparse.Namespace, urls: dict[str, str], argv: Sequence[str]) -> str:
    burns = burn_cases(args, urls)
    enqueues = [] if args.no_enqueue else enqueue_cases(args, urls)
    series: dict[str, Series] = {}
    for b in burns:
        series[b.key] = Series(b.key, b.label, b.backend, b.command(urls[b.backend]), b.n)
    for e in enqueues:
        series[e.key] = Series(e.key, e.label, e.backend, n=e.count)
    info: dict[str, str] = {}
    for backend in urls:
        info.update(server_info(urls[backend]))
    starts, transport = await open_first_starts()
    log_dir = Path(tempfile.mkdtemp(prefix="txtasks-throughput-"))
    try:
        for run in range(args.runs):
            for case in burns:
                s = series[case.key]
                if s.error:
                    continue
                log(
                    f"[run {run + 1}/{args.runs}] {LABELS[case.backend]}: {case.label}, N={case.n:,}"
                )
                try:
                    rate, cost, cpu_us = await burn_once(
                        case, urls[case.backend], starts, log_dir, args.timeout
                    )
                except Exception as exc:  # one failed case must not end the others
                    s.error = str(exc).splitlines()[0][:200]
                    log(f"  failed: {exc}")
                    continue
                s.rates.append(rate)
                if cost is not None:
                    s.costs.append(cost)
                if cpu_us is not None:
                    s.cpus.append(cpu_us)
                log(f"  {rate:,.0f} tasks/s")
            for e in enqueues:
                s = series[e.key]
                if s.error:
                    continue
                url = urls[e.backend]
                tables_reset(url)
                log(f"[run {run + 1}/{args.runs}] {LABELS[e.backend]}: {e.label}, {e.count:,}")
                try:
                    rate = await e.measure(url, e.count)
                except Exception as exc:
                    s.error = str(exc).splitlines()[0][:200]
                    log(f"  failed: {exc}")
                    continue
                s.rates.append(rate)
                log(f"  {rate:,.0f} tasks/s")
    finally:
        transport.close()
        for url in urls.values():
            with contextlib.suppress(Exception):
                tables_drop(url)
    if args.chart is not None:
        draw_chart(series, args.chart)
    return report(series, args.runs, info, argv, args.chart)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    servers = Servers()
    lock = DatabaseLock()
    tmp = tempfile.TemporaryDirectory(prefix="txtasks-throughput-sqlite-")
    try:
        urls: dict[str, str] = {}
        if args.start_servers:
            env = servers.start(["pg", "mariadb"])
            urls["postgresql"] = env["PG_DSN"]
            urls["mysql"] = env["MYSQL_DSN"]
        else:
            for backend, var in (
                ("postgresql", "TXTASKS_BENCH_POSTGRES_URL"),
                ("mysql", "TXTASKS_BENCH_MYSQL_URL"),
            ):
                if os.environ.get(var):
                    urls[backend] = os.environ[var]
        if args.sqlite is not None:
            urls["sqlite"] = f"sqlite:///{args.sqlite or Path(tmp.name) / 'bench.sqlite3'}"
        if not urls:
            raise SystemExit("no database: --start-servers, TXTASKS_BENCH_*_URL or --sqlite")
        for url in urls.values():
            lock.acquire(url)
        if args.profile:
            text_report = asyncio.run(profile_case(args, urls))
        else:
            text_report = asyncio.run(amain(args, urls, argv))
    finally:
        lock.release()
        servers.stop()
        tmp.cleanup()
    print(text_report)
    if args.output is not None:
        args.output.write_text(text_report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
