"""A worker or cleaner started while the database is unreachable waits for it (live, not
ready) instead of exiting; an error that waiting cannot mend still ends it at once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cleaner.daemon import Cleaner
from tests.waiting import until
from txtasks import App, MemoryDriver, Worker, WorkerConfig
from txtasks.errors import SchemaError
from txtasks.faults import unreachable


class LateDriver(MemoryDriver):
    """A store whose `open()` fails with `error` until `reachable` is set."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.reachable = asyncio.Event()
        self.tries = 0

    async def open(self) -> None:
        self.tries += 1
        if not self.reachable.is_set():
            raise self.error


def new_app(driver: MemoryDriver) -> App:
    app = App(driver=driver)
    app.task(name="t")(lambda payload: None)
    return app


class Refused(Exception):
    """A driver error as asyncpg raises it when the server is starting up."""

    sqlstate = "57P03"


@pytest.mark.parametrize(
    "error, waits",
    [
        (ConnectionRefusedError(111, "Connection refused"), True),
        (Refused("the database system is starting up"), True),
        (type("OperationalError", (Exception,), {})(2003, "Can't connect"), True),
        (SchemaError("run txtasks migrate"), False),
        (type("InvalidPasswordError", (Exception,), {"sqlstate": "28P01"})("bad"), False),
    ],
)
def test_which_errors_are_waited_out(error: Exception, waits: bool) -> None:
    assert unreachable(error) is waits


async def test_a_worker_waits_for_the_database_then_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = LateDriver(ConnectionRefusedError(111, "Connection refused"))
    app = new_app(driver)
    await app.tasks["t"].aenqueue(None)
    worker = Worker(app, WorkerConfig(poll_interval=0.01))
    caplog.set_level(logging.DEBUG, logger="txtasks.worker")
    running = asyncio.create_task(worker.run())
    await until(lambda: driver.tries >= 3, "three tries to reach the database")
    assert worker.liveness()["live"] is True and worker.liveness()["connecting"] is True
    assert not running.done()
    driver.reachable.set()
    await until(lambda: worker.stats.outcomes.get("completed") == 1, "the task to complete")
    worker.stop()
    await asyncio.wait_for(running, 5)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(":")[0] for r in warnings] == ["connecting to the database failed"]
    assert any("connecting to the database works again" in r.getMessage() for r in caplog.records)


async def test_a_worker_stopped_while_waiting_for_the_database_returns() -> None:
    driver = LateDriver(ConnectionRefusedError(111, "Connection refused"))
    worker = Worker(new_app(driver), WorkerConfig())
    running = asyncio.create_task(worker.run())
    await until(lambda: driver.tries >= 2, "two tries to reach the database")
    worker.stop()
    stats = await asyncio.wait_for(running, 5)
    assert stats.claimed == 0


@pytest.mark.parametrize("burst", [False, True])
async def test_an_error_waiting_cannot_mend_ends_the_worker_at_once(burst: bool) -> None:
    driver = LateDriver(SchemaError("database schema is at version 0: run `txtasks migrate`"))
    worker = Worker(new_app(driver), WorkerConfig(burst=burst))
    with pytest.raises(SchemaError):
        await asyncio.wait_for(worker.run(), 5)
    assert driver.tries == 1


async def test_a_burst_worker_does_not_wait_for_an_unreachable_database() -> None:
    driver = LateDriver(ConnectionRefusedError(111, "Connection refused"))
    worker = Worker(new_app(driver), WorkerConfig(burst=True))
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(worker.run(), 5)


async def test_a_cleaner_waits_for_the_database_then_starts() -> None:
    driver = LateDriver(ConnectionRefusedError(111, "Connection refused"))
    cleaner = Cleaner(new_app(driver))
    running = asyncio.create_task(cleaner.run())
    await until(lambda: driver.tries >= 3, "three tries to reach the database")
    assert cleaner.health() == {"live": True, "ready": False, "connecting": True, "sweeps": {}}
    driver.reachable.set()
    await until(lambda: cleaner._scheduler is not None, "the cleaner to schedule its sweeps")
    cleaner.request_stop()
    await asyncio.wait_for(running, 5)
