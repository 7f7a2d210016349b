"""Enqueue on the DB-API connection your code already has: here psycopg2 on PostgreSQL,
mysqlclient on MariaDB/MySQL, sqlite3 on SQLite. The enqueue is the same for every driver."""

import asyncio
import os
import sqlite3
import tempfile
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, make_url

from txtasks import App, DbapiTx, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
app = App("accounts", database_url=DATABASE_URL)
welcomed: list[str] = []


@app.task(queue="emails")
def send_welcome_email(payload: dict) -> None:
    welcomed.append(payload["email"])


metadata = MetaData()
users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("email", String(255), nullable=False),
)
engine = create_engine(DATABASE_URL)
with engine.begin() as conn:
    migrate(conn)  # the txtasks tables, as `txtasks migrate` does
    metadata.create_all(conn)
engine.dispose()


def connect(database_url: str) -> Any:
    """A connection of the driver your code uses (your framework hands you one)."""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        import psycopg2

        return psycopg2.connect(
            host=url.host, port=url.port, user=url.username, password=url.password,
            dbname=url.database,
        )  # fmt: skip
    if url.get_backend_name() == "mysql":
        import MySQLdb  # mysqlclient

        return MySQLdb.connect(
            host=url.host, port=url.port or 3306, user=url.username,
            password=url.password or "", database=url.database, charset="utf8mb4",
        )  # fmt: skip
    return sqlite3.connect(url.database)


connection = connect(DATABASE_URL)
with DbapiTx(connection) as tx:  # commits on exit, then wakes a worker
    cursor = connection.cursor()
    cursor.execute("INSERT INTO users (email) VALUES ('ada@example.com')")
    send_welcome_email.enqueue_tx(tx, {"email": "ada@example.com"})
connection.close()


async def main() -> None:
    await run_until_empty(app)  # what `txtasks worker` does, until nothing is due
    assert welcomed == ["ada@example.com"]
    await app.aclose()


asyncio.run(main())
