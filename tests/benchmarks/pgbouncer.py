"""Many worker processes through PgBouncer in transaction pooling mode: throughput, commit→start
latency, and nothing lost nor run twice.

`--workers` `txtasks worker` processes (and one `txtasks cleaner`), each with a connection
budget (`--db-connections`), reach PostgreSQL through PgBouncer (`?pooler=transaction`; the
PgBouncer of tests/services.sh keeps 20 server connections per database and user) and are woken
through RabbitMQ. Their handler (tests/benchmarks/pgbouncer_apps.py) writes one row per run in
its transactional completion.

1. Throughput: `--tasks` tasks enqueued in transactions of `--batch`, through PgBouncer too,
   while the workers run; tasks/s = tasks / (last finish - first commit).
2. Latency: `--latency-tasks` tasks, one per transaction, one every `--gap` seconds, to the
   workers idle again; latency = the handler's `time.monotonic()` at its start (a UDP report)
   - the benchmark's as the commit returned.
3. From the database: every task completed once (one archived row each, at attempt 1, one run
   row each), none live, none dead; and the most connections each worker held (the kernel's
   count) and the most server connections PgBouncer opened.

    python -m tests.benchmarks.pgbouncer --help
    python -m tests.benchmarks.pgbouncer --start-servers          # private servers, durable PG
    TXTASKS_BENCH_POSTGRES_URL=postgresql://app:app@127.0.0.1:55432/bench \\
    TXTASKS_BENCH_PGBOUNCER_URL=postgresql://app:app@127.0.0.1:56432/bench \\
    TXTASKS_BENCH_AMQP_URL=amqp://app:app@127.0.0.1:55672/ python -m tests.benchmarks.pgbouncer

The database must be dedicated to benchmarks: txtasks' tables are dropped and made again.
`Crowd` is also what tests/acceptance/test_pgbouncer_workers.py runs (without timing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, func, select, text
from sqlalchemy.engine import make_url

from tests import pace
from tests.benchmarks import pgbouncer_apps
from tests.sockets import tcp_connections
from txtasks import App, create_async_engine, create_engine
from txtasks.schema.migrate import migrate
from txtasks.schema.tables import archive, tasks
from txtasks.schema.tables import metadata as txtasks_metadata

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.benchmarks.pgbouncer_apps:app"
#: The application_name of the harness's own direct connections (not counted as PgBouncer's).
HARNESS = "crowd-harness"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Verdict:
    """What the database says after a run."""

    expected: int
    completed: int = 0
    #: Archived tasks at an attempt above 1: claimed more than once.
    reclaimed: int = 0
    #: Rows of crowd_runs, and the tasks they name.
    runs: int = 0
    run_tasks: int = 0
    live: int = 0
    other_final: int = 0

    @property
    def lost(self) -> int:
        return self.expected - self.completed

    @property
    def twice(self) -> int:
        """Runs beyond one per task, and tasks claimed more than once."""
        return (self.runs - self.run_tasks) + self.reclaimed

    def problems(self, *, runs_expected: int) -> list[str]:
        found = []
        if self.lost or self.live:
            found.append(f"{self.lost} task(s) not completed, {self.live} still live")
        if self.other_final:
            found.append(f"{self.other_final} task(s) finished otherwise than completed")
        if self.twice:
            found.append(f"{self.twice} extra run(s) ({self.reclaimed} claimed twice)")
        if self.runs != runs_expected:
            found.append(f"{self.runs} run rows for {runs_expected} tasks")
        return found


@dataclass
class Sampled:
    """The most connections each process held (the kernel's count), and PgBouncer's server
    connections to the database."""

    per_process: dict[int, int] = field(default_factory=dict)
    server: int = 0


async def _enqueued_only(payload: Any) -> None:
    """The enqueuer's stand-in for `crowd.run` (the workers run the real one)."""


class Crowd:
    """`workers` worker processes and a cleaner on `url` (through PgBouncer), checked on
    `direct_url` (the same database, without PgBouncer)."""

    def __init__(
        self,
        url: str,
        direct_url: str,
        broker_url: str | None,
        directory: Path,
        *,
        workers: int = 50,
        concurrency: int = 10,
        connections: int = 3,
        poll_interval: float = 1.0,
    ) -> None:
        self.url, self.direct_url, self.broker_url = url, direct_url, broker_url
        self.directory = directory
        self.workers, self.concurrency, self.connections = workers, concurrency, connections
        self.poll_interval = poll_interval
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.direct = create_engine(direct_url, connect_args={"application_name": HARNESS})
        self.sampled = Sampled()
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None

    # -- setup ----------------------------------------------------------------------------------

    def prepare(self) -> None:
        """txtasks' tables and crowd_runs, empty."""
        with self.direct.begin() as conn:
            pgbouncer_apps.metadata.drop_all(conn)
            txtasks_metadata.drop_all(conn)
            leftovers = MetaData()
            leftovers.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
            leftovers.drop_all(conn)
        with self.direct.begin() as conn:
            migrate(conn)
            pgbouncer_apps.metadata.create_all(conn)

    def env(self, report: str | None, token: str) -> dict[str, str]:
        env = pace.child_environ()
        env["TXTASKS_DATABASE_URL"] = self.url
        env["TXTASKS_DB_CONNECTIONS"] = str(self.connections)
        if self.broker_url:
            env["TXTASKS_BROKER_URL"] = self.broker_url
        if report:
            env[pgbouncer_apps.REPORT_VAR] = report
            env[pgbouncer_apps.RUN_VAR] = token
        return env

    def start(self, *, report: str | None = None, token: str = "") -> None:
        """The workers and the cleaner, in processes of their own."""
        env = self.env(report, token)
        worker = [
            *("worker", APP_SPEC, "-c", str(self.concurrency)),
            *("--poll-interval", str(self.poll_interval), "--shutdown-grace", "10"),
        ]
        commands = [worker] * self.workers + [["cleaner", APP_SPEC]]
        for n, args in enumerate(commands):
            path = self.directory / f"crowd{n}.log"
            with path.open("wb") as out:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "txtasks", *args],
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.procs.append(popen)
            self.logs.append(path)
        self._sampler = threading.Thread(target=self._sample, name="crowd-sampler", daemon=True)
        self._sampler.start()

    def wait_serving(self, timeout: float) -> float:
        """Seconds until every worker serves its queue; raises if one exits or the time runs
        out."""
        started = time.monotonic()
        waiting = set(range(self.workers))
        while waiting:
            for n in list(waiting):
                if self.procs[n].poll() is not None:
                    raise RuntimeError(f"worker {n} exited:\n{self.tail(n)}")
                if f"serving {pgbouncer_apps.QUEUE}" in self.logs[n].read_text(errors="replace"):
                    waiting.discard(n)
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{len(waiting)} worker(s) not serving after {timeout:g}s")
            time.sleep(0.1)
        return time.monotonic() - started

    def tail(self, n: int, lines: int = 20) -> str:
        return "\n".join(self.logs[n].read_text(errors="replace").splitlines()[-lines:])

    def _sample(self) -> None:
        """Every half second: each process's connections to PgBouncer, PgBouncer's server
        connections to the database."""
        port = make_url(self.url).port or 5432
        count = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND application_name <> :harness"
        )
        with self.direct.connect() as conn:
            while not self._done.wait(0.5):
                for popen in self.procs:
                    held = tcp_connections(popen.pid, port)
                    seen = self.sampled.per_process.get(popen.pid, 0)
                    self.sampled.per_process[popen.pid] = max(seen, held)
                server = int(conn.execute(count, {"harness": HARNESS}).scalar_one())
                conn.rollback()
                self.sampled.server = max(self.sampled.server, server)

    # -- enqueue --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _enqueuer(self) -> Any:
        """An App with the broker (wake-ups after commit) and an engine of the application's
        own through PgBouncer (`txtasks.create_async_engine` with the URL's pooler)."""
        app = App("crowd-enqueuer", database_url=self.url, broker_url=self.broker_url)
        app.register(_enqueued_only, name="crowd.run", queue=pgbouncer_apps.QUEUE)
        engine = create_async_engine(self.url)
        try:
            yield app, engine
        finally:
            await engine.dispose()
            await app.aclose()

    async def enqueue_bulk(self, count: int, batch: int, *, tx: bool = True) -> datetime:
        """`count` tasks in transactions of `batch`; the UTC time of the first commit."""
        first: datetime | None = None
        async with self._enqueuer() as (app, engine):
            for start in range(0, count, batch):
                rows = [
                    app.new_task("crowd.run", {"n": n, "tx": tx})
                    for n in range(start, min(count, start + batch))
                ]
                async with engine.begin() as conn:
                    await app.aenqueue_many_tx(conn, rows)
                first = first or datetime.now(timezone.utc).replace(tzinfo=None)
        assert first is not None
        return first

    async def enqueue_paced(
        self, count: int, gap: float, reports: Reports, *, tx: bool = True
    ) -> list[float]:
        """`count` tasks, one per transaction, one every `gap` seconds; the commit→start
        latency of each, in milliseconds."""
        latencies: list[float] = []
        async with self._enqueuer() as (app, engine):
            for n in range(count):
                async with engine.connect() as conn:
                    async with conn.begin():
                        [task_id] = await app.aenqueue_many_tx(
                            conn, [app.new_task("crowd.run", {"n": n, "tx": tx})]
                        )
                    committed = time.monotonic()
                started = await asyncio.wait_for(reports.expect(task_id), 30)
                latencies.append((started - committed) * 1000)
                await asyncio.sleep(gap)
        return latencies

    # -- the end --------------------------------------------------------------------------------

    def wait_finished(self, count: int, timeout: float) -> None:
        """Until `count` tasks are archived; raises if a process exits or time runs out."""
        started = time.monotonic()
        query = select(func.count()).select_from(archive)
        while True:
            with self.direct.connect() as conn:
                done = int(conn.execute(query).scalar_one())
            if done >= count:
                return
            for n, popen in enumerate(self.procs):
                if popen.poll() is not None:
                    raise RuntimeError(f"process {n} exited:\n{self.tail(n)}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{done} of {count} tasks finished after {timeout:g}s")
            time.sleep(0.25)

    def finished_at(self) -> datetime:
        with self.direct.connect() as conn:
            return conn.execute(select(func.max(archive.c.finished_at))).scalar_one()  # type: ignore[no-any-return]

    def stop(self, timeout: float = 30.0) -> list[int]:
        """SIGTERM to every process, then wait; kill what is left. Their exit codes."""
        self._done.set()
        if self._sampler is not None:
            self._sampler.join(5)
        for popen in self.procs:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = []
        for popen in self.procs:
            try:
                codes.append(popen.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(-9)
        self.kill()
        return codes

    def kill(self) -> None:
        self._done.set()
        for popen in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)

    def verdict(self, expected: int) -> Verdict:
        runs = pgbouncer_apps.runs
        with self.direct.connect() as conn:
            found = Verdict(expected)
            by_state = dict(
                conn.execute(select(archive.c.state, func.count()).group_by(archive.c.state)).all()
            )
            found.completed = int(by_state.pop("completed", 0))
            found.other_final = sum(by_state.values())
            again = select(func.count()).select_from(archive).where(archive.c.attempt > 1)
            found.reclaimed = int(conn.execute(again).scalar_one())
            found.runs = int(conn.execute(select(func.count()).select_from(runs)).scalar_one())
            distinct = select(func.count(runs.c.task_id.distinct()))
            found.run_tasks = int(conn.execute(distinct).scalar_one())
            found.live = int(conn.execute(select(func.count()).select_from(tasks)).scalar_one())
        return found

    def close(self) -> None:
        self.kill()
        self.direct.dispose()


class Reports(asyncio.DatagramProtocol):
    """The handlers' UDP reports: task id -> its `time.monotonic()` at start."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.waiting: dict[int, asyncio.Future[float]] = {}
        self.early: dict[int, float] = {}

    def expect(self, task_id: int) -> asyncio.Future[float]:
        future = asyncio.get_running_loop().create_future()
        if task_id in self.early:
            future.set_result(self.early.pop(task_id))
        else:
            self.waiting[task_id] = future
        return future

    def datagram_received(self, data: bytes, addr: Any) -> None:
        token, task_id, started = data.decode().split()
        if token != self.token:
            return
        future = self.waiting.pop(int(task_id), None)
        if future is None:
            self.early[int(task_id)] = float(started)
        elif not future.done():
            future.set_result(float(started))


# -- servers and the report --------------------------------------------------------------------


@contextlib.contextmanager
def private_servers() -> Iterator[dict[str, str]]:
    """PostgreSQL (durable settings), PgBouncer and RabbitMQ from tests/services.sh."""
    import socket

    def free(n: int = 1) -> int:
        for _ in range(200):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port + n < 65000:
                return int(port)
        raise RuntimeError("no free port")

    base = Path(tempfile.mkdtemp(prefix="txtasks-pgbouncer-", dir="/tmp"))
    env = {
        **os.environ,
        "SERVICES": "pg pgbouncer rabbitmq",
        "PG_PORT": str(free()),
        "PGB_PORT": str(free()),
        "RMQ_PORT": str(free(3)),
        "PG_FAST": "0",
        "SVC_DB": "bench",
    }
    script = str(REPO / "tests" / "services.sh")
    log(f"starting pg, pgbouncer and rabbitmq in {base} (tests/services.sh, PG_FAST=0)")
    try:
        subprocess.run(["bash", script, "start", str(base)], env=env, check=True, stdout=sys.stderr)
        values = dict(
            line.split("=", 1) for line in (base / "services.env").read_text().splitlines()
        )
        yield values
    finally:
        subprocess.run(["bash", script, "stop", str(base)], check=False, stdout=sys.stderr)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, Python {platform.python_version()}"


def pgbouncer_version() -> str:
    try:
        out = subprocess.run(
            ["pgbouncer", "--version"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "?"
    return out.stdout.splitlines()[0] if out.stdout else "?"


async def bench(args: argparse.Namespace, urls: dict[str, str]) -> int:
    pooled = urls["pgbouncer"]
    if "pooler=" not in pooled:
        pooled += ("&" if "?" in pooled else "?") + "pooler=transaction"
    if args.direct:  # the reference: the same, straight to PostgreSQL
        pooled = urls["postgresql"]
    directory = Path(tempfile.mkdtemp(prefix="txtasks-crowd-"))
    crowd = Crowd(
        pooled,
        urls["postgresql"],
        urls.get("amqp"),
        directory,
        workers=args.workers,
        concurrency=args.concurrency,
        connections=args.db_connections,
        poll_interval=args.poll_interval,
    )
    token = uuid.uuid4().hex[:8]
    loop = asyncio.get_running_loop()
    transport, reports = await loop.create_datagram_endpoint(
        lambda: Reports(token), local_addr=("127.0.0.1", 0)
    )
    port = transport.get_extra_info("sockname")[1]
    tx = not args.no_tx
    try:
        crowd.prepare()
        crowd.start(report=f"127.0.0.1:{port}", token=token)
        ready = await asyncio.to_thread(crowd.wait_serving, 180)
        log(f"{args.workers} workers serving after {ready:.1f}s")
        first = await crowd.enqueue_bulk(args.tasks, args.batch, tx=tx)
        await asyncio.to_thread(crowd.wait_finished, args.tasks, args.timeout)
        last = crowd.finished_at()
        seconds = (last - first).total_seconds()
        log(f"throughput: {args.tasks} tasks in {seconds:.2f}s")
        await asyncio.sleep(2)  # the workers idle again: waiting for wake-ups
        latencies = await crowd.enqueue_paced(args.latency_tasks, args.gap, reports, tx=tx)
        total = args.tasks + args.latency_tasks
        await asyncio.to_thread(crowd.wait_finished, total, args.timeout)
        codes = crowd.stop()
        verdict = crowd.verdict(total)
    finally:
        transport.close()
        crowd.close()
    held = max(crowd.sampled.per_process.values(), default=0)
    problems = verdict.problems(runs_expected=total if tx else 0)
    p = {q: percentile(latencies, q) for q in (0.5, 0.9, 0.99)}
    lines = [
        f"machine: {machine()}; "
        + ("no PgBouncer" if args.direct else f"{pgbouncer_version()}, pool_mode=transaction"),
        "command: python -m tests.benchmarks.pgbouncer " + " ".join(sys.argv[1:]),
        f"workers: {args.workers} x concurrency {args.concurrency}, --db-connections "
        f"{args.db_connections}, handler {'with' if tx else 'without'} its own transaction",
        f"throughput: {args.tasks} tasks in {seconds:.2f}s = {args.tasks / seconds:,.0f} tasks/s",
        f"commit->start latency ({len(latencies)} tasks, one per {args.gap * 1000:g} ms): "
        f"p50 {p[0.5]:.2f} ms, p90 {p[0.9]:.2f} ms, p99 {p[0.99]:.2f} ms, "
        f"max {max(latencies):.2f} ms, mean {statistics.fmean(latencies):.2f} ms",
        f"completed {verdict.completed} of {total}, lost {verdict.lost}, run twice "
        f"{verdict.twice}, live {verdict.live}",
        f"connections: at most {held} per process; at most {crowd.sampled.server} server "
        "connections to the database",
        f"exit codes after SIGTERM: {sorted(set(codes))}",
    ]
    print("\n".join(lines))
    if problems:
        log("PROBLEMS: " + "; ".join(problems))
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--start-servers", action="store_true", help="private servers")
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--db-connections", type=int, default=3)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--latency-tasks", type=int, default=1000)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between paced tasks")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--no-tx", action="store_true", help="handlers write nothing")
    parser.add_argument(
        "--direct", action="store_true", help="the reference: workers straight to PostgreSQL"
    )
    args = parser.parse_args()
    if args.start_servers:
        with private_servers() as env:
            urls = {
                "postgresql": env["PG_DSN"],
                "pgbouncer": env["PGB_DSN"],
                "amqp": env["AMQP_URL"],
            }
            return asyncio.run(bench(args, urls))
    urls = {
        "postgresql": os.environ.get("TXTASKS_BENCH_POSTGRES_URL", ""),
        "pgbouncer": os.environ.get("TXTASKS_BENCH_PGBOUNCER_URL", ""),
        "amqp": os.environ.get("TXTASKS_BENCH_AMQP_URL", ""),
    }
    if not urls["postgresql"] or not urls["pgbouncer"]:
        parser.error("--start-servers, or TXTASKS_BENCH_POSTGRES_URL and _PGBOUNCER_URL")
    return asyncio.run(bench(args, urls))


if __name__ == "__main__":
    sys.exit(main())
