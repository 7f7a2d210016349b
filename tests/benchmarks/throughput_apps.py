"""What the throughput benchmark's worker processes run: txtasks, PGQueuer, procrastinate and
the raw SQL limit (PostgreSQL, MariaDB/MySQL and SQLite), each with a no-op handler.

- txtasks: `python -m txtasks worker tests.benchmarks.throughput_apps:app --burst ...`, the
  command line a user runs.
- The others: `python -m tests.benchmarks.throughput_apps SYSTEM [options]`, each through its
  public API, stopping once its queue is empty (PGQueuer's `drain` mode, procrastinate's
  `wait=False`, the raw loop when a claim comes back empty).

Every process sends one UDP datagram (`run first-start-monotonic cpu-seconds-so-far`) when its
first handler starts, to `TXTASKS_BENCH_REPORT` (host:port), so the benchmark can take the
first start across processes as the start of the burn-down and leave process start-up out of
it, in time and in CPU.
`CLOCK_MONOTONIC` is one clock for the whole machine on Linux.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from txtasks import App

QUEUE = "throughput-bench"
TASK = "bench.noop"
PGQUEUER_ENTRYPOINT = "bench_noop"
PROCRASTINATE_TASK = "bench_noop"
ENV_REPORT = "TXTASKS_BENCH_REPORT"
ENV_RUN = "TXTASKS_BENCH_RUN"

#: The raw limit's statements, on the txtasks table (the same rows, columns and indexes). Each
#: claim reads the ready rows without a key along the claim index, as txtasks' claims do: the
#: index is partial on PostgreSQL and SQLite (only a query that says `partition_key IS NULL`
#: and the ready states may use it) and starts with (queue, partition_key) on MariaDB.
READY_UNKEYED = "partition_key IS NULL AND state IN ('pending', 'retryable')"
#: PostgreSQL: one statement; the claimed rows found by primary key (`= ANY(ARRAY(...))`: an
#: `IN (subquery)` may be planned as a hash join over a sequential scan of the table).
RAW_CLAIM = f"""
UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1
 WHERE id = ANY(ARRAY(SELECT id FROM txtasks_tasks
                       WHERE queue = $1 AND {READY_UNKEYED}
                       ORDER BY priority DESC, run_at, id
                       LIMIT $2 FOR UPDATE SKIP LOCKED))
RETURNING id, payload
"""
RAW_DELETE = "DELETE FROM txtasks_tasks WHERE id = ANY($1::bigint[])"
#: MariaDB/MySQL: no UPDATE ... RETURNING, so a claim is a transaction of a locking read and
#: an update of the rows read (ids written into the statement: integers the server returned).
MYSQL_RAW_SELECT = f"""
SELECT id, payload FROM txtasks_tasks
 WHERE queue = %s AND {READY_UNKEYED}
 ORDER BY priority DESC, run_at, id
 LIMIT %s FOR UPDATE SKIP LOCKED
"""
MYSQL_RAW_CLAIM = (
    "UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1 WHERE id IN ({ids})"
)
MYSQL_RAW_DELETE = "DELETE FROM txtasks_tasks WHERE id IN ({ids})"
#: SQLite: one writer at a time, so no locking clause; UPDATE ... RETURNING since 3.35.
SQLITE_RAW_CLAIM = f"""
UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1
 WHERE id IN (SELECT id FROM txtasks_tasks
               WHERE queue = ? AND {READY_UNKEYED}
               ORDER BY priority DESC, run_at, id
               LIMIT ?)
RETURNING id, payload
"""
SQLITE_RAW_DELETE = MYSQL_RAW_DELETE
#: The pragmas txtasks sets on every SQLite connection (`sqlite_connection_setup`).
SQLITE_PRAGMAS = (
    "PRAGMA busy_timeout = 30000",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
)


class FirstStart:
    """Reports the first handler start of this process, once."""

    def __init__(self) -> None:
        self.pending = True

    def __call__(self) -> None:
        if not self.pending:
            return
        self.pending = False
        started = time.monotonic()
        cpu = time.process_time()  # start-up's CPU, left out of the CPU per task
        spec = os.environ.get(ENV_REPORT)
        if not spec:
            return
        host, _, port = spec.rpartition(":")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            text = f"{os.environ.get(ENV_RUN, '-')} {started!r} {cpu!r}"
            sock.sendto(text.encode(), (host, int(port)))


first_start = FirstStart()

app = App("throughput-bench")


@app.task(name=TASK, queue=QUEUE)
async def noop(payload: Any) -> None:
    if first_start.pending:
        first_start()


# -- the peers ------------------------------------------------------------------------------------


async def run_pgqueuer(dsn: str, batch_size: int) -> None:
    """A QueueManager on one asyncpg connection with a no-op entrypoint, until drained."""
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    connection = await asyncpg.connect(dsn)
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(PGQUEUER_ENTRYPOINT)
        async def bench_noop(job: Job) -> None:
            if first_start.pending:
                first_start()

        await manager.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
    finally:
        await connection.close()


def procrastinate_app(conninfo: str) -> Any:
    import procrastinate

    proc = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @proc.task(name=PROCRASTINATE_TASK, queue=QUEUE)
    async def bench_noop(**_: Any) -> None:
        if first_start.pending:
            first_start()

    return proc


async def run_procrastinate(conninfo: str, concurrency: int) -> None:
    """A procrastinate worker that stops once no job is left (`wait=False`)."""
    proc = procrastinate_app(conninfo)
    async with proc.open_async():
        await proc.run_worker_async(
            queues=[QUEUE], concurrency=concurrency, wait=False, install_signal_handlers=False
        )


async def run_raw(dsn: str, claimers: int, batch: int) -> None:
    """PostgreSQL: `claimers` asyncpg connection pairs, each: claim `batch` rows in one
    UPDATE, decode the payloads, delete them in one statement; until a claim comes back empty.
    As txtasks does, claims commit without waiting for the WAL flush (a claim lost in a crash
    leaves its rows pending) on connections of their own; the deletes wait for it."""
    import asyncpg

    async def claimer() -> None:
        claims = await asyncpg.connect(dsn, server_settings={"synchronous_commit": "off"})
        writes = await asyncpg.connect(dsn)
        try:
            while True:
                rows = await claims.fetch(RAW_CLAIM, QUEUE, batch)
                if not rows:
                    return
                if first_start.pending:
                    first_start()
                for row in rows:
                    json.loads(row[1])
                await writes.execute(RAW_DELETE, [row[0] for row in rows])
        finally:
            await claims.close()
            await writes.close()

    await asyncio.gather(*(claimer() for _ in range(claimers)))


async def run_raw_mysql(dsn: str, claimers: int, batch: int) -> None:
    """MariaDB/MySQL: `claimers` aiomysql connections (READ COMMITTED, as txtasks' sessions),
    each: in one transaction, read and lock `batch` ready rows skipping locked ones and mark
    them processing (SELECT, UPDATE, COMMIT); decode the payloads; delete them (DELETE,
    COMMIT); until a claim comes back empty."""
    import aiomysql

    url = urlsplit(dsn)
    options = {
        "host": url.hostname or "127.0.0.1",
        "port": url.port or 3306,
        "user": unquote(url.username or ""),
        "password": unquote(url.password or ""),
        "db": url.path.lstrip("/"),
        "autocommit": False,
    }

    async def claimer() -> None:
        connection = await aiomysql.connect(**options)
        try:
            cursor = await connection.cursor()
            await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            while True:
                await cursor.execute(MYSQL_RAW_SELECT, (QUEUE, batch))
                rows = await cursor.fetchall()
                if not rows:
                    await connection.rollback()
                    return
                ids = ",".join(str(row[0]) for row in rows)
                await cursor.execute(MYSQL_RAW_CLAIM.format(ids=ids))
                await connection.commit()
                if first_start.pending:
                    first_start()
                for row in rows:
                    json.loads(row[1])
                await cursor.execute(MYSQL_RAW_DELETE.format(ids=ids))
                await connection.commit()
        finally:
            connection.close()

    await asyncio.gather(*(claimer() for _ in range(claimers)))


def run_raw_sqlite(path: str, batch: int) -> None:
    """SQLite: one connection (one writer at a time), sqlite3 in autocommit mode with txtasks'
    pragmas, each: claim `batch` rows in one UPDATE ... RETURNING, decode the payloads, delete
    them in one statement (each statement its own transaction); until a claim comes back
    empty."""
    import sqlite3

    connection = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in SQLITE_PRAGMAS:
            connection.execute(pragma)
        while True:
            rows = connection.execute(SQLITE_RAW_CLAIM, (QUEUE, batch)).fetchall()
            if not rows:
                return
            if first_start.pending:
                first_start()
            for row in rows:
                json.loads(row[1])
            ids = ",".join(str(row[0]) for row in rows)
            connection.execute(SQLITE_RAW_DELETE.format(ids=ids))
    finally:
        connection.close()


def raw_main(dsn: str, claimers: int, batch: int) -> None:
    """The raw loop of the database `dsn` names: postgresql://, mysql:// or sqlite:///PATH."""
    scheme = dsn.partition(":")[0]
    if scheme == "sqlite":
        run_raw_sqlite(dsn.removeprefix("sqlite:///"), batch)
    elif scheme.startswith("mysql") or scheme.startswith("mariadb"):
        asyncio.run(run_raw_mysql(dsn, claimers, batch))
    else:
        asyncio.run(run_raw(dsn, claimers, batch))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=("pgqueuer", "procrastinate", "raw"))
    parser.add_argument(
        "--dsn",
        required=True,
        help="the benchmark database: postgresql://... (raw: also mysql://..., sqlite:///PATH)",
    )
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--claimers", type=int, default=4)
    args = parser.parse_args(argv)
    if args.system == "pgqueuer":
        asyncio.run(run_pgqueuer(args.dsn, args.batch))
    elif args.system == "procrastinate":
        asyncio.run(run_procrastinate(args.dsn, args.concurrency))
    else:
        raw_main(args.dsn, args.claimers, args.batch)


if __name__ == "__main__":
    main()
