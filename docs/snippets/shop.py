"""shop.py: the application, its own table, and one task."""

import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table

from txtasks import App, create_engine

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.gettempdir()}/txtasks-shop.sqlite3"
)

# A SQLAlchemy engine on txtasks' driver (on SQLite: WAL, busy timeout, BEGIN IMMEDIATE).
engine = create_engine(DATABASE_URL)

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("email", String(255), nullable=False),
    Column("total_cents", Integer, nullable=False),
)

app = App("shop", database_url=DATABASE_URL)


@app.task(queue="emails", max_attempts=10)
def send_confirmation(payload: dict) -> None:
    """Runs in a worker, only once the order's transaction has committed."""
    # Call your mail provider here. Delivery is at-least-once: make it safe to repeat.
    print(f"order {payload['order_id']}: confirmation sent to {payload['email']}")
