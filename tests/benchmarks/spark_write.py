"""Rows/s enqueued from Spark with `format("txtasks")`, against Spark's own JDBC writer writing
the same DataFrame to a plain table in the same database, in one run.

The writers alternate in each run, each from empty tables (`WRITERS`): txtasks with `publish` =
"atomic" and "deferred"; Spark's JDBC writer into a plain table; the hand-built atomic pattern in
two forms, each the JDBC writer into a staging table and then one `INSERT ... SELECT` into a table
with the tasks table's columns and indexes, timed together: with each task's JSON payload built by
the database in that statement, and built by Spark (`to_json`, in the JVM) and staged as one text
column; the same pattern into a plain table of the DataFrame's columns (no task columns, no
index); and two writers that write nothing: Spark's `noop` format (in the JVM) and a Python data
source that reads its rows and drops them, which is what any Python data source pays before it
writes a row. Ratios to the hand-built pattern are to the faster of its two forms.
A writer's time is the Spark job's (stage and commit). For each txtasks mode the report also
gives the time from the job's return to every task claimable: 0 for atomic (the commit made
them claimable), for deferred the time `--publishers` publishers (threads of this process, each
with its own connections, as workers or cleaners would be) take to publish the write; and the
time the cleaner's purge (its service `staged_purge`) then takes, off the job's path, to delete the staged rows no write
reads any more (the rows of the attempts the write ended), in its batches; and the peak resident
memory of one of Spark's Python workers while the job ran (`WorkerMemory`; the largest of the runs).

    python -m tests.benchmarks.spark_write --help
    TXTASKS_BENCH_POSTGRES_URL=postgresql://app:app@127.0.0.1:45432/bench \\
    TXTASKS_BENCH_MYSQL_URL=mysql://app:app@127.0.0.1:43306/bench \\
        python -m tests.benchmarks.spark_write --rows 200000 --runs 3

With `--dedup`, every write has a dedup column (each key twice: the commit keeps the first row
of each) and is timed alone, at each `--sizes` and, on PostgreSQL, with the staged table's
statistics fresh (taken on as many rows of the same write and shape, then emptied) and stale (taken on the
empty table, autovacuum off): the commit must stay linear in rows either way.

    python -m tests.benchmarks.spark_write --dedup --sizes 100000,1000000 --runs 3

The JDBC drivers come from Debian (`apt-get install libpostgresql-jdbc-java libmariadb-java`:
/usr/share/java/postgresql.jar and mariadb-java-client.jar). The JDBC writer gets its
recommended batching options (`reWriteBatchedInserts` / `rewriteBatchedStatements`). The
DataFrame is cached and counted first, so both writers time the write alone. Runs alternate
between the two writers; each run starts from an empty table. See tests/benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timezone
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from txtasks.driver.urls import backend_name, url_sync
from txtasks.schema.migrate import migrate

JARS = {
    "postgresql": "/usr/share/java/postgresql.jar",
    "mysql": "/usr/share/java/mariadb-java-client.jar",
}
PLAIN = "spark_bench_plain"
#: The hand-built pattern's staging tables (the DataFrame's columns; one JSON text column) and
#: tasks table (the tasks table's columns and indexes); the plain table it copies into in its
#: plain form.
HAND_STAGE, HAND_TASKS = "spark_bench_stage", "spark_bench_tasks"
HAND_JSON_STAGE, HAND_COPY = "spark_bench_stage_json", "spark_bench_copy"
BENCH_TABLES = (PLAIN, HAND_STAGE, HAND_JSON_STAGE, HAND_TASKS, HAND_COPY)
COLUMNS = "order_id BIGINT, customer VARCHAR(64), amount DOUBLE PRECISION"
#: Each task of the hand-built pattern, as the commit writes it, per dialect.
HAND_PUBLISH = (
    "INSERT INTO {tasks} (queue, task_name, payload, content_type, state, priority, run_at, "
    "attempt, max_attempts, created_at) SELECT 'bench', 'bench.order', {payload}, "
    "'application/json', 'pending', 0, {now}, 0, 5, {now} FROM {stage}"
)
HAND_SQL = {
    "postgresql": {
        "payload": "convert_to(json_build_object('order_id', order_id, 'customer', customer, "
        "'amount', amount)::text, 'UTF8')",
        "json": "convert_to(payload, 'UTF8')",
        "now": "(now() AT TIME ZONE 'utc')",
        "like": "CREATE TABLE {tasks} (LIKE txtasks_tasks INCLUDING ALL)",
    },
    "mysql": {
        "payload": "JSON_OBJECT('order_id', order_id, 'customer', customer, 'amount', amount)",
        "json": "payload",
        "now": "UTC_TIMESTAMP(6)",
        "like": "CREATE TABLE {tasks} LIKE txtasks_tasks",
    },
}
#: The txtasks tables each run starts from, emptied as the pattern's tables are made anew: with
#: no dead rows left by the run before in their heaps and indexes.
EMPTIED = (
    "txtasks_tasks", "txtasks_staged", "txtasks_commits", "txtasks_deferred", "txtasks_stages",
)  # fmt: skip
#: The writers of a run, in order, and their names in the report.
NAMES = {
    "atomic": "txtasks atomic",
    "deferred": "txtasks deferred",
    "jdbc": "JDBC into a plain table",
    "hand": "hand-built atomic, JSON by the database",
    "hand_spark": "hand-built atomic, JSON by Spark",
    "hand_plain": "hand-built into a plain table",
    "noop": "Spark's noop writer (JVM)",
    "noop_python": "a Python data source that drops its rows",
}
WRITERS = tuple(NAMES)
#: The two forms of the hand-built atomic pattern: ratios are to the faster.
HAND_BUILT = ("hand", "hand_spark")


#: Rows of the shape the dedup writes stage, made by PostgreSQL (for fresh statistics).
STAGE_LIKE = (
    "INSERT INTO txtasks_staged (stage, n, payload, priority, dedup_key) "
    "SELECT 0, g, convert_to('{{\"order_id\":' || g || '}}', 'UTF8'), 0, (g / 2)::text "
    "FROM generate_series(0, {rows} - 1) AS g"
)


class DropWriter(DataSourceArrowWriter):
    """Reads every Arrow batch Spark hands it, writes nothing."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


class DropSource(DataSource):
    """`format("txtasks_bench_drop")`: what a Python data source costs before it writes."""

    @classmethod
    def name(cls) -> str:
        return "txtasks_bench_drop"

    def writer(self, schema: Any, overwrite: bool) -> DropWriter:
        return DropWriter()


class WorkerMemory:
    """The peak resident memory (MiB) of Spark's Python workers while a block runs: every
    Python process whose command line names `pyspark` (the daemon, the workers it forks, the workers
    that plan and commit a data source's write), sampled from /proc. Each one's high-water mark
    (`VmHWM`) is reset when the block starts (`clear_refs`), so a reused worker reports its
    peak in this block only, and read every `interval` seconds until the block ends (a worker
    that exits meanwhile is counted up to its last sample). The figure is the largest of one
    process, not a sum."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerMemory:
        for pid in self._workers():
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def peak_mib(self) -> float:
        return self.peak_kib / 1024

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        for pid in self._workers():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_kib = max(self.peak_kib, int(line.split()[1]))

    @staticmethod
    def _workers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    python = "python" in os.readlink(entry / "exe")  # not the JVM
                    if python and b"pyspark" in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
        return found


@dataclass
class Case:
    backend: str
    url: str
    #: MariaDB/MySQL: txtasks stages with LOAD DATA LOCAL INFILE (option `local_infile`).
    local_infile: bool = False
    #: Seconds of each run, per writer (`WRITERS`).
    seconds: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds from the job's return to every task claimable, per txtasks mode.
    claimable: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds from the commit's start (its recorded time) to the job's return, per mode.
    commit: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds the cleaner's archiver takes, after the write, to delete the staged rows that
    #: no write reads any more (those of ended attempts), per mode.
    purge: dict[str, list[float]] = field(default_factory=dict)
    #: The peak resident memory (MiB) of one of Spark's Python workers while the job ran, per
    #: txtasks mode (`WorkerMemory`).
    rss: dict[str, list[float]] = field(default_factory=dict)

    def add(self, table: dict[str, list[float]], writer: str, seconds: float) -> None:
        table.setdefault(writer, []).append(seconds)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def jdbc_options(url: str) -> dict[str, str]:
    parsed = make_url(url_sync(url))
    host, port, database = parsed.host, parsed.port, parsed.database
    if backend_name(url) == "postgresql":
        return {
            "url": f"jdbc:postgresql://{host}:{port or 5432}/{database}?reWriteBatchedInserts=true",
            "driver": "org.postgresql.Driver",
            "user": parsed.username or "",
            "password": parsed.password or "",
        }
    return {
        "url": f"jdbc:mysql://{host}:{port or 3306}/{database}?rewriteBatchedStatements=true",
        "driver": "org.mariadb.jdbc.Driver",
        "user": parsed.username or "",
        "password": parsed.password or "",
    }


def prepare(url: str) -> None:
    """The txtasks schema and the plain table, both empty."""
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            migrate(conn)
            for table in EMPTIED:
                conn.execute(text(f"TRUNCATE TABLE {table}"))
            for table in BENCH_TABLES:
                conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
            for table in (PLAIN, HAND_STAGE, HAND_COPY):
                conn.execute(text(f"CREATE TABLE {table} ({COLUMNS})"))
            conn.execute(text(f"CREATE TABLE {HAND_JSON_STAGE} (payload TEXT)"))
            like = HAND_SQL[backend_name(url)]["like"]
            conn.execute(text(like.format(tasks=HAND_TASKS)))
    finally:
        engine.dispose()


def drop_bench_tables(url: str) -> None:
    """Leave the database as the run found it: the hand-built pattern's tasks table shares the
    tasks table's id sequence on PostgreSQL, which could then not be dropped."""
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            for table in BENCH_TABLES:
                conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
    finally:
        engine.dispose()


def count(url: str, table: str) -> int:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def publish_all(url: str, publishers: int) -> None:
    """Publish every deferred write with `publishers` publishers at once (threads, each with a
    driver of its own), until none waits."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from txtasks.clock import utcnow
    from txtasks.driver import driver_for_url
    from txtasks.spark.staging.publisher import publish_pending

    async def one() -> None:
        driver = driver_for_url(url)
        try:
            await publish_pending(driver, clock=utcnow, wake=lambda queue: None)
        finally:
            await driver.close()

    with ThreadPoolExecutor(publishers) as pool:
        for done in [pool.submit(asyncio.run, one()) for _ in range(publishers)]:
            done.result()


def purge_ended(url: str) -> int:
    """Run the purge of staged rows as the cleaner's service `staged_purge` does (batches of its
    default size until one comes back short): the rows deleted."""
    import asyncio
    from datetime import timedelta

    from txtasks.clock import utcnow
    from txtasks.driver import driver_for_url
    from txtasks.spark.services import StagedPurge
    from txtasks.spark.staging import purge_abandoned

    config = StagedPurge()

    async def purge() -> int:
        driver = driver_for_url(url)
        before = utcnow() - timedelta(seconds=config.after)
        done = 0
        try:
            while True:
                found = await purge_abandoned(driver, before=before, limit=config.batch_size)
                done += found
                if found < config.batch_size:
                    return done
        finally:
            await driver.close()

    return asyncio.run(purge())


def hand_built(df: Any, url: str, form: str) -> None:
    """The hand-built atomic pattern: the JDBC writer into a staging table, then one
    INSERT ... SELECT into a table with the tasks table's columns and indexes (`form` "hand":
    building each payload's JSON in it; "hand_spark": of payloads Spark built) or into a plain
    table of the DataFrame's columns ("hand_plain")."""
    sql = HAND_SQL[backend_name(url)]
    stage = HAND_STAGE
    if form == "hand":
        copy = HAND_PUBLISH.format(tasks=HAND_TASKS, stage=stage, **sql)
    elif form == "hand_spark":
        df, stage = df.selectExpr("to_json(struct(*)) AS payload"), HAND_JSON_STAGE
        copy = HAND_PUBLISH.format(
            tasks=HAND_TASKS, stage=stage, now=sql["now"], payload=sql["json"]
        )
    else:
        copy = f"INSERT INTO {HAND_COPY} SELECT * FROM {stage}"
    df.write.format("jdbc").options(dbtable=stage, **jdbc_options(url)).mode("append").save()
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            conn.execute(text(copy))
    finally:
        engine.dispose()


def run_case(
    spark: Any, df: Any, case: Case, rows: int, runs: int, publishers: int, writers: list[str]
) -> None:
    def txtasks(mode: str) -> Any:
        return (
            df.write.format("txtasks")
            .option("url", case.url)
            .option("task", "bench.order")
            .option("queue", "bench")
            .option("publish", mode)
            .option("local_infile", str(case.local_infile).lower())
            .mode("append")
        )

    prepare(case.url)
    txtasks("atomic").save()  # untimed: Spark's Python workers start
    df.write.format(DropSource.name()).mode("append").save()
    for run in range(runs):
        for mode in [m for m in ("atomic", "deferred") if m in writers]:
            prepare(case.url)
            with WorkerMemory() as memory:
                case.add(case.seconds, mode, timed(txtasks(mode).save))
            case.add(case.rss, mode, memory.peak_mib)
            case.add(case.commit, mode, commit_seconds(case.url, time.time()))
            waited = 0.0  # atomic: claimable when the job returns
            if mode == "deferred":
                waited = timed(lambda: publish_all(case.url, publishers))
            assert count(case.url, "txtasks_tasks") == rows
            case.add(case.claimable, mode, waited)
            case.add(case.purge, mode, timed(lambda: purge_ended(case.url)))
            assert count(case.url, "txtasks_staged") == 0
        if "jdbc" in writers:
            prepare(case.url)
            jdbc = df.write.format("jdbc").options(dbtable=PLAIN, **jdbc_options(case.url))
            case.add(case.seconds, "jdbc", timed(jdbc.mode("append").save))
            assert count(case.url, PLAIN) == rows
        for form, table in (
            ("hand", HAND_TASKS),
            ("hand_spark", HAND_TASKS),
            ("hand_plain", HAND_COPY),
        ):
            if form in writers:
                prepare(case.url)
                case.add(case.seconds, form, timed(partial(hand_built, df, case.url, form)))
                assert count(case.url, table) == rows
        for writer, name in (("noop", "noop"), ("noop_python", DropSource.name())):
            if writer in writers:
                save = df.write.format(name).mode("append").save
                case.add(case.seconds, writer, timed(save))
        published = case.claimable.get("deferred")
        log(
            f"{case.backend} run {run + 1}: "
            + ", ".join(f"{w} {rows / case.seconds[w][-1]:,.0f} rows/s" for w in writers)
            + (f", deferred publish {published[-1]:.2f} s" if published else "")
        )
    prepare(case.url)
    drop_bench_tables(case.url)


@dataclass
class DedupCase:
    backend: str
    url: str
    statistics: str
    rows: int
    seconds: list[float] = field(default_factory=list)
    commit: list[float] = field(default_factory=list)


def staged_statistics(url: str, statistics: str, rows: int, key: str) -> None:
    """PostgreSQL: the staged table's statistics (fresh: of `rows` rows of the write `key`),
    then autovacuum off so that they stay."""
    if statistics == "-":
        return
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE txtasks_staged SET (autovacuum_enabled = off)"))
            if statistics == "fresh":
                conn.execute(text(STAGE_LIKE.format(rows=rows, key=key)))
        with engine.begin() as conn:
            conn.execute(text("ANALYZE txtasks_staged"))
            conn.execute(text("DELETE FROM txtasks_staged"))
    finally:
        engine.dispose()


def commit_seconds(url: str, ended: float) -> float:
    """Seconds from the commit's start (its recorded time) to `ended` (a time.time())."""
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            started = conn.execute(text("SELECT committed_at FROM txtasks_commits")).scalar_one()
    finally:
        engine.dispose()
    return float(ended - started.replace(tzinfo=timezone.utc).timestamp())


def run_dedup(spark: Any, case: DedupCase, partitions: int, runs: int) -> None:
    from txtasks.spark.datasource import write_key

    df = spark.range(case.rows, numPartitions=partitions).selectExpr(
        "id AS order_id",
        "cast(div(id, 2) AS string) AS order_key",
        "concat('customer-', cast(id % 1000 AS string)) AS customer",
    )
    df = df.cache()
    df.count()
    for run in range(runs):
        prepare(case.url)
        commit_id = f"bench-dedup-{uuid.uuid4().hex}"
        staged_statistics(case.url, case.statistics, case.rows, write_key(commit_id))
        write = (
            df.write.format("txtasks")
            .option("url", case.url)
            .option("commit_id", commit_id)
            .option("task", "bench.order")
            .option("queue", "bench")
            .option("dedup", "order_key")
            .mode("append")
        )
        case.seconds.append(timed(write.save))
        case.commit.append(commit_seconds(case.url, time.time()))
        assert count(case.url, "txtasks_tasks") == (case.rows + 1) // 2
        log(
            f"{case.backend} {case.statistics} {case.rows:,} run {run + 1}: "
            f"{case.seconds[-1]:.2f} s, commit {case.commit[-1]:.2f} s"
        )
    df.unpersist()
    prepare(case.url)
    drop_bench_tables(case.url)


def dedup_report(cases: list[DedupCase], partitions: int, runs: int) -> str:
    lines = [
        f"dedup writes (each key twice), partitions {partitions}, runs {runs} (median), "
        "Spark local[2]",
        "",
        "| database | statistics | rows | write s | commit s | write / smallest's | rows ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    smallest: dict[tuple[str, str], DedupCase] = {}
    for case in sorted(cases, key=lambda c: (c.backend, c.statistics, c.rows)):
        base = smallest.setdefault((case.backend, case.statistics), case)
        seconds = statistics.median(case.seconds)
        ratio = seconds / statistics.median(base.seconds)
        lines.append(
            f"| {case.backend} | {case.statistics} | {case.rows:,} | {seconds:.2f} | "
            f"{statistics.median(case.commit):.2f} | {ratio:.2f}x | "
            f"{case.rows / base.rows:.0f}x |"
        )
    return "\n".join([*lines, "", machine()])


def machine() -> str:
    versions = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("pyspark", "sqlalchemy", "psycopg", "pymysql")
    )
    return f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {versions}"


def report(
    cases: list[Case], rows: int, partitions: int, runs: int, publishers: int, batch: int | None
) -> str:
    arrow = f"Arrow batches of {batch:,} rows" if batch else "Arrow batches of Spark's default"
    lines = [
        f"rows {rows:,}, partitions {partitions}, runs {runs} (median), Spark local[2], "
        f"{publishers} publishers, {arrow}",
        "",
        "| database | writer | rows/s | / JDBC plain | / best hand-built atomic | job s | "
        "commit s | job return to all claimable s | cleaner purge s | Python worker peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    per_run = []
    for case in cases:
        ran = [w for w in WRITERS if w in case.seconds]
        median = {w: statistics.median(case.seconds[w]) for w in ran}
        hands = [w for w in HAND_BUILT if w in median]
        best = min(median[w] for w in hands) if hands else None
        for writer in ran:
            shown = [
                f"{statistics.median(found):.2f}" if found else "-"
                for found in (case.commit.get(writer), case.claimable.get(writer))
            ]
            purged = case.purge.get(writer)
            shown.append(f"{statistics.median(purged):.3f}" if purged else "-")
            peaks = case.rss.get(writer)
            shown.append(f"{max(peaks):.0f}" if peaks else "-")
            to_jdbc = f"{median['jdbc'] / median[writer]:.2f}x" if "jdbc" in median else "-"
            to_hand = f"{best / median[writer]:.2f}x" if best is not None else "-"
            lines.append(
                f"| {case.backend} | {NAMES[writer]} | {rows / median[writer]:,.0f} | "
                f"{to_jdbc} | {to_hand} | {median[writer]:.2f} | {' | '.join(shown)} |"
            )
        found = []
        if hands and "atomic" in median:
            atomic = [
                min(case.seconds[w][run] for w in hands) / case.seconds["atomic"][run]
                for run in range(runs)
            ]
            found.append("atomic / best hand-built " + ", ".join(f"{a:.2f}x" for a in atomic))
        if "jdbc" in median and "deferred" in median:
            deferred = [
                case.seconds["jdbc"][run] / case.seconds["deferred"][run] for run in range(runs)
            ]
            found.append("deferred / JDBC plain " + ", ".join(f"{d:.2f}x" for d in deferred))
        if found:
            per_run.append(f"{case.backend}, per run: " + "; ".join(found))
    return "\n".join([*lines, "", *per_run, "", machine()])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--postgres-url", default=os.environ.get("TXTASKS_BENCH_POSTGRES_URL"))
    parser.add_argument("--mysql-url", default=os.environ.get("TXTASKS_BENCH_MYSQL_URL"))
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, help="also write the report here")
    parser.add_argument(
        "--publishers", type=int, default=2, help="publishers of the deferred writes"
    )
    parser.add_argument("--dedup", action="store_true", help="time dedup writes (see above)")
    parser.add_argument(
        "--local-infile",
        action="store_true",
        help="MariaDB/MySQL: txtasks writes with option local_infile (LOAD DATA LOCAL INFILE)",
    )
    parser.add_argument("--sizes", default="100000,1000000", help="rows of each dedup write")
    parser.add_argument(
        "--writers",
        default=",".join(WRITERS),
        help=f"the writers to run, of {', '.join(WRITERS)} (ratios need jdbc and a hand-built)",
    )
    parser.add_argument(
        "--arrow-batch-rows",
        type=int,
        help="rows per Arrow batch Spark hands a Python writer "
        "(spark.sql.execution.arrow.maxRecordsPerBatch; Spark's default: 10,000)",
    )
    args = parser.parse_args()
    writers = args.writers.split(",")
    unknown = sorted(set(writers) - set(WRITERS))
    if unknown:
        parser.error(f"--writers: unknown {', '.join(unknown)} (known: {', '.join(WRITERS)})")
    cases = [
        Case(b, u, local_infile=args.local_infile and b == "mysql")
        for b, u in (("postgresql", args.postgres_url), ("mysql", args.mysql_url))
        if u
    ]
    if not cases:
        parser.error("give --postgres-url and/or --mysql-url (or TXTASKS_BENCH_*_URL)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from txtasks.spark import register

    jars = ",".join(JARS[c.backend] for c in cases)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("txtasks-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.jars", jars)
    )
    if args.arrow_batch_rows:
        builder = builder.config(
            "spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch_rows)
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(DropSource)
    if args.dedup:
        dedup_cases = [
            DedupCase(c.backend, c.url, stats, int(size))
            for c in cases
            for stats in (("stale", "fresh") if c.backend == "postgresql" else ("-",))
            for size in args.sizes.split(",")
        ]
        for c in cases:  # untimed: the Python workers start
            run_dedup(spark, DedupCase(c.backend, c.url, "-", 1000), args.partitions, 1)
        for dedup_case in dedup_cases:
            run_dedup(spark, dedup_case, args.partitions, args.runs)
        spark.stop()
        text_report = dedup_report(dedup_cases, args.partitions, args.runs)
        print(text_report)
        if args.output:
            args.output.write_text(text_report + "\n")
        return
    df = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
        "id AS order_id",
        "concat('customer-', cast(id % 1000 AS string)) AS customer",
        "cast(id % 100 AS double) AS amount",
    )
    df = df.cache()
    df.count()
    for case in cases:
        run_case(spark, df, case, args.rows, args.runs, args.publishers, writers)
    spark.stop()
    text_report = report(
        cases, args.rows, args.partitions, args.runs, args.publishers, args.arrow_batch_rows
    )
    print(text_report)
    if args.output:
        args.output.write_text(text_report + "\n")


if __name__ == "__main__":
    main()
