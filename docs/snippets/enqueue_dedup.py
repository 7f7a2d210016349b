"""Deduplication: one live task per key; a duplicate returns it and never aborts the transaction."""

import asyncio
import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from txtasks import App, TaskState, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

metadata = MetaData()
changes = Table(
    "profile_changes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("user_id", Integer, nullable=False),
    Column("field", String(50), nullable=False),
)

app = App("search", database_url=DATABASE_URL)
reindexed: list[int] = []


@app.task(queue="search")
def reindex_user(payload: dict) -> None:
    reindexed.append(payload["user_id"])


engine = create_engine(DATABASE_URL)
with engine.begin() as conn:
    migrate(conn)
    metadata.create_all(conn)


def change_profile(user_id: int, field: str) -> int:
    """Record a change and make sure one reindex of the user is pending."""
    with engine.begin() as conn:
        conn.execute(insert(changes).values(user_id=user_id, field=field))
        return reindex_user.enqueue_tx(
            conn, {"user_id": user_id}, dedup_key=f"reindex-user-{user_id}"
        )


first = change_profile(42, "name")
assert change_profile(42, "email") == first  # still live: the same task comes back
assert change_profile(42, "avatar") == first
with engine.connect() as conn:  # every change committed, duplicates or not
    assert conn.execute(select(func.count()).select_from(changes)).scalar_one() == 3


async def run_and_check() -> None:
    await run_until_empty(app)
    row = await app.driver.tasks.task_get(first)
    assert row is not None and row.state is TaskState.COMPLETED
    assert reindexed == [42]  # three changes, one reindex
    await app.aclose()


asyncio.run(run_and_check())

# The task finished, so the key is free again: the next change gets a new task.
assert change_profile(42, "bio") != first
engine.dispose()
