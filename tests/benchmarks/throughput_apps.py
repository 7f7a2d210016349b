"""What the throughput benchmark's worker processes run: txtasks, PGQueuer, procrastinate and
the raw SQL limit, each with a no-op handler.

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

from txtasks import App

QUEUE = "throughput-bench"
TASK = "bench.noop"
PGQUEUER_ENTRYPOINT = "bench_noop"
PROCRASTINATE_TASK = "bench_noop"
ENV_REPORT = "TXTASKS_BENCH_REPORT"
ENV_RUN = "TXTASKS_BENCH_RUN"

#: The raw limit's statements, on the txtasks table (the same rows, columns and indexes).
RAW_CLAIM = """
UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1
 WHERE id IN (SELECT id FROM txtasks_tasks
               WHERE queue = $1 AND state IN ('pending', 'retryable')
               ORDER BY priority DESC, run_at, id
               LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
RAW_DELETE = "DELETE FROM txtasks_tasks WHERE id = ANY($1::bigint[])"


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
    """`claimers` asyncpg connections, each: claim `batch` rows in one UPDATE, decode the
    payloads, delete them in one statement; until a claim comes back empty."""
    import asyncpg

    async def claimer() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            while True:
                rows = await connection.fetch(RAW_CLAIM, QUEUE, batch)
                if not rows:
                    return
                if first_start.pending:
                    first_start()
                for row in rows:
                    json.loads(row[1])
                await connection.execute(RAW_DELETE, [row[0] for row in rows])
        finally:
            await connection.close()

    await asyncio.gather(*(claimer() for _ in range(claimers)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=("pgqueuer", "procrastinate", "raw"))
    parser.add_argument("--dsn", required=True, help="postgresql://... of the benchmark database")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--claimers", type=int, default=4)
    args = parser.parse_args(argv)
    if args.system == "pgqueuer":
        asyncio.run(run_pgqueuer(args.dsn, args.batch))
    elif args.system == "procrastinate":
        asyncio.run(run_procrastinate(args.dsn, args.concurrency))
    else:
        asyncio.run(run_raw(args.dsn, args.claimers, args.batch))


if __name__ == "__main__":
    main()
