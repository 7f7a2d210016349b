"""Flask-SQLAlchemy: enqueue in `db.session`'s transaction, committed with your models."""

import asyncio
import tempfile

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from txtasks import App, TaskState, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = f"sqlite:///{tempfile.mkdtemp()}/shop.sqlite3"


class Base(DeclarativeBase):
    pass


flask_app = Flask(__name__)
flask_app.config["SQLALCHEMY_DATABASE_URI"] = DATABASE_URL
db = SQLAlchemy(flask_app, model_class=Base)
tasks = App("shop", database_url=DATABASE_URL)
sent: list[str] = []


class Order(db.Model):  # type: ignore[name-defined]
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]


@tasks.task(queue="emails")
def send_receipt(payload: dict) -> None:
    sent.append(payload["email"])


@flask_app.post("/orders/<email>")
def place_order(email: str) -> dict:
    order = Order(email=email)
    db.session.add(order)
    db.session.flush()  # the order's id
    # db.session() is the request's Session: the task joins its transaction
    task_id = send_receipt.enqueue_tx(db.session(), {"order_id": order.id, "email": email})
    db.session.commit()  # the order and its task together; the wake-up after the commit
    return {"order": order.id, "task": task_id}


with flask_app.app_context():
    with db.engine.begin() as conn:
        migrate(conn)  # the txtasks tables, as `txtasks migrate` does
    db.create_all()

task_id = flask_app.test_client().post("/orders/ada@example.com").get_json()["task"]


async def main() -> None:
    await run_until_empty(tasks)  # what `txtasks worker` does, until nothing is due
    row = await tasks.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.COMPLETED
    assert sent == ["ada@example.com"]
    await tasks.aclose()


asyncio.run(main())
