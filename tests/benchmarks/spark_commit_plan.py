"""Where an atomic commit's time goes at millions of rows: the commit's `INSERT ... SELECT` of a
write's staged rows into the tasks table, against the hand-built pattern's own (the JDBC
writer's staging table of one JSON text column, copied into a table with the tasks table's
columns and indexes), each executed under the server's plan profiler, outside Spark.

PostgreSQL: `EXPLAIN (ANALYZE, BUFFERS, WAL)`; MariaDB/MySQL: `ANALYZE FORMAT=JSON`. Each
statement runs in a transaction that is rolled back, and its target table is emptied with
`TRUNCATE` before the next, so every run inserts into empty tables, as the Spark benchmark's
writers do. The statements alternate in each run.

    TXTASKS_BENCH_POSTGRES_URL=postgresql://app:app@127.0.0.1:45432/bench \\
    TXTASKS_BENCH_MYSQL_URL=mysql://app:app@127.0.0.1:43306/bench \\
        python -m tests.benchmarks.spark_commit_plan --rows 2000000 --runs 3

The rows are staged as a Spark write's partitions stage them: `--attempts` attempts of the same
write, their batches of 10,000 rows (Spark's Arrow batches) interleaved, each in a transaction of
its own, through txtasks' own staging (binary COPY on PostgreSQL, multi-row INSERTs on MariaDB).
The payloads are those of the Spark benchmark (`{"order_id":N,"customer":...,"amount":...}`).

Statements profiled:
- `commit`: the atomic commit's statement, as `SqlStaging.commit` builds it (its rows in staging
  order, read along the staged table's primary key), in a transaction set up as the commit's
  (`prepare_publish`);
- `commit, no order`: the same without its ORDER BY (the ids then follow the plan's order);
- `hand-built`: the pattern's statement with the JSON staged as text.
Printed: the median seconds of each, then each statement's profile of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, text

from tests.benchmarks.spark_staging import rows_table
from tests.benchmarks.spark_write import HAND_PUBLISH, HAND_SQL
from txtasks.driver import driver_for_url
from txtasks.driver.urls import backend_name
from txtasks.schema.migrate import migrate
from txtasks.schema.tables import tasks
from txtasks.spark.datasource import STAGE_ID_CHARS
from txtasks.spark.staging import (
    TASK_COLUMNS,
    SqlStaging,
    StageTarget,
    _of_attempts,
    _task_rows,
    numbered,
)
from txtasks.spark.staging.mysql import MySQLStaging
from txtasks.spark.staging.postgresql import PostgresStaging

NOW = datetime(2030, 1, 1)
TARGET = StageTarget(queue="bench", task_name="bench.order", max_attempts=5)
STAGE_JSON, HAND_TASKS = "spark_plan_stage_json", "spark_plan_tasks"
BATCH_ROWS = 10_000
PROFILE = {
    "postgresql": "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT TEXT) ",
    "mysql": "ANALYZE FORMAT=JSON ",
}
#: The staged rows' JSON as text, for the hand-built pattern's staging table.
AS_TEXT = {
    "postgresql": "INSERT INTO {stage} SELECT convert_from(payload, 'UTF8') FROM txtasks_staged",
    "mysql": "INSERT INTO {stage} SELECT CONVERT(payload USING utf8mb4) FROM txtasks_staged",
}


def stage(staging: SqlStaging, rows: int, attempts: int) -> dict[int, int]:
    """Stage `rows` rows under one write in `attempts` attempts whose batches interleave; the
    attempts' numbers, with the rows each staged."""
    write_key = uuid.uuid4().hex[:24]
    staging.open(write_key, NOW)
    numbers = [
        staging.record_attempt(write_key, uuid.uuid4().hex[:STAGE_ID_CHARS], NOW)
        for _ in range(attempts)
    ]
    staged = dict.fromkeys(numbers, 0)
    table = rows_table(rows)
    for i, start in enumerate(range(0, rows, BATCH_ROWS)):
        number = numbers[i % attempts]
        batch = table.slice(start, BATCH_ROWS)
        with staging.driver.db.sync_engine.begin() as conn:
            staging.insert_batch(conn, numbered(batch, number, staged[number]))
        staged[number] += batch.num_rows
    staging.close(write_key)
    return staged


def compiled(conn: Connection, statement: Any) -> tuple[str, dict[str, Any]]:
    """A statement's SQL text and parameters, as the connection's driver takes them."""
    done = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    return str(done), dict(done.params)


def profiled(
    conn: Connection,
    backend: str,
    sql: str,
    params: dict[str, Any],
    setup: Callable[[Connection], None],
) -> tuple[float, str]:
    """Run `sql` under the profiler in a transaction rolled back: seconds, and the profile."""
    with conn.begin() as tx:
        setup(conn)
        started = time.perf_counter()
        rows = conn.exec_driver_sql(PROFILE[backend] + sql, params).all()
        seconds = time.perf_counter() - started
        tx.rollback()
    if backend == "postgresql":
        return seconds, "\n".join(row[0] for row in rows)
    return seconds, json.dumps(json.loads(rows[0][0]), indent=1)


def run(url: str, args: argparse.Namespace) -> None:
    backend = backend_name(url)
    driver = driver_for_url(url)
    staging: SqlStaging = (PostgresStaging if backend == "postgresql" else MySQLStaging)(driver)
    engine = driver.db.sync_engine
    with engine.begin() as conn:
        migrate(conn)
    like = HAND_SQL[backend]["like"].format(tasks=HAND_TASKS)
    with engine.begin() as conn:
        for table in ("txtasks_tasks", "txtasks_staged", "txtasks_stages"):
            conn.execute(text(f"DELETE FROM {table}"))
        for table in (STAGE_JSON, HAND_TASKS):
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        conn.execute(text(f"CREATE TABLE {STAGE_JSON} (payload TEXT)"))
        conn.execute(text(like))
    started = time.perf_counter()
    numbers = stage(staging, args.rows, args.attempts)
    print(f"{backend}: staged {args.rows:,} rows in {time.perf_counter() - started:.1f} s")
    with engine.begin() as conn:
        conn.execute(text(AS_TEXT[backend].format(stage=STAGE_JSON)))
    if backend == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in ("txtasks_staged", "txtasks_stages", STAGE_JSON):
                conn.execute(text(f"VACUUM ANALYZE {table}"))
    else:
        with engine.begin() as conn:
            for table in ("txtasks_staged", "txtasks_stages", STAGE_JSON):
                conn.execute(text(f"ANALYZE TABLE {table}"))
    hand = HAND_PUBLISH.format(
        tasks=HAND_TASKS,
        stage=STAGE_JSON,
        payload=HAND_SQL[backend]["json"],
        now=HAND_SQL[backend]["now"],
    )
    with engine.connect() as conn:
        query = _task_rows(_of_attempts(numbers), TARGET, NOW)
        ordered = compiled(conn, insert(tasks).from_select(TASK_COLUMNS, query))
        unordered = compiled(conn, insert(tasks).from_select(TASK_COLUMNS, query.order_by(None)))
    statements = {
        "commit": (*ordered, staging.prepare_publish, "txtasks_tasks"),
        "commit, no order": (*unordered, staging.prepare_publish, "txtasks_tasks"),
        "hand-built": (hand, {}, lambda conn: None, HAND_TASKS),
    }
    seconds: dict[str, list[float]] = {name: [] for name in statements}
    profiles: dict[str, str] = {}
    for _ in range(args.runs):
        for name, (sql, params, setup, target) in statements.items():
            with engine.connect() as conn:
                took, profiles[name] = profiled(conn, backend, sql, params, setup)
                conn.execute(text(f"TRUNCATE TABLE {target}"))
                conn.commit()
            seconds[name].append(took)
    for name, values in seconds.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{backend} {name}: median {statistics.median(values):.2f} s (runs {runs})")
    for name, profile in profiles.items():
        print(f"\n--- {backend} {name} (last run)\n{profile}")
    with engine.begin() as conn:
        for table in (STAGE_JSON, HAND_TASKS):
            conn.execute(text(f"DROP TABLE {table}"))
        conn.execute(text("DELETE FROM txtasks_staged"))
        conn.execute(text("DELETE FROM txtasks_stages"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--postgres-url", default=os.environ.get("TXTASKS_BENCH_POSTGRES_URL"))
    parser.add_argument("--mysql-url", default=os.environ.get("TXTASKS_BENCH_MYSQL_URL"))
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not args.postgres_url and not args.mysql_url:
        parser.error("give --postgres-url and/or --mysql-url (or TXTASKS_BENCH_*_URL)")
    for url in (args.postgres_url, args.mysql_url):
        if url:
            run(url, args)


if __name__ == "__main__":
    main()
