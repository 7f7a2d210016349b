"""Throughput of txtasks beside PGQueuer, procrastinate and the raw SQL limit, in one run.

    python -m tests.benchmarks.throughput --help
    python -m tests.benchmarks.throughput --start-servers --sqlite --output throughput.md \\
        --chart docs/images/throughput.png

1. Burn-down: N no-op tasks preloaded, workers started (each in its own process), tasks/s from
   the first handler start to the exit of the last worker (every system stops by itself once
   its queue is empty; the exit includes writing the last outcomes). The raw SQL limit is the
   claim and delete loop written by hand on each backend (`throughput_apps.py`).
2. Enqueue: one task per transaction through SQLAlchemy (the application's path), and bulk;
   against the same inserts written by hand (`throughput_enqueue.py`).
3. Cost per task on PostgreSQL: commits, rows written and WAL bytes (`pg_stat_database`,
   `pg_current_wal_lsn`) over each burn-down, divided by N; CPU per task of the workers and of
   the database server (`server_cpu.py`) on every backend.

The report (`throughput_report.py`) ends with the issue's targets, each a ratio with yes/NO.
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
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from tests import pace
from tests.benchmarks import throughput_apps as apps
from tests.benchmarks.latency import (
    REPO,
    DatabaseLock,
    Servers,
    asyncpg_dsn,
    log,
    server_info,
    tables_drop,
    tables_reset,
)
from tests.benchmarks.server_cpu import Meter, server_pid, tree_seconds
from tests.benchmarks.throughput_enqueue import CHUNK, enqueue_cases
from tests.benchmarks.throughput_report import (
    BACKENDS,
    LABELS,
    Series,
    draw_chart,
    module_version,
    report,
)
from txtasks.driver.urls import url_sync

PROCRASTINATE_SCHEMA = "procrastinate_bench"


# -- worker processes -----------------------------------------------------------------------------


class FirstStarts(asyncio.DatagramProtocol):
    """Collects the `run first-start` datagrams of the current run's worker processes."""

    def __init__(self) -> None:
        self.run = ""
        self.starts: list[float] = []
        #: CPU seconds each process had used by its first task (start-up, imports).
        self.startup_cpu: list[float] = []
        self.port = 0
        #: Called when the run's first datagram comes (the burn-down's start).
        self.on_first: Callable[[], None] | None = None

    def new_run(self, on_first: Callable[[], None] | None = None) -> str:
        self.run = uuid.uuid4().hex[:12]
        self.starts = []
        self.startup_cpu = []
        self.on_first = on_first
        return self.run

    def datagram_received(self, data: bytes, addr: Any) -> None:
        run, *values = data.decode(errors="replace").split(" ")
        if run == self.run:
            with contextlib.suppress(ValueError, IndexError):
                started, cpu = float(values[0]), float(values[1])
                if not self.starts and self.on_first is not None:
                    self.on_first()
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
            elif self.system == "raw" and self.backend != "postgresql":
                dsn = url
            argv = [sys.executable, "-m", "tests.benchmarks.throughput_apps", self.system]
            argv += ["--dsn", dsn, *self.options]
        return [argv] * self.processes

    def command(self, url: str) -> str:
        argv = self.argvs(url)[0]
        shown = ["python", *argv[1:]]
        return (f"{self.processes} x " if self.processes > 1 else "") + shlex.join(shown)


#: The raw loops' shape on each backend (processes, claimers per process, rows per claim): the
#: fastest measured on the 2-core machine of docs/benchmarks.md (`--raw-shape` to try others).
RAW_SHAPES = {"postgresql": (1, 4, 500), "mysql": (1, 4, 500), "sqlite": (1, 1, 500)}
RAW_DRIVERS = {"postgresql": "asyncpg", "mysql": "aiomysql", "sqlite": "sqlite3"}


def raw_shape(text: str) -> tuple[int, int, int]:
    """`PxCxB` (processes x claimers x batch) as three numbers."""
    processes, claimers, batch = (int(part) for part in text.lower().split("x"))
    if min(processes, claimers, batch) < 1:
        raise ValueError(f"not a raw shape: {text!r}")
    return processes, claimers, batch


def raw_case(args: argparse.Namespace, backend: str, n: int) -> Burn:
    """The raw SQL limit on `backend`: the claim and delete loop written by hand."""
    processes, claimers, batch = (
        raw_shape(args.raw_shape) if args.raw_shape else RAW_SHAPES[backend]
    )
    shape = f"{claimers} claimers x {batch}" if backend != "sqlite" else f"batch {batch}"
    if processes > 1:
        shape = f"{processes} processes x {shape}"
    return Burn(
        f"{backend}/raw",
        "raw",
        backend,
        f"raw SQL limit ({RAW_DRIVERS[backend]}, {shape}, no archive)",
        n,
        processes,
        ["--claimers", str(claimers), "--batch", str(batch)],
    )


def procrastinate_dsn(url: str) -> str:
    """A libpq conninfo whose sessions use procrastinate's own schema."""
    base = asyncpg_dsn(url)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{PROCRASTINATE_SCHEMA}"


def peer_cases(args: argparse.Namespace) -> list[Burn]:
    """PGQueuer and procrastinate on PostgreSQL, those importable."""
    cases: list[Burn] = []
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
    return cases


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
        if backend == "postgresql" and not args.no_peers:
            cases += peer_cases(args)
        cases.append(raw_case(args, backend, n))
    only = [k for k in (args.only or "").split(",") if k]
    return [c for c in cases if not only or any(o in c.key for o in only)]


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
class BurnResult:
    """One burn-down: tasks/s, the cost per task (PostgreSQL: commits, rows written, WAL
    bytes), the CPU microseconds per task of the worker processes and of the server."""

    rate: float
    cost: tuple[float, float, float] | None = None
    cpu_us: float | None = None
    server_us: float | None = None


#: Seconds for the server to end the sessions of the exited workers before its CPU is read.
SERVER_SETTLE = 0.3


async def burn_once(
    case: Burn,
    url: str,
    starts: FirstStarts,
    log_dir: Path,
    timeout: float,
    wrap: Callable[[int, list[str]], list[str]] | None = None,
    server: int | None = None,
) -> BurnResult:
    """Preload, run the workers, check that every task ran; `server`: the pid of the
    server's main process (its CPU is read at the first handler start and after the end)."""
    if case.system == "pgqueuer":
        await pgqueuer_preload(url, case.n)
    elif case.system == "procrastinate":
        await procrastinate_preload(url, case.n)
    else:
        await txtasks_preload(url, case.n)
    before = pg_counters(url) if case.backend == "postgresql" else None
    env = pace.child_environ()
    env[apps.ENV_REPORT] = f"127.0.0.1:{starts.port}"
    server_start: list[float] = []

    def server_read() -> None:
        if server is not None:
            with contextlib.suppress(OSError):
                server_start.append(tree_seconds(server))

    env[apps.ENV_RUN] = starts.new_run(server_read)
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
        result = BurnResult(case.n / seconds, cpu_us=cpu_us)
        if server is not None and server_start:
            await asyncio.sleep(SERVER_SETTLE)
            result.server_us = (tree_seconds(server) - server_start[0]) / case.n * 1e6
        problem = await left_over(case, url)
        if problem:
            raise RuntimeError(problem)
        if before is not None:
            await asyncio.sleep(1.0)  # backends flush their statistics as they exit
            after = pg_counters(url)
            a, b, c = ((x - y) / case.n for x, y in zip(after, before, strict=True))
            result.cost = (a, b, c)
        return result
    finally:
        if case.system == "pgqueuer":
            await pgqueuer_uninstall(url)
        elif case.system == "procrastinate":
            await procrastinate_drop(url)


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
        result = await burn_once(case, urls[case.backend], starts, log_dir, args.timeout, wrap)
    finally:
        transport.close()
        tables_drop(urls[case.backend])
    return (
        f"## Where the time goes: {LABELS[case.backend]}, {case.label}, N={case.n:,}\n\n"
        f"{result.rate:,.0f} tasks/s under the profiler (py-spy slows it down).\n\n"
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
    what.add_argument(
        "--raw-shape",
        metavar="PxCxB",
        help="the raw loops' processes x claimers x rows per claim, on every backend "
        "(default: the fastest measured, per backend: "
        + ", ".join(f"{b} {'x'.join(map(str, v))}" for b, v in RAW_SHAPES.items())
        + ")",
    )
    what.add_argument("--no-peers", action="store_true", help="txtasks and the raw limit only")
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
    servers.add_argument(
        "--services-base",
        type=Path,
        default=os.environ.get("SVC_BASE") or None,
        help="the tests/services.sh base directory of the servers, whose pid files name the "
        "server processes for their CPU per task (default $SVC_BASE; without it, the process "
        "listening on the URL's port)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--output", type=Path, help="write the report (markdown) here too")
    out.add_argument("--chart", type=Path, help="draw the chart (PNG) here")
    return parser.parse_args(argv)


def server_pids(urls: dict[str, str], services_base: Path | None) -> dict[str, int]:
    """The main process of each database server on this machine, for its CPU per task."""
    pids: dict[str, int] = {}
    for backend, url in urls.items():
        if backend == "sqlite":
            continue  # in the worker's own process
        pid = server_pid(backend, url, services_base)
        if pid is None:
            log(f"{LABELS[backend]}: no server process found on this machine, no server CPU")
        else:
            pids[backend] = pid
    return pids


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
    pids = server_pids(urls, args.services_base)
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
                    result = await burn_once(
                        case,
                        urls[case.backend],
                        starts,
                        log_dir,
                        args.timeout,
                        server=pids.get(case.backend),
                    )
                except Exception as exc:  # one failed case must not end the others
                    s.error = str(exc).splitlines()[0][:200]
                    log(f"  failed: {exc}")
                    continue
                s.add(result.rate, result.cpu_us, result.server_us, result.cost)
                log(f"  {result.rate:,.0f} tasks/s")
            for e in enqueues:
                s = series[e.key]
                if s.error:
                    continue
                url = urls[e.backend]
                tables_reset(url)
                log(f"[run {run + 1}/{args.runs}] {LABELS[e.backend]}: {e.label}, {e.count:,}")
                meter = Meter(pids.get(e.backend))
                try:
                    await e.measure(url, e.count, meter)
                except Exception as exc:
                    s.error = str(exc).splitlines()[0][:200]
                    log(f"  failed: {exc}")
                    continue
                server_us = None if meter.server_cpu is None else meter.server_cpu / e.count * 1e6
                s.add(e.count / meter.seconds, meter.cpu / e.count * 1e6, server_us)
                log(f"  {e.count / meter.seconds:,.0f} tasks/s")
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
            args.services_base = servers.base
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
