"""A Spark job that enqueues one task per order when its write commits, then a streaming query."""

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from txtasks import App
from txtasks.spark import register
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers use it

app = App("shipping", database_url=DATABASE_URL)
shipped: list[int] = []


@app.task(name="orders.ship", queue="shipping")
def ship(payload: dict) -> None:
    shipped.append(payload["order_id"])


def spark_job() -> None:
    spark = SparkSession.builder.master("local[2]").appName("orders").getOrCreate()
    register(spark)  # makes format("txtasks") available in this session
    orders = spark.createDataFrame(
        [(1, "ada@example.com", 30.0, 1), (2, "bob@example.com", 12.5, 0)],
        "order_id LONG, email STRING, total DOUBLE, rush INT",
    )
    for _ in range(2):  # the second run finds every order_id live: nothing new
        (
            orders.write.format("txtasks")
            .option("url", DATABASE_URL)
            .option("task", "orders.ship")
            .option("queue", "shipping")
            .option("dedup", "order_id")  # the task's dedup key
            .option("priority", "rush")  # an integer column
            .mode("append")
            .save()
        )

    # Streaming: each micro-batch is committed once under its stream_id, across restarts.
    inbox = Path(tempfile.mkdtemp())
    (inbox / "orders-1.json").write_text(json.dumps({"order_id": 3, "email": "cy@example.com"}))
    query = (
        spark.readStream.schema("order_id LONG, email STRING")
        .json(str(inbox))
        .writeStream.format("txtasks")
        .option("url", DATABASE_URL)
        .option("task", "orders.ship")
        .option("queue", "shipping")
        .option("stream_id", "orders-inbox")  # stays the same across restarts
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


async def main() -> None:
    await app.amigrate()
    await asyncio.to_thread(spark_job)
    stats = await run_until_empty(app)  # a worker, until the queue is empty
    assert stats.outcomes == {"completed": 3}
    assert sorted(shipped) == [1, 2, 3]
    await app.aclose()


asyncio.run(main())
