"""The application of the chaos suite: what `txtasks worker tests.chaos.app:app` runs, and the
enqueuing application (`python -m tests.chaos.app enqueue ...`).

Everything a check needs is in the database, in tables of the app's own:

- `chaos_orders`: the business table. An application transaction inserts an order, enqueues
  its task and stores the task id on the order, all in one transaction: an order that exists
  committed, and its task must run.
- `chaos_rollbacks`: the orders whose transaction the application rolled back on purpose (after
  enqueueing): their tasks must never run.
- `chaos_failures`: application transactions that failed without being asked to (a deadlock, a
  lock wait timeout, ...), with the error.
- `chaos_runs`: one row per attempt that did its work (task id, order, attempt, worker pid),
  written at the end of the handler on a connection of its own that goes straight to the
  server (`CHAOS_EFFECTS_URL`), never through the faulty network under test: a count of rows
  per order is how many times its task took effect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Engine,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    insert,
    update,
)

from tests import pace
from txtasks import App, KeyLimits, Rate
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import backend_name, url_sync
from txtasks.worker.context import TaskContext

QUEUE = "chaos"
TASK = "chaos.work"
#: A fault must never use up a task's attempts: far more than any scenario's faults could take.
MAX_ATTEMPTS = 25
#: Seconds before a task whose attempt failed is tried again.
RETRY_DELAY = 0.2
EFFECTS_URL_VAR = "CHAOS_EFFECTS_URL"
#: Seconds the enqueuer keeps trying to record a rollback or failure while the database is away.
NOTE_PATIENCE = pace.seconds(20.0)

metadata = MetaData()
orders = Table(
    "chaos_orders",
    metadata,
    Column("n", Integer, primary_key=True, autoincrement=False),
    Column("task_id", BigInteger, nullable=True),
)
rollbacks = Table(
    "chaos_rollbacks", metadata, Column("n", Integer, primary_key=True, autoincrement=False)
)
failures = Table(
    "chaos_failures",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("n", Integer, nullable=False),
    Column("error", Text, nullable=False),
)
runs = Table(
    "chaos_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task_id", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    # the task's key, and when its handler started and ended (wall clock, one host)
    Column("key", Text, nullable=True),
    Column("started", Double, nullable=True),
    Column("ended", Double, nullable=True),
)

app = App("chaos", default_queue=QUEUE)
#: Tasks enqueued with keys (`enqueue --keys K`) run at most this many of one key at once.
KEY_CONCURRENCY = 2
app.key_limits(QUEUE, KeyLimits(concurrency=KEY_CONCURRENCY))
#: Starts per second of the whole queue, when the test sets it (`CHAOS_QUEUE_RATE`).
QUEUE_RATE_VAR = "CHAOS_QUEUE_RATE"
if os.environ.get(QUEUE_RATE_VAR):
    app.queue_rate(QUEUE, Rate(int(os.environ[QUEUE_RATE_VAR])))


def engine_for(url: str, **options: Any) -> Engine:
    """A synchronous engine on `url` (SQLite: WAL, busy timeout, BEGIN IMMEDIATE)."""
    engine = create_engine(url_sync(url), **options)
    if backend_name(url) == "sqlite":
        sqlite_connection_setup(engine)
    return engine


@cache
def effects_engine() -> Engine:
    """The handlers' and the enqueuer's bookkeeping connection, straight to the server."""
    url = os.environ.get(EFFECTS_URL_VAR) or os.environ["TXTASKS_DATABASE_URL"]
    # bookkeeping must outlive a database restart: stale pooled connections are replaced
    return engine_for(url, pool_size=20, max_overflow=20, pool_pre_ping=True)


def record_run(ctx: TaskContext, n: int, started: float) -> None:
    ended = time.time()
    with effects_engine().begin() as conn:
        conn.execute(
            insert(runs).values(
                task_id=ctx.task_id,
                n=n,
                attempt=ctx.attempt,
                pid=os.getpid(),
                key=ctx.key,
                started=started,
                ended=ended,
            )
        )


@app.task(name=TASK, max_attempts=MAX_ATTEMPTS, retry=RETRY_DELAY, key=lambda p: p.get("key"))
async def work(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Works for payload["ms"] milliseconds (tasks stay in flight), then records its run."""
    started = time.time()
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    await asyncio.to_thread(record_run, ctx, int(payload["n"]), started)


# -- the enqueuing application -----------------------------------------------------------------


class _RolledBack(Exception):
    """The application changed its mind: roll the transaction back."""


def order_place(engine: Engine, n: int, ms: int, roll_back: bool, keys: int = 0) -> None:
    """One application transaction: an order, its task, the task id on the order."""
    with engine.begin() as conn:
        conn.execute(insert(orders).values(n=n))
        payload: dict[str, Any] = {"n": n, "ms": ms}
        if keys:
            payload["key"] = f"k{n % keys}"
        task_id = work.enqueue_tx(conn, payload)
        conn.execute(update(orders).where(orders.c.n == n).values(task_id=task_id))
        if roll_back:
            raise _RolledBack


def note(table: Table, **values: Any) -> None:
    """Record a rollback or failure, retrying while the database is away (bounded)."""
    deadline = time.monotonic() + NOTE_PATIENCE
    while True:
        try:
            with effects_engine().begin() as conn:
                conn.execute(insert(table).values(**values))
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                print(f"could not record {table.name} {values}: {exc}", file=sys.stderr)
                return
            time.sleep(0.2)


def enqueue_range(
    engine: Engine, numbers: range, args: argparse.Namespace, seed: int, stop: threading.Event
) -> tuple[int, int]:
    """Place orders `numbers` until `stop` is set; how many were placed, how many failed."""
    rng = random.Random(seed)
    placed = failed = 0
    for n in numbers:
        if stop.is_set():
            break
        roll_back = rng.random() < args.rollback
        try:
            order_place(engine, n, rng.randint(0, args.max_ms), roll_back, args.keys)
        except _RolledBack:
            note(rollbacks, n=n)
        except Exception as exc:  # what the suite counts: an application transaction failed
            failed += 1
            first_line = (str(exc).splitlines() or [""])[0]
            note(failures, n=n, error=f"{type(exc).__name__}: {first_line}"[:500])
        placed += 1
        if args.pause:
            time.sleep(args.pause)
    return placed, failed


def enqueue_main(args: argparse.Namespace) -> None:
    """Place the orders; on SIGTERM, stop placing more once each transaction under way ends
    (a scenario that is over on a slow machine stops its application rather than wait for
    every order)."""
    engine = engine_for(os.environ["TXTASKS_DATABASE_URL"], pool_size=args.threads)
    chunks = [
        range(args.start + i, args.start + args.count, args.threads) for i in range(args.threads)
    ]
    counts = [(0, 0)] * args.threads
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def run(i: int) -> None:
        counts[i] = enqueue_range(engine, chunks[i], args, args.start * 1000 + i, stop)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    t = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - t
    asyncio.run(app.aclose())  # sends the last wake-ups
    engine.dispose()
    placed, failed = (sum(column) for column in zip(*counts, strict=True))
    summary = {"count": args.count, "placed": placed, "failed": failed, "stopped": stop.is_set()}
    print(json.dumps({**summary, "seconds": round(elapsed, 2)}))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.app")
    sub = parser.add_subparsers(required=True)
    enq = sub.add_parser("enqueue", help="place orders n = start .. start+count-1")
    enq.add_argument("--start", type=int, default=0)
    enq.add_argument("--count", type=int, required=True)
    enq.add_argument("--threads", type=int, default=1, help="application transactions at once")
    enq.add_argument("--rollback", type=float, default=0.1, help="share rolled back on purpose")
    enq.add_argument("--max-ms", type=int, default=20, help="longest a task works")
    enq.add_argument("--pause", type=float, default=0.0, help="seconds between transactions")
    enq.add_argument("--keys", type=int, default=0, help="tasks over this many keys (0: none)")
    enq.set_defaults(run=enqueue_main)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
