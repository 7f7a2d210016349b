"""What skipping paused queues costs a claim of a queue that is not paused.

Each round preloads `--tasks` ready tasks without a key in one queue, then claims them in
batches of `--batch` (one worker, as `Worker` does) until none is left, timing every claim
statement. Rounds alternate between the claim as shipped (it skips paused queues) and the
same claim without that condition (the statement of schema version 10), so both see the
same table and the same noise. The report gives the median microseconds per claim statement
of each, over `--rounds` rounds per variant.

    python -m tests.benchmarks.pause_claim --postgres-url postgresql://... \
        --mysql-url mysql://... --sqlite

Not collected by pytest: run it by hand, on databases reserved for it (their txtasks tables
are dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, bindparam, select

from tests.conftest import reset_schema
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.driver import postgresql as pg
from txtasks.driver.dialect import SqlDialect
from txtasks.driver.mysql import MySQLDialect
from txtasks.payload import payload_encode
from txtasks.schema.tables import IS_READY, Timestamp, tasks
from txtasks.types import NewTask

#: The PostgreSQL claim without the paused-queue condition.
CLAIM_SQL_V10 = pg.CLAIM_SQL.replace(
    """
                          AND NOT EXISTS (SELECT 1 FROM txtasks_paused_queues p
                                           WHERE p.queue = q.name)""",
    "",
)
assert CLAIM_SQL_V10 != pg.CLAIM_SQL


def stmt_ready_v10() -> Any:
    """`SqlDialect.claims.stmt_ready` without the paused-queue condition."""
    return (
        select(tasks.c.id)
        .where(
            tasks.c.queue.in_(bindparam("queues", expanding=True)),
            tasks.c.partition_key.is_(None),
            IS_READY,
            tasks.c.run_at <= bindparam("now", type_=Timestamp),
        )
        .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


@contextlib.contextmanager
def without_pause_check() -> Iterator[None]:
    """Claims as schema version 10 made them."""
    shipped_sql, shipped_ready = pg.CLAIM_SQL, SqlDialect.__dict__["stmt_ready"]
    pg.CLAIM_SQL = CLAIM_SQL_V10
    SqlDialect.claims.stmt_ready = staticmethod(stmt_ready_v10)  # type: ignore[method-assign,assignment]
    _caches_clear()
    try:
        yield
    finally:
        pg.CLAIM_SQL = shipped_sql
        SqlDialect.claims.stmt_ready = shipped_ready
        _caches_clear()


def _caches_clear() -> None:
    """Forget the claim statements built from `stmt_ready` (each built once per class)."""
    SqlDialect.claims.stmt_claim.cache_clear()  # type: ignore[attr-defined]
    MySQLDialect.claims.stmt_ready_rows.cache_clear()  # type: ignore[attr-defined]


def new_tasks(n: int) -> list[NewTask]:
    data, content_type = payload_encode({"n": 1})
    now = utcnow()
    return [NewTask("bench", "bench.task", data, content_type, 0, now, 5, now) for _ in range(n)]


async def one_round(url: str, n: int, batch: int) -> list[float]:
    """Seconds of each claim statement that drained `n` tasks."""
    driver = driver_for_url(url)
    await driver.open()
    try:
        for start in range(0, n, 5000):
            await driver.tasks.task_insert_many(new_tasks(min(5000, n - start)))
        times = []
        while True:
            now = utcnow()
            began = time.perf_counter()
            rows = await driver.claims.task_claim_many(
                ["bench"], batch, now=now, lease_until=now + timedelta(seconds=60), worker_id="b"
            )
            times.append(time.perf_counter() - began)
            if not rows:
                return times
    finally:
        await driver.close()


async def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    per_variant: dict[str, list[float]] = {"skips paused queues": [], "schema 10 claim": []}
    for _ in range(args.rounds):
        for variant in per_variant:
            reset_schema(url)
            if variant == "schema 10 claim":
                with without_pause_check():
                    times = await one_round(url, args.tasks, args.batch)
            else:
                times = await one_round(url, args.tasks, args.batch)
            per_variant[variant].append(statistics.median(times) * 1e6)
    return {k: statistics.median(v) for k, v in per_variant.items()}


def report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        f"claims of {args.batch} tasks draining {args.tasks} tasks, median µs per claim "
        f"statement over {args.rounds} rounds each",
        "",
        "| database | skips paused queues | schema 10 claim | difference |",
        "|---|---:|---:|---:|",
    ]
    for name, r in results.items():
        new, old = r["skips paused queues"], r["schema 10 claim"]
        lines.append(f"| {name} | {new:.0f} | {old:.0f} | {100 * (new - old) / old:+.1f}% |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url")
    parser.add_argument("--mysql-url")
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    urls = {"PostgreSQL": args.postgres_url, "MariaDB": args.mysql_url}
    if args.sqlite:
        urls["SQLite"] = f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite3"
    results = {}
    for name, url in urls.items():
        if url:
            results[name] = asyncio.run(measure(url, args))
    print(report(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
