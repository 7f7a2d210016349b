"""Publish with an AsyncSession, in bulk: one statement for the whole batch, whatever the number
of groups; one wake-up per group's queue after the commit."""

import asyncio
import os
import tempfile

from sqlalchemy.ext.asyncio import AsyncSession

from txtasks import App, create_async_engine
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("catalog", database_url=DATABASE_URL)
indexed: list[str] = []
cached: list[str] = []


@app.task(queue="search", subscribe="product.changed", group="search")
async def reindex(product: dict) -> None:
    indexed.append(product["sku"])


@app.task(queue="cache", subscribe="product.changed", group="cache")
async def purge(product: dict) -> None:
    cached.append(product["sku"])


async def main() -> None:
    await app.amigrate()
    await app.topics.asubscribe()
    engine = create_async_engine(DATABASE_URL)
    skus = [f"sku-{n}" for n in range(100)]
    async with AsyncSession(engine) as session, session.begin():
        batch = [app.topics.new_publish("product.changed", {"sku": s}, priority=5) for s in skus]
        found = await app.topics.apublish_many_tx(session, batch)  # each publish's task ids
    assert [len(ids) for ids in found] == [2] * 100

    await run_until_empty(app)
    assert sorted(indexed) == sorted(cached) == sorted(skus)
    await engine.dispose()
    await app.aclose()


asyncio.run(main())
