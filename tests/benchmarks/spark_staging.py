"""Seconds to stage rows, by wire format, outside Spark: on PostgreSQL binary COPY built by
Arrow (what `PostgresStaging` sends) against COPY CSV written by Arrow (what it sent before); on
MariaDB/MySQL multi-row INSERTs of literals written by Arrow (what `MySQLStaging` sends)
against `LOAD DATA LOCAL INFILE` of a file of tab-separated values Arrow writes (what
`MySQLStaging` sends on a connection opened with `local_infile`: the data source's option
`local_infile`).
The same rows, in batches of `--batch-rows` (Spark's Arrow batches: 10,000 rows), each batch in a
transaction of its own as txtasks stages them, each attempt recorded first (its number keys its
rows). One more row per database compares what txtasks sends with the staging before it: one
transaction for all of an attempt's batches.

    TXTASKS_BENCH_POSTGRES_URL=postgresql://app:app@127.0.0.1:45432/bench \\
    TXTASKS_BENCH_MYSQL_URL=mysql://app:app@127.0.0.1:43306/bench \\
        python -m tests.benchmarks.spark_staging --rows 50000 --runs 5

Each run stages `--rows` rows (the payload `{"order_id":N,"customer":"customer-N","amount":N.0}`,
as the Spark benchmark's) under a fresh write, then deletes them; the formats alternate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from datetime import datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from sqlalchemy import Connection, make_url, text

from txtasks.driver import driver_for_url
from txtasks.spark.datasource import STAGE_ID_CHARS
from txtasks.spark.staging import STAGED_COLUMNS, SqlStaging, numbered
from txtasks.spark.staging.mysql import MySQLStaging
from txtasks.spark.staging.postgresql import PostgresStaging

NOW = datetime(2030, 1, 1)
COPY_CSV = "COPY txtasks_staged ({}) FROM STDIN (FORMAT csv)"


def staged_csv(batch: Any) -> bytes:
    """An Arrow table of staged rows as COPY CSV (what txtasks sent before binary COPY):
    payloads as `bytea` in escape format, their bytes as they are, backslashes doubled."""
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv

    where = batch.schema.get_field_index("payload")
    text = pc.replace_substring(batch.column(where).cast(pa.large_string()), "\\", "\\\\")
    out = pa.BufferOutputStream()
    options = pa_csv.WriteOptions(include_header=False, quoting_style="all_valid")
    pa_csv.write_csv(batch.set_column(where, "payload", text), out, options)
    return bytes(out.getvalue())


class CsvStaging(PostgresStaging):
    """Staging by COPY CSV that Arrow writes."""

    def insert_batch(self, conn: Connection, batch: Any) -> None:
        raw: Any = conn.connection.driver_connection
        with (
            raw.cursor() as cursor,
            cursor.copy(COPY_CSV.format(", ".join(batch.column_names))) as copy,
        ):
            copy.write(staged_csv(batch))


def one_transaction(staging: SqlStaging, write_key: str, stage_id: str, batches: Any) -> int:
    """Stage every batch of an attempt in one transaction (txtasks before staging per batch)."""
    number = staging.record_attempt(write_key, stage_id, NOW)
    count = 0
    with staging.driver.sync_engine.begin() as conn:
        for batch in batches:
            staging.insert_batch(conn, numbered(batch, number, count))
            count += batch.num_rows
        staging.check_open(conn, write_key, "not staged")
    return count


class OneTransactionCopy(PostgresStaging):
    def stage(self, write_key: str, stage_id: str, batches: Any, **_: Any) -> int:
        return one_transaction(self, write_key, stage_id, batches)


class OneTransactionInsert(MySQLStaging):
    def stage(self, write_key: str, stage_id: str, batches: Any, **_: Any) -> int:
        return one_transaction(self, write_key, stage_id, batches)


class LoadDataStaging(MySQLStaging):
    """txtasks' staging with option `local_infile`: LOAD DATA LOCAL INFILE, on a driver whose
    connections are opened with `local_infile`."""

    def __init__(self, driver: Any) -> None:
        url = make_url(driver.db.url).update_query_dict({"local_infile": "1"})
        super().__init__(driver_for_url(url.render_as_string(hide_password=False)))


def rows_table(rows: int) -> Any:
    """The staged rows of the Spark benchmark's write (no run_at, dedup or key column)."""
    payloads = [
        f'{{"order_id":{n},"customer":"customer-{n % 1000}","amount":{n % 100}.0}}'.encode()
        for n in range(rows)
    ]
    columns = {
        "payload": pa.array(payloads, pa.large_binary()),
        "priority": pa.array([0] * rows, pa.int32()),
    }
    return pa.table([columns[c] for c in STAGED_COLUMNS], names=list(STAGED_COLUMNS))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--postgres-url", default=os.environ.get("TXTASKS_BENCH_POSTGRES_URL"))
    parser.add_argument("--mysql-url", default=os.environ.get("TXTASKS_BENCH_MYSQL_URL"))
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    args = parser.parse_args()
    if not args.postgres_url and not args.mysql_url:
        parser.error("give --postgres-url and/or --mysql-url (or TXTASKS_BENCH_*_URL)")
    print(f"rows {args.rows:,} per attempt, runs {args.runs} (median, after one warm-up)")
    if args.postgres_url:
        driver = driver_for_url(args.postgres_url)
        kinds = {
            "COPY binary": PostgresStaging,
            "COPY binary, one transaction per attempt": OneTransactionCopy,
            "COPY csv": CsvStaging,
        }
        run(driver, kinds, args)
    if args.mysql_url:
        driver = driver_for_url(args.mysql_url)
        kinds = {
            "INSERT literals": MySQLStaging,
            "INSERT literals, one transaction per attempt": OneTransactionInsert,
            "LOAD DATA LOCAL (option local_infile)": LoadDataStaging,
        }
        run(driver, kinds, args)


def run(driver: Any, kinds: dict[str, Any], args: Any) -> None:
    stagings = {name: kind(driver) for name, kind in kinds.items()}
    seconds: dict[str, list[float]] = {name: [] for name in stagings}
    for _ in range(args.runs + 1):  # the first run warms up, untimed
        for name, staging in stagings.items():
            key = uuid.uuid4().hex[:24]
            table = rows_table(args.rows)
            batches = [
                table.slice(i, args.batch_rows) for i in range(0, args.rows, args.batch_rows)
            ]
            staging.open(key, datetime(2030, 1, 1))
            started = time.perf_counter()
            stage_id = uuid.uuid4().hex[:STAGE_ID_CHARS]
            assert staging.stage(key, stage_id, batches) == args.rows
            seconds[name].append(time.perf_counter() - started)
            staging.close(key)
            with driver.db.sync_engine.begin() as conn:
                staged = conn.execute(text("SELECT count(*) FROM txtasks_staged")).scalar()
                assert staged == args.rows, staged
                conn.execute(text("DELETE FROM txtasks_staged"))
                conn.execute(text("DELETE FROM txtasks_stages"))
    for name, values in seconds.items():
        median = statistics.median(values[1:])
        print(
            f"{driver.capabilities.name} {name}: {median:.3f} s ({args.rows / median:,.0f} rows/s)"
        )


if __name__ == "__main__":
    main()
