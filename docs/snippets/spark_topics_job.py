"""A Spark job that publishes each order to a topic when its write commits: every group
subscribed at that moment gets one task per row; a re-run with the dedup column adds nothing."""

import asyncio
import os
import sys
import tempfile

from pyspark.sql import SparkSession

from txtasks import App, TaskContext
from txtasks.spark import register
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers use it

app = App("orders", database_url=DATABASE_URL)
handled: list[tuple[str, int]] = []


@app.task(queue="billing", subscribe="order.created", group="billing")
def bill(order: dict, ctx: TaskContext) -> None:
    handled.append((ctx.headers["txtasks-group"], order["order_id"]))


@app.task(queue="shipping", subscribe="order.created", group="shipping")
def ship(order: dict, ctx: TaskContext) -> None:
    handled.append((ctx.headers["txtasks-group"], order["order_id"]))


def spark_job() -> None:
    spark = SparkSession.builder.master("local[2]").appName("orders").getOrCreate()
    register(spark)
    orders = spark.createDataFrame(
        [(1, "customer-7"), (2, "customer-7"), (3, "customer-9")],
        "order_id LONG, customer STRING",
    )
    for _ in range(2):  # the second run finds every group's task of each order live
        (
            orders.write.format("txtasks")
            .option("url", DATABASE_URL)
            .option("topic", "order.created")  # instead of a task name and queue
            .option("dedup", "order_id")  # per group: billing/1, shipping/1, ...
            .option("key", "customer")  # each group's queue applies its own key limits
            .mode("append")
            .save()
        )
    spark.stop()


async def main() -> None:
    await app.amigrate()
    await app.topics.asubscribe()  # a worker of these queues does this at its start
    await asyncio.to_thread(spark_job)
    stats = await run_until_empty(app)
    assert stats.outcomes == {"completed": 6}  # 3 orders x 2 groups
    assert sorted(handled) == [(g, n) for g in ("billing", "shipping") for n in (1, 2, 3)]
    await app.aclose()


asyncio.run(main())
