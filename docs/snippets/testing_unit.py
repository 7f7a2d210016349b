"""Unit tests on the in-memory driver: no database, no worker process (pytest, pytest-asyncio)."""

import pytest

from txtasks import App, MemoryDriver, TaskState
from txtasks.testing import enqueued, finished, payloads, run_until_empty

# The application under test; normally imported from your package.
app = App("shop", database_url="postgresql://db.internal/shop")


@app.task(name="emails.receipt", queue="emails")
def send_receipt(payload: dict) -> None:
    if not payload["email"]:
        raise ValueError("no e-mail address")


async def checkout(order_id: int, email: str) -> None:
    """Code under test: it enqueues a receipt."""
    await send_receipt.aenqueue({"order_id": order_id, "email": email})


@pytest.fixture(autouse=True)
def memory_driver() -> MemoryDriver:
    driver = MemoryDriver()
    app.use_driver(driver)  # tasks are stored in memory; the database is never touched
    return driver


@pytest.mark.asyncio
async def test_checkout_enqueues_a_receipt() -> None:
    await checkout(1, "ada@example.com")

    rows = enqueued(app, send_receipt)
    assert payloads(rows) == [{"order_id": 1, "email": "ada@example.com"}]
    assert rows[0].queue == "emails"


@pytest.mark.asyncio
async def test_receipts_run() -> None:
    await checkout(1, "ada@example.com")
    await checkout(2, "")

    stats = await run_until_empty(app)  # a worker in burst mode, in this process

    assert stats.outcomes == {"completed": 1, "retryable": 1}
    assert payloads(finished(app, TaskState.COMPLETED)) == [
        {"order_id": 1, "email": "ada@example.com"}
    ]
    [failed] = enqueued(app)  # still live: waiting for its retry
    assert failed.state is TaskState.RETRYABLE
    assert "no e-mail address" in failed.last_error


def test_the_handler_is_a_plain_function() -> None:
    send_receipt({"order_id": 1, "email": "ada@example.com"})
    with pytest.raises(ValueError, match="no e-mail address"):
        send_receipt({"order_id": 2, "email": ""})
