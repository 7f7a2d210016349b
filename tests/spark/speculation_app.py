"""A Spark application that writes orders as tasks on a standalone cluster, with speculation.

    python -m tests.spark.speculation_app MASTER_URL

Run in a process of its own (one SparkContext per process; the other Spark tests hold a local
one), for as many writes as the test asks for on stdin (one JVM and its executors for all).
Each write has `PARTITIONS` partitions of `ROWS` orders; the last row's task is slow in its first
attempt (`tests.spark.helpers.slow_first_attempt`), so Spark starts a speculative copy of it on
the other worker. Once the write is saved, the answer lists the tasks Spark recorded for the
write's stages (its status store, through the REST API of the application's UI): index,
attempt, host, status and whether speculative, as Spark reports them.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests import pace

ROWS = 40
PARTITIONS = 4
#: Seconds to wait for the status store to record the write's tasks (listener events are
#: asynchronous: the save may return before they are processed).
RECORD_TIMEOUT = pace.seconds(20.0)
#: What the answer tells of each task (of the REST API's TaskData).
KEPT = ("index", "attempt", "host", "status", "speculative")

#: Speculation as eager as it goes: checked every 100 ms, of any task running for 100 ms once
#: half of its stage's tasks are done.
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "0.01",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "100ms",
    "spark.speculation.efficiency.enabled": "false",
}


def session(master: str) -> Any:
    from pyspark.sql import SparkSession

    root = str(Path(__file__).resolve().parents[2])  # executors import tests.spark.helpers
    builder = (
        SparkSession.builder.master(master)
        .appName("txtasks-speculation")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.port", "0")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.task.maxFailures", "2")
        .config("spark.locality.wait", "0")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", root)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in SPECULATION.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def write(
    spark: Any, url: str, markers: str, options: dict[str, str], slow_value: int = ROWS - 1
) -> None:
    """Write the orders 0 to ROWS - 1 as tasks; the first attempt of the task of the row
    `slow_value` is slow (none if no row has that value)."""
    from pyspark.sql import functions as F

    from tests.spark.helpers import slow_first_attempt
    from txtasks.spark import register

    register(spark)
    slow = F.udf(lambda v: slow_first_attempt(v, slow_value, markers), "long", useArrow=False)
    df = spark.range(ROWS, numPartitions=PARTITIONS).select(slow("id").alias("order_id"))
    (
        df.write.format("txtasks")
        .option("url", url)
        .option("task", "spark.order")
        .option("queue", "orders")
        .option("payload", "order_id")
        .options(**options)
        .mode("append")
        .save()
    )


#: Seconds one request to the application's UI may take (its REST API answers from memory,
#: but a JVM short of the CPU can be slow to).
GET_TIMEOUT = pace.seconds(10.0)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=GET_TIMEOUT) as response:
        return json.load(response)


def stage_tasks(api: str, stages: set[int]) -> list[dict[str, Any]]:
    """The tasks of `stages` as the status store lists them now."""
    tasks = []
    for stage in get(f"{api}/stages"):
        if stage["stageId"] in stages:
            listed = get(f"{api}/stages/{stage['stageId']}/{stage['attemptId']}/taskList")
            tasks += [{k: t.get(k) for k in KEPT} for t in listed]
    return tasks


def recorded_tasks(spark: Any, group: str) -> list[dict[str, Any]]:
    """The tasks of the job group's stages once none is still running, as the application's
    status store reports them (asked again after a request that timed out, until
    `RECORD_TIMEOUT`)."""
    context = spark.sparkContext
    api = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"
    tracker = context.statusTracker()
    stages = {s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds}
    deadline = time.monotonic() + RECORD_TIMEOUT
    while True:
        try:
            tasks, last = stage_tasks(api, stages), None
        except (TimeoutError, urllib.error.URLError) as error:  # URLError: a connect timed out
            tasks, last = [], error
        if tasks and all(t["status"] != "RUNNING" for t in tasks):
            return tasks
        if time.monotonic() > deadline:
            seen = f"the UI did not answer: {last}" if last else f"still running: {tasks}"
            raise TimeoutError(f"tasks after {RECORD_TIMEOUT:g}s: {seen}")
        time.sleep(0.1)


#: The executors of the application: one per worker of the cluster.
EXECUTORS = 2


def warm_up(spark: Any) -> dict[str, Any]:
    """Wait until both executors registered, write once to a database of its own (nothing
    slow) and read that write's tasks from the REST API, as after each write (within the same
    `RECORD_TIMEOUT`): each write then goes as quickly as the next (on a busy machine, the
    JVMs, the Python workers, the first plan and the API took minutes to start, and the first
    test waited for them). Returns the ready line."""
    from sqlalchemy import create_engine

    from txtasks.schema.migrate import migrate

    context = spark.sparkContext
    while len(context.statusTracker().getExecutorInfos()) < EXECUTORS + 1:  # and the driver
        time.sleep(0.1)
    context.setJobGroup("warm-up", "warm-up")
    with tempfile.TemporaryDirectory(prefix="txtasks-warm-up-") as folder:
        url = f"sqlite:///{folder}/warm-up.sqlite3"
        engine = create_engine(url)
        with engine.begin() as conn:
            migrate(conn)
        engine.dispose()
        write(spark, url, folder, {}, slow_value=-1)
    recorded_tasks(spark, "warm-up")  # the API's first answers, as each write's
    return {"ready": len(context.statusTracker().getExecutorInfos()) - 1}


def serve(master: str) -> None:
    """Say `{"ready": ...}` once the executors run Python, then run one write per line of
    stdin (`DATABASE_URL MARKERS [OPTION=VALUE...]`), answering each with a line of JSON on
    stdout: the write's tasks, or the error that failed it, and its MARKERS. Ends at the end of
    stdin."""
    spark = session(master)
    spark.sparkContext.setLogLevel("WARN")
    try:
        print(json.dumps(warm_up(spark)), flush=True)
        for number, line in enumerate(sys.stdin):
            url, markers, *pairs = line.split()
            options = dict(pair.split("=", 1) for pair in pairs)
            group = f"write-{number}"
            spark.sparkContext.setJobGroup(group, group)
            try:
                write(spark, url, markers, options)
                answer: dict[str, Any] = {"tasks": recorded_tasks(spark, group)}
            except Exception as error:  # the test shows it
                answer = {"error": f"{type(error).__name__}: {error}"}
            answer["markers"] = markers
            print(json.dumps(answer), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    serve(sys.argv[1])
