"""Enqueue on a SQLAlchemy Connection, in the same transaction as your own write."""

import asyncio
import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from txtasks import App, TaskState, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

metadata = MetaData()
users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("email", String(255), nullable=False),
)

app = App("accounts", database_url=DATABASE_URL)
welcomed: list[str] = []


@app.task(queue="emails")
def send_welcome_email(payload: dict) -> None:
    welcomed.append(payload["email"])


# A SQLAlchemy engine on txtasks' driver (on SQLite: WAL, busy timeout, BEGIN IMMEDIATE).
engine = create_engine(DATABASE_URL)

with engine.begin() as conn:
    migrate(conn)  # the txtasks tables, as `txtasks migrate` does
    metadata.create_all(conn)

# The user row and its task commit together, or not at all.
with engine.begin() as conn:
    result = conn.execute(insert(users).values(email="ada@example.com"))
    user_id = result.inserted_primary_key[0]
    task_id = send_welcome_email.enqueue_tx(conn, {"user_id": user_id, "email": "ada@example.com"})


async def main() -> None:
    await run_until_empty(app)  # what `txtasks worker` does, until nothing is due
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.COMPLETED
    assert welcomed == ["ada@example.com"]
    await app.aclose()


asyncio.run(main())
engine.dispose()
