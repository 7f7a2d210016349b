"""Spark integration: a PySpark data source that enqueues a DataFrame's rows as tasks.

    from txtasks.spark import register
    register(spark)
    (df.write.format("txtasks")
        .option("url", "postgresql://...").option("task", "orders.ship")
        .option("dedup", "order_id").mode("append").save())

Workers see nothing until the write commits and everything once it does: each partition
stages its rows in a transaction of its own, invisible to workers; the driver-side commit makes
them claimable in one transaction (once per commit id) and sends wake-ups, or with option
`publish` = "deferred" records the write and leaves its rows to publishers (workers, the
cleaner); an abort deletes them. Streaming queries use the same source (`df.writeStream.format("txtasks")`), committing
once per micro-batch. Needs `pip install "txtasks[spark]"`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txtasks.spark.datasource import (
        SOURCE_NAME,
        TxtasksDataSource,
        TxtasksStreamWriter,
        TxtasksWriter,
        register,
    )
    from txtasks.spark.options import WriteOptions
    from txtasks.spark.services import DeferredPublisher, PublishResult, PurgeResult, StagedPurge
    from txtasks.spark.staging import LockWaitTimeout, StagedRowsMissing, WriteClosed

#: The public names, by module: loaded (the data source with PySpark) when first used, so that
#: the services and the staging layer they use import without PySpark.
LAZY = {
    "DeferredPublisher": "txtasks.spark.services",
    "LockWaitTimeout": "txtasks.spark.staging",
    "StagedRowsMissing": "txtasks.spark.staging",
    "WriteClosed": "txtasks.spark.staging",
    "PublishResult": "txtasks.spark.services",
    "PurgeResult": "txtasks.spark.services",
    "StagedPurge": "txtasks.spark.services",
    "SOURCE_NAME": "txtasks.spark.datasource",
    "TxtasksDataSource": "txtasks.spark.datasource",
    "TxtasksStreamWriter": "txtasks.spark.datasource",
    "TxtasksWriter": "txtasks.spark.datasource",
    "register": "txtasks.spark.datasource",
    "WriteOptions": "txtasks.spark.options",
}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SOURCE_NAME",
    "DeferredPublisher",
    "LockWaitTimeout",
    "PublishResult",
    "PurgeResult",
    "StagedPurge",
    "StagedRowsMissing",
    "TxtasksDataSource",
    "TxtasksStreamWriter",
    "TxtasksWriter",
    "WriteClosed",
    "WriteOptions",
    "register",
]
