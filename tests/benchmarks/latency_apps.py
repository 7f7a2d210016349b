"""What the latency benchmark's worker processes import.

- `app`: a txtasks App with two no-op tasks on the queue `latency-bench`, one async
  (`latency.noop`) and one sync (`latency.noop_sync`, run in the worker's thread pool).
  Run it with `python -m txtasks worker tests.benchmarks.latency_apps:app ...`.
- `pgqueuer_factory`: a PGQueuer QueueManager with a no-op entrypoint `latency_noop`. Run it
  with `python -m tests.benchmarks.latency_apps pgqueuer`: what `pgq run` does (PGQueuer's
  supervisor `pgqueuer.run`, on uvloop when it is installed), without `pgq`'s command line,
  whose `--log-level` handling fails with PGQueuer 1.6.0 and typer 0.29.

Every handler reads `time.monotonic()` first thing and sends it, with the task id, as one UDP
datagram to the benchmark process. CLOCK_MONOTONIC is one clock for the whole machine on Linux,
so the benchmark subtracts its own commit time from it directly.

The worker side is configured by environment variables the benchmark sets:

- `TXTASKS_BENCH_REPORT`: `host:port` to send reports to (no reports without it).
- `TXTASKS_BENCH_RUN`: a token copied into every report, so a late report from an earlier
  worker is never taken for one of this run.
- `TXTASKS_BENCH_PROFILE=1`: also record, per task, when the RabbitMQ wake-up reached the
  worker, and the timeline of the claim that returned the task (PostgreSQL: pool pre-ping,
  BEGIN, the UPDATE ... RETURNING, COMMIT). This patches txtasks classes in the worker process
  only; the library itself is unchanged.
- `TXTASKS_BENCH_PGQUEUER_DSN`: the PostgreSQL DSN of the PGQueuer worker.
- `TXTASKS_BENCH_UVLOOP=1`: run the bare design's worker on uvloop (the txtasks worker gets
  `--loop`), so that both run on the same event loop.
- `TXTASKS_BENCH_BARE_URL`, `TXTASKS_BENCH_BARE_AMQP`: the database and broker of the bare
  design's worker (`python -m tests.benchmarks.latency_apps bare`).

The bare design is the floor the wake-up path is measured against: the enqueuer INSERTs the row
by hand, commits and publishes a message of the task id's digits to a queue of its own (no
exchange, no JSON); the worker consumes it (no ack) and claims that row by its primary key with
one statement on one connection kept open (PostgreSQL: `UPDATE ... RETURNING`, with
`synchronous_commit = off` as txtasks' claims; MariaDB: the `UPDATE` and a `SELECT` of the
payload; SQLite: `UPDATE ... RETURNING` with the sqlite3 module, on the event loop), then reports
the start. No leases, retries, keys, pauses or bounds: only what any design must do.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from txtasks import App

QUEUE = "latency-bench"
ASYNC_TASK = "latency.noop"
SYNC_TASK = "latency.noop_sync"
PGQUEUER_ENTRYPOINT = "latency_noop"
#: PGQueuer objects (tables, function, NOTIFY channel) get this prefix, in both processes, so
#: the benchmark never touches another PGQueuer installation in the same database.
PGQUEUER_PREFIX = "latency_bench_"

ENV_REPORT = "TXTASKS_BENCH_REPORT"
ENV_RUN = "TXTASKS_BENCH_RUN"
ENV_PROFILE = "TXTASKS_BENCH_PROFILE"
ENV_PGQUEUER_DSN = "TXTASKS_BENCH_PGQUEUER_DSN"
ENV_UVLOOP = "TXTASKS_BENCH_UVLOOP"
ENV_BARE_URL = "TXTASKS_BENCH_BARE_URL"
ENV_BARE_AMQP = "TXTASKS_BENCH_BARE_AMQP"
#: The bare design's AMQP queue (the default exchange routes to it by name).
BARE_QUEUE = "txtasks-latency-bare"


class Reporter:
    """Sends `run task_id start [json]` datagrams; a send costs one non-blocking syscall."""

    def __init__(self) -> None:
        self.run = os.environ.get(ENV_RUN, "-")
        self.address: tuple[str, int] | None = None
        spec = os.environ.get(ENV_REPORT)
        if spec:
            host, _, port = spec.rpartition(":")
            self.address = (host, int(port))
        self._socket: socket.socket | None = None

    def send(self, task_id: int, started: float, extra: dict[str, Any] | None = None) -> None:
        if self.address is None:
            return
        if self._socket is None:
            self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        text = f"{self.run} {task_id} {started!r}"
        if extra:
            text += " " + json.dumps(extra, separators=(",", ":"))
        # a full socket buffer loses this report; the benchmark counts it as a timeout
        with contextlib.suppress(OSError):
            self._socket.sendto(text.encode(), self.address)


reporter = Reporter()


# -- the txtasks application ------------------------------------------------------------------

app = App("txtasks-latency-bench", default_queue=QUEUE)


@app.task(name=ASYNC_TASK, max_attempts=1)
async def noop(payload: Any, ctx: Any) -> None:
    started = time.monotonic()
    reporter.send(ctx.task_id, started, profile.pop(ctx.task_id))


@app.task(name=SYNC_TASK, max_attempts=1)
def noop_sync(payload: Any, ctx: Any) -> None:
    started = time.monotonic()
    reporter.send(ctx.task_id, started, profile.pop(ctx.task_id))


LOAD_TASK = "latency.load"
#: Seconds between two batches of the load (`load_main`).
LOAD_EVERY = 0.01


@app.task(name=LOAD_TASK, max_attempts=1)
async def load(payload: Any) -> None:
    """The steady load beside the measured tasks: a no-op that reports nothing."""


async def load_main(url: str, amqp_url: str, rate: float) -> None:
    """Enqueue `rate` tasks per second of `LOAD_TASK` on the benchmark's queue, one batch per
    `LOAD_EVERY` seconds, each batch one transaction of the application's own (its wake-up
    published after commit), until SIGTERM; then print how many it enqueued."""
    import asyncio
    import signal

    from sqlalchemy.ext.asyncio import create_async_engine

    from txtasks.driver.urls import url_async
    from txtasks.wakeup import notifier_for_url

    app.use_notifier(notifier_for_url(amqp_url))
    engine = create_async_engine(url_async(url))
    task = app.get_task(LOAD_TASK)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    started = loop.time()
    sent = 0
    while not stop.is_set():
        due = int(rate * (loop.time() - started)) - sent  # steady on average, whatever the lag
        if due > 0:
            async with engine.begin() as conn:
                await app.aenqueue_many_tx(conn, [task.new(None) for _ in range(due)])
            sent += due
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), LOAD_EVERY)
    elapsed = loop.time() - started
    print(f"load: {sent} tasks in {elapsed:.1f} s ({sent / elapsed:.0f}/s)", flush=True)
    await app.aclose()
    await engine.dispose()


# -- the PGQueuer reference -------------------------------------------------------------------


def pgqueuer_env() -> None:
    """Name PGQueuer's objects with our prefix (call before PGQueuer reads its settings)."""
    os.environ["PGQUEUER_PREFIX"] = PGQUEUER_PREFIX
    with contextlib.suppress(ImportError):
        from pgqueuer.domain.settings import db_settings

        db_settings.cache_clear()


@contextlib.asynccontextmanager
async def pgqueuer_factory() -> AsyncIterator[Any]:
    """A QueueManager on one asyncpg connection, as in PGQueuer's own examples."""
    pgqueuer_env()
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(os.environ[ENV_PGQUEUER_DSN])
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(PGQUEUER_ENTRYPOINT)
        async def latency_noop(job: Job) -> None:
            started = time.monotonic()
            reporter.send(int(job.id), started)

        yield manager
    finally:
        await connection.close()


# -- the bare design ---------------------------------------------------------------------------

#: The bare claim: that row, if it is still ready, now processing; what its handler needs.
BARE_CLAIM = {
    "postgresql": (
        "UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1, "
        "lease_expires_at = $2, worker_id = 'bare', started_at = $3 "
        "WHERE id = $1 AND state IN ('pending', 'retryable') RETURNING id, payload"
    ),
    "mysql": (
        "UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1, "
        "lease_expires_at = %s, worker_id = 'bare', started_at = %s "
        "WHERE id = %s AND state IN ('pending', 'retryable')"
    ),
    "sqlite": (
        "UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1, "
        "lease_expires_at = ?, worker_id = 'bare', started_at = ? "
        "WHERE id = ? AND state IN ('pending', 'retryable') RETURNING id, payload"
    ),
}
BARE_PAYLOAD_MYSQL = "SELECT payload FROM txtasks_tasks WHERE id = %s"


async def bare_claimer(url: str) -> Any:
    """`claim(task_id) -> bool` on one connection of the bare design's database."""
    from datetime import timedelta

    from sqlalchemy.engine import make_url

    from txtasks.clock import utcnow

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    sql = BARE_CLAIM["mysql" if backend in ("mysql", "mariadb") else backend]
    if backend == "postgresql":
        import asyncpg

        dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        pg = await asyncpg.connect(dsn, server_settings={"synchronous_commit": "off"})

        async def claim_pg(task_id: int) -> bool:
            now = utcnow()
            return bool(await pg.fetch(sql, task_id, now + timedelta(seconds=60), now))

        return claim_pg
    if backend == "sqlite":
        import sqlite3

        lite = sqlite3.connect(parsed.database or "", isolation_level=None)
        lite.execute("PRAGMA busy_timeout = 5000")
        lite.execute("PRAGMA synchronous = NORMAL")

        async def claim_sqlite(task_id: int) -> bool:
            now = utcnow().isoformat(" ")
            later = (utcnow() + timedelta(seconds=60)).isoformat(" ")
            return bool(lite.execute(sql, (later, now, task_id)).fetchall())

        return claim_sqlite
    import aiomysql

    my = await aiomysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        db=parsed.database,
        autocommit=True,
    )

    async def claim_mysql(task_id: int) -> bool:
        now = utcnow()
        async with my.cursor() as cursor:
            if not await cursor.execute(sql, (now + timedelta(seconds=60), now, task_id)):
                return False
            await cursor.execute(BARE_PAYLOAD_MYSQL, (task_id,))
            return bool(await cursor.fetchall())

    return claim_mysql


async def bare_worker() -> None:
    """Consume the bare queue; claim each message's task by id; report its start."""
    import asyncio
    import signal

    import aio_pika

    claim = await bare_claimer(os.environ[ENV_BARE_URL])
    connection = await aio_pika.connect(os.environ[ENV_BARE_AMQP])
    channel = await connection.channel()
    queue = await channel.declare_queue(BARE_QUEUE, auto_delete=False)

    async def on_message(message: Any) -> None:
        woken = time.monotonic()
        task_id = int(message.body)
        if await claim(task_id):
            reporter.send(task_id, time.monotonic(), {"wakeup": woken})

    await queue.consume(on_message, no_ack=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await connection.close()


# -- profiling (TXTASKS_BENCH_PROFILE=1, worker process only) ----------------------------------


@dataclass
class ClaimTrace:
    """Monotonic timestamps along one claim, in the order they happen."""

    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        """The first `*_start` and the last of any other mark count (a claim may repeat one)."""
        if name.endswith("_start"):
            self.marks.setdefault(name, time.monotonic())
        else:
            self.marks[name] = time.monotonic()


_claim: contextvars.ContextVar[ClaimTrace | None] = contextvars.ContextVar(
    "latency_claim", default=None
)


class Profile:
    """Per task id: when its wake-up arrived and the marks of the claim that returned it."""

    def __init__(self) -> None:
        self.enabled = False
        self.wakeups: dict[int, float] = {}
        self.claims: dict[int, ClaimTrace] = {}

    def pop(self, task_id: int) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        extra: dict[str, Any] = {}
        woken = self.wakeups.pop(task_id, None)
        if woken is not None:
            extra["wakeup"] = woken
        claim = self.claims.pop(task_id, None)
        if claim is not None:
            extra.update(claim.marks)
        return extra

    def install(self) -> None:
        """Wrap the wake-up handler, the claim, and the claim's database calls."""
        from txtasks.driver.sql_claims import SqlClaims
        from txtasks.wakeup.amqp import AmqpSubscriber
        from txtasks.wakeup.base import wakeup_decode

        self.enabled = True
        wakeups = self.wakeups
        claims = self.claims
        instrumented: set[int] = set()

        on_message = AmqpSubscriber._on_message

        def timed_on_message(subscriber: Any, wanted: Any, on_wakeup: Any) -> Any:
            handle = on_message(subscriber, wanted, on_wakeup)

            async def timed(message: Any) -> None:
                now = time.monotonic()
                decoded = wakeup_decode(message.body)
                if decoded is not None:
                    for task_id in decoded[1]:
                        wakeups.setdefault(task_id, now)
                await handle(message)

            return timed

        AmqpSubscriber._on_message = timed_on_message  # type: ignore[method-assign]

        def timed(claim: Any) -> Any:
            async def timed_claim(role: Any, *args: Any, **kwargs: Any) -> Any:
                engine = role.db.engine
                if id(engine) not in instrumented:
                    instrumented.add(id(engine))
                    instrument_engine(engine)
                trace = ClaimTrace()
                trace.mark("claim_start")
                token = _claim.set(trace)
                try:
                    rows = await claim(role, *args, **kwargs)
                finally:
                    _claim.reset(token)
                trace.mark("claim_end")
                for row in rows:
                    claims[row.id] = trace
                return rows

            return timed_claim

        # both claims: of the whole queues, and of the tasks a wake-up named
        SqlClaims.task_claim_many = timed(SqlClaims.task_claim_many)  # type: ignore[method-assign]
        SqlClaims.task_claim_ids = timed(SqlClaims.task_claim_ids)  # type: ignore[method-assign]


def instrument_engine(engine: Any) -> None:
    """Marks for the current claim (if any): pre-ping, checkout, BEGIN, execute, COMMIT."""
    from sqlalchemy import event

    dialect = engine.sync_engine.dialect

    def wrap_sync(name: str) -> None:
        original = getattr(dialect, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            trace = _claim.get()
            if trace is None:
                return original(*args, **kwargs)
            trace.mark(f"{name}_start")
            try:
                return original(*args, **kwargs)
            finally:
                trace.mark(f"{name}_end")

        setattr(dialect, name, wrapped)

    wrap_sync("do_ping")
    wrap_sync("do_commit")

    def before_execute(*_: Any) -> None:
        trace = _claim.get()
        if trace is not None:
            trace.mark("execute_start")

    def after_execute(*_: Any) -> None:
        trace = _claim.get()
        if trace is not None:
            trace.mark("execute_end")

    def checkout(*_: Any) -> None:
        trace = _claim.get()
        if trace is not None:
            trace.mark("checkout")

    def begin(*_: Any) -> None:
        trace = _claim.get()
        if trace is not None:
            trace.mark("sa_begin")

    event.listen(engine.sync_engine.pool, "checkout", checkout)
    event.listen(engine.sync_engine, "begin", begin)
    event.listen(engine.sync_engine, "before_cursor_execute", before_execute)
    event.listen(engine.sync_engine, "after_cursor_execute", after_execute)

    if dialect.driver == "asyncpg":  # asyncpg's BEGIN is sent lazily by the first execute
        from sqlalchemy.dialects.postgresql import asyncpg as sa_asyncpg

        adapted = sa_asyncpg.AsyncAdapt_asyncpg_connection
        if not getattr(adapted, "_latency_bench_wrapped", False):
            start_transaction = adapted._start_transaction

            async def timed_start_transaction(self: Any) -> None:
                trace = _claim.get()
                if trace is None:
                    return await start_transaction(self)
                trace.mark("begin_start")
                try:
                    return await start_transaction(self)
                finally:
                    trace.mark("begin_end")

            adapted._start_transaction = timed_start_transaction  # type: ignore[method-assign]
            adapted._latency_bench_wrapped = True  # type: ignore[attr-defined]


profile = Profile()
if os.environ.get(ENV_PROFILE) == "1":
    profile.install()

if os.environ.get(ENV_UVLOOP) == "1":  # the bare worker runs asyncio.run(): set the policy
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def pgqueuer_main() -> None:
    """Run the PGQueuer worker like `pgq run` (uvloop when installed; SIGTERM stops it)."""
    import asyncio
    import logging

    import pgqueuer

    logging.basicConfig(level=logging.WARNING)
    pgqueuer_env()
    worker = pgqueuer.run(pgqueuer_factory)
    try:
        import uvloop
    except ImportError:
        asyncio.run(worker)
    else:
        uvloop.run(worker)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["pgqueuer"]:
        pgqueuer_main()
    elif sys.argv[1:] == ["bare"]:
        import asyncio

        asyncio.run(bare_worker())
    elif sys.argv[1:2] == ["load"] and len(sys.argv) == 5:
        import asyncio

        asyncio.run(load_main(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        sys.exit("usage: python -m tests.benchmarks.latency_apps pgqueuer|bare|load URL AMQP RATE")
