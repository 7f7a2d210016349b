"""Enqueue on a plain DB-API connection (here sqlite3), in the same transaction as your write."""

import asyncio
import sqlite3
import tempfile

from txtasks import App, DbapiTx, TaskState, create_engine, migrate
from txtasks.testing import run_until_empty

path = f"{tempfile.mkdtemp()}/example.sqlite3"
app = App("accounts", database_url=f"sqlite:///{path}")
welcomed: list[str] = []


@app.task(queue="emails")
def send_welcome_email(payload: dict) -> None:
    welcomed.append(payload["email"])


engine = create_engine(f"sqlite:///{path}")
with engine.begin() as conn:
    migrate(conn)  # the txtasks tables, as `txtasks migrate` does
engine.dispose()

connection = sqlite3.connect(path)
connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL)")

# Your write and the task commit together: `with DbapiTx(...)` commits the connection on exit
# (rolls it back on an exception), then sends the wake-ups.
with DbapiTx(connection) as tx:
    cursor = connection.execute("INSERT INTO users (email) VALUES (?)", ("ada@example.com",))
    task_id = send_welcome_email.enqueue_tx(
        tx, {"user_id": cursor.lastrowid, "email": "ada@example.com"}
    )

# Or commit yourself, and say so: the wake-ups go out only after `after_commit()`.
tx = DbapiTx(connection)
send_welcome_email.enqueue_tx(tx, {"email": "never@example.com"})
connection.rollback()
tx.after_rollback()  # nothing was written, no wake-up goes out
connection.close()


async def main() -> None:
    await run_until_empty(app)  # what `txtasks worker` does, until nothing is due
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.COMPLETED
    assert welcomed == ["ada@example.com"]
    await app.aclose()


asyncio.run(main())
