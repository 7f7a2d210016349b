"""What each part of MariaDB's named claim costs an idle worker, against the bare design's claim.

An idle worker woken for one task claims it with `NAMED_CLAIM_SQL` (txtasks/driver/mysql.py):
one round trip of three statements on a kept autocommit connection. The latency benchmark's
bare design claims the same row with an `UPDATE` by id and a `SELECT` of its payload. This
benchmark times, on one such connection, one claim of one fresh ready task at a time after
`--idle` seconds of idleness (as a worker woken now and then sees the server), in turn:

- `bare`: the bare design's two statements, two round trips;
- `bare-one-trip`: the same two statements in one round trip;
- `named`: `NAMED_CLAIM_SQL` as shipped;
- `named-no-set`: without the `SET` that empties the session variable first;
- `named-no-pause`: without the paused-queue condition;
- `named-no-json`: reading `id` instead of the row's columns as one JSON array;
- `named-not-exists`: the paused-queue condition as `NOT EXISTS` instead of `NOT IN`;
- `named-token`: no `SET`; the UPDATE starts the list of ids afresh at the first row it
  changes, under a token of the claim's;
- `named-no-var`: without noting the ids in the session variable (the rows read back by
  worker id: not safe to ship, a cost to see).

It prints the median and mean milliseconds of each variant over `--rounds` rounds.

    python -m tests.benchmarks.named_claim_mariadb --mysql-url mysql://app:app@127.0.0.1:3306/bench

Not collected by pytest: run it by hand, on a database reserved for it (its txtasks tables
are dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import make_url

from tests.conftest import reset_schema
from txtasks import App
from txtasks.clock import utcnow
from txtasks.driver import mysql as my

QUEUE = "named-bench"

BARE_UPDATE = (
    "UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1, "
    "lease_expires_at = {lease}, worker_id = 'bare', started_at = {now} "
    "WHERE id = {id} AND state IN ('pending', 'retryable')"
)
BARE_SELECT = "SELECT payload FROM txtasks_tasks WHERE id = {id}"
PAUSE = " AND queue NOT IN (SELECT p.queue FROM txtasks_paused_queues AS p)"
VAR = " + 0 * LENGTH(@txtasks_named := CONCAT_WS(',', @txtasks_named, id))"
NOT_EXISTS = (
    " AND NOT EXISTS (SELECT 1 FROM txtasks_paused_queues AS p WHERE p.queue = txtasks_tasks.queue)"
)
#: The ids noted under a claim token instead of emptied by a `SET` first: the first row a
#: claim changes starts the list afresh (a token of its own per claim, in real use).
TOKEN = "12345"
NOTE = "CONCAT_WS(',', @txtasks_named, id)"
NOTE_TOKEN = (
    f"CONCAT_WS(',', IF(@txtasks_claim <=> {TOKEN}, @txtasks_named, "
    f"NULL + LENGTH(@txtasks_claim := {TOKEN})), id)"
)
READ = "FIND_IN_SET(id, @txtasks_named)"
READ_TOKEN = f"FIND_IN_SET(id, IF(@txtasks_claim <=> {TOKEN}, @txtasks_named, NULL))"


def named(task_id: int, lease: str, now: str, queue: str, worker: str) -> str:
    """`NAMED_CLAIM_SQL` for one id and one queue, values written in."""
    template = my._named_claim_sql(1, 1)
    return template % (lease, worker, now, str(task_id), queue, now, str(task_id))


def _cut(sql: str, part: str, instead: str = "") -> str:
    assert part in sql, part
    return sql.replace(part, instead)


VARIANTS: dict[str, Callable[[str], str]] = {
    "named": lambda sql: sql,
    "named-no-set": lambda sql: _cut(sql, "SET @txtasks_named = NULL;\n"),
    "named-no-pause": lambda sql: _cut(sql, PAUSE),
    "named-no-json": lambda sql: _cut(sql, my._NAMED_JSON, "id"),
    "named-not-exists": lambda sql: _cut(sql, PAUSE, NOT_EXISTS),
    "named-token": lambda sql: _cut(
        _cut(_cut(sql, "SET @txtasks_named = NULL;\n"), NOTE, NOTE_TOKEN), READ, READ_TOKEN
    ),
    "named-no-var": lambda sql: _cut(
        _cut(sql, VAR), "FIND_IN_SET(id, @txtasks_named)", "worker_id = 'bench'"
    ),
}


async def connect(url: str) -> Any:
    """An autocommit aiomysql connection set up as the kept one is (`_kept_connect`)."""
    import aiomysql

    parsed = make_url(url)
    connection = await aiomysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        db=parsed.database,
        autocommit=True,
        charset="utf8mb4",
        client_flag=my.CLIENT_FOUND_ROWS | my.CLIENT_MULTI_STATEMENTS,
    )
    await connection.query(
        "SET SESSION innodb_lock_wait_timeout = 0, SESSION tx_isolation = 'READ-COMMITTED'"
    )
    return connection


async def run_sql(connection: Any, sql: str) -> list[Any]:
    """`sql` (one or more statements) in one round trip; the last result's rows."""
    await connection.query(sql)
    while connection._result.has_next:
        await connection.next_result()
    return list(connection._result.rows or ())


async def bench(url: str, rounds: int, idle: float) -> dict[str, list[float]]:
    await asyncio.to_thread(reset_schema, url)
    app = App(database_url=url)

    @app.task(queue=QUEUE)
    async def noop(n: int) -> None:
        """The tasks claimed (never run)."""

    cases = ["bare", "bare-one-trip", *VARIANTS]
    ids = [int(await noop.aenqueue(n)) for n in range(rounds * len(cases))]
    await app.aclose()
    connection = await connect(url)
    escape = connection.escape
    times: dict[str, list[float]] = {case: [] for case in cases}
    ready = iter(ids)
    try:
        for _ in range(rounds):
            for case in cases:
                task_id = next(ready)
                await asyncio.sleep(idle)
                now: datetime = utcnow()
                lease, at = escape(now + timedelta(seconds=60)), escape(now)
                start = time.perf_counter()
                if case == "bare":
                    await run_sql(connection, BARE_UPDATE.format(lease=lease, now=at, id=task_id))
                    rows = await run_sql(connection, BARE_SELECT.format(id=task_id))
                elif case == "bare-one-trip":
                    sql = BARE_UPDATE.format(lease=lease, now=at, id=task_id)
                    rows = await run_sql(connection, f"{sql}; {BARE_SELECT.format(id=task_id)}")
                else:
                    sql = named(task_id, lease, at, escape(QUEUE.encode()), escape("bench"))
                    rows = await run_sql(connection, VARIANTS[case](sql))
                times[case].append((time.perf_counter() - start) * 1000)
                if len(rows) != 1:
                    raise SystemExit(f"{case}: claimed {len(rows)} rows of task {task_id}, not 1")
    finally:
        connection.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mysql-url", required=True, help="a MariaDB database reserved for it")
    parser.add_argument("--rounds", type=int, default=100, help="claims of each variant")
    parser.add_argument("--idle", type=float, default=0.05, help="seconds idle before a claim")
    args = parser.parse_args()
    times = asyncio.run(bench(args.mysql_url, args.rounds, args.idle))
    bare = statistics.median(times["bare"])
    print(f"{args.rounds} claims each, {args.idle:g} s idle before each\n")
    print("| claim | median ms | mean ms | median vs bare ms |")
    print("|---|---:|---:|---:|")
    for case, values in times.items():
        median = statistics.median(values)
        print(f"| {case} | {median:.3f} | {statistics.fmean(values):.3f} | {median - bare:+.3f} |")


if __name__ == "__main__":
    main()
