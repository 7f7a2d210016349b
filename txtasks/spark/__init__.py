"""Spark integration: a PySpark data source that enqueues a DataFrame's rows as tasks.

    from txtasks.spark import register
    register(spark)
    (df.write.format("txtasks")
        .option("url", "postgresql://...").option("task", "orders.ship")
        .option("dedup", "order_id").mode("append").save())

Workers see nothing until the write commits and everything once it does: each partition
stages its rows in a transaction of its own, invisible to workers; the driver-side commit makes
them claimable in one transaction (once per commit id) and sends wake-ups; an abort deletes
them. Streaming queries use the same source (`df.writeStream.format("txtasks")`), committing
once per micro-batch. Needs `pip install "txtasks[spark]"`.
"""

from txtasks.spark.datasource import (
    SOURCE_NAME,
    TxtasksDataSource,
    TxtasksStreamWriter,
    TxtasksWriter,
    register,
)
from txtasks.spark.options import WriteOptions

__all__ = [
    "SOURCE_NAME",
    "TxtasksDataSource",
    "TxtasksStreamWriter",
    "TxtasksWriter",
    "WriteOptions",
    "register",
]
