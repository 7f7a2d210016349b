"""A Spark job whose commit only records the write (publish = "deferred"): workers, or the
cleaner, publish its rows as tasks afterwards, evaluating dedup keys then."""

import asyncio
import os
import sys
import tempfile

from pyspark.sql import SparkSession

from txtasks import App
from txtasks.cleaner import ServiceSweep
from txtasks.spark import DeferredPublisher, register
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers use it

app = App("shipping", database_url=DATABASE_URL)
shipped: list[tuple[int, str]] = []


@app.task(name="orders.ship", queue="shipping")
def ship(payload: dict) -> None:
    shipped.append((payload["order_id"], payload.get("by", "spark")))


def spark_job() -> None:
    spark = SparkSession.builder.master("local[2]").appName("orders").getOrCreate()
    register(spark)
    orders = spark.createDataFrame([(n,) for n in range(1, 7)], "order_id LONG")
    (
        orders.write.format("txtasks")
        .option("url", DATABASE_URL)
        .option("task", "orders.ship")
        .option("queue", "shipping")
        .option("dedup", "order_id")
        .option("publish", "deferred")  # the commit records the write and returns
        .mode("append")
        .save()
    )
    spark.stop()


async def main() -> None:
    await app.amigrate()
    await asyncio.to_thread(spark_job)
    # Committed, not published yet: a worker that does not publish finds nothing to run.
    stats = await run_until_empty(app, services={"publisher": None})
    assert stats.outcomes == {}
    # The application enqueues order 3 itself before any publisher ran: its task is live when
    # the write's row with that dedup key is published, so it wins.
    await ship.aenqueue({"order_id": 3, "by": "app"}, dedup_key="3")
    published = await ServiceSweep(app, DeferredPublisher()).run_once()  # as a cleaner runs it
    assert (published.rows, published.tasks) == (6, 5)  # order 3's row: its key was live
    stats = await run_until_empty(app)  # a worker (it would publish too)
    assert stats.outcomes == {"completed": 6}
    assert sorted(shipped) == [(1, "spark"), (2, "spark"), (3, "app"), (4, "spark"),
                               (5, "spark"), (6, "spark")]  # fmt: skip
    await app.aclose()


asyncio.run(main())
