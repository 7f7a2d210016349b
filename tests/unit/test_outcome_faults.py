"""Outcome writes under faults: a lost connection is never a verdict on a task."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.exc import DataError, InterfaceError, OperationalError

from tests.waiting import until
from txtasks import App, MemoryDriver, Reject, Worker, WorkerConfig
from txtasks.driver.memory import MemoryClaims, MemoryStore
from txtasks.faults import Outage, refused_value
from txtasks.testing import finished, run_until_empty


class DriverError(Exception):
    """Stands for a driver's own exception class with a SQLSTATE."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("exc", "refused"),
    [
        (ConnectionResetError("reset by peer"), False),
        (TimeoutError(), False),
        (OperationalError("UPDATE", {}, DriverError("server closed", "08006")), False),
        (InterfaceError("UPDATE", {}, DriverError("connection was closed", "08003")), False),
        (OperationalError("UPDATE", {}, DriverError("deadlock detected", "40P01")), False),
        (OperationalError("UPDATE", {}, DriverError("terminating connection", "57P01")), False),
        (DataError("UPDATE", {}, DriverError("value too long", "22001")), True),
        (DriverError("invalid byte sequence", "22021"), True),
        (ValueError("cannot encode"), True),
        (UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed"), True),
    ],
)
def test_only_a_refused_value_is_about_the_outcome(exc: BaseException, refused: bool) -> None:
    assert refused_value(exc) is refused


def with_claims(claims: Callable[[MemoryStore], MemoryClaims]) -> MemoryDriver:
    """A MemoryDriver whose claims are `claims`, built on its store."""
    driver = MemoryDriver()
    driver.claims = claims(driver.store)
    return driver


class FlappingClaims(MemoryClaims):
    """Every other outcome write loses its connection, as on a network resetting connections;
    every third write that fails had been stored before its answer was lost."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.calls = 0

    async def outcome_write_many(self, outcomes: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls % 2:
            if self.calls % 3 == 0:
                await super().outcome_write_many(outcomes, **kwargs)  # stored, answer lost
            raise InterfaceError("COMMIT", {}, DriverError("connection was closed", "08003"))
        return await super().outcome_write_many(outcomes, **kwargs)


async def test_a_flapping_connection_dead_letters_nothing(caplog: pytest.LogCaptureFixture) -> None:
    app = App(driver=with_claims(FlappingClaims))

    @app.task(name="work", max_attempts=1)
    async def work(payload: int) -> None: ...

    ids = await app.aenqueue_many([work.new(i) for i in range(40)])
    with caplog.at_level(logging.DEBUG, logger="txtasks.worker"):
        stats = await run_until_empty(app, flush_batch=4, flush_interval=0.001)
    assert {r.id for r in finished(app, "completed")} == set(ids)
    assert finished(app, "dead") == []
    assert stats.outcomes == {"completed": 40}
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in warnings if "fenced off" in r.getMessage()], "acks lost, not leases"
    assert [r.getMessage() for r in warnings if "writing outcomes" in r.getMessage()]


class PickyClaims(MemoryClaims):
    """Refuses any batch holding an outcome whose error mentions 'unstorable'; the write after
    the first refusal loses its connection."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.losses = 1
        self.lose_next = False

    async def outcome_write_many(self, outcomes: Any, **kwargs: Any) -> Any:
        if self.lose_next:
            self.lose_next = False
            raise ConnectionResetError("reset by peer")
        if any("unstorable" in (o.error or "") for o in outcomes):
            self.lose_next, self.losses = self.losses > 0, self.losses - 1
            raise DataError("UPDATE", {}, DriverError("value refused", "22P05"))
        return await super().outcome_write_many(outcomes, **kwargs)


async def test_only_the_refused_outcome_is_dead_lettered_with_its_reason() -> None:
    app = App(driver=with_claims(PickyClaims))

    @app.task(name="mixed", max_attempts=1)
    async def mixed(payload: int) -> None:
        if payload == 3:
            raise Reject("unstorable reason")

    ids = await app.aenqueue_many([mixed.new(i) for i in range(6)])
    await run_until_empty(app, flush_interval=0.05)
    dead = {r.id: r.last_error or "" for r in finished(app, "dead")}
    assert list(dead) == [ids[3]]
    assert "could not be stored: " in dead[ids[3]] and "value refused" in dead[ids[3]]
    assert "/" not in dead[ids[3]]  # no stack excerpt with file paths
    assert len(finished(app, "completed")) == 5


def test_an_outage_is_logged_once_when_lost_and_once_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage(logging.getLogger("txtasks.test"), "claiming")
    with caplog.at_level(logging.INFO, logger="txtasks.test"):
        for _ in range(50):
            outage.failed(ConnectionRefusedError(111, "Connection refused"), retry_in=1.0)
        outage.ok()
        outage.ok()
        outage.failed(TimeoutError())
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO", "WARNING"]
    assert "Connection refused" in lines[0][1] and "50 failure(s)" in lines[1][1]
    assert lines[2][1] == "claiming failed: TimeoutError"  # never an empty text


class DownClaims(MemoryClaims):
    """Claims work; every outcome write fails: the database went away after the claims."""

    async def outcome_write_many(self, outcomes: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")


async def test_a_stopping_worker_gives_up_on_an_absent_database_within_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App(driver=with_claims(DownClaims))

    @app.task(name="work")
    async def work(payload: int) -> None: ...

    await app.aenqueue_many([work.new(i) for i in range(3)])
    worker = Worker(app, WorkerConfig(poll_interval=0.01, flush_interval=0.001))
    worker._outcomes.drain = functools.partial(  # type: ignore[method-assign]
        worker._outcomes.drain, within=0.3
    )
    running = asyncio.create_task(worker.run())
    await until(lambda: worker.stats.started >= 3, "the three tasks to start", timeout=5)
    worker.stop()
    stats = await asyncio.wait_for(running, 5)
    assert stats.outcomes == {}  # nothing written, and nothing dead-lettered by the outage
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "3 outcome(s) not written, their tasks will be rescued when their leases expire: "
        "[Errno 111] Connection refused"
    ]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # the outage, once


async def test_a_library_record_of_a_connection_failure_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What asyncpg's pool logs with a traceback (its floor reconnect) is one line: the
    message and the real connection error."""
    import asyncio
    import logging

    from txtasks.faults import one_line_records

    one_line_records("asyncpg.pool")
    one_line_records("asyncpg.pool")  # once, however many pools
    assert len(logging.getLogger("asyncpg.pool").filters) == 1
    try:
        await asyncio.open_connection("127.0.0.1", 1)  # nothing listens on port 1
    except OSError:
        with caplog.at_level(logging.WARNING, "asyncpg.pool"):
            logging.getLogger("asyncpg.pool").warning(
                "Failed to restore the pool connection floor; retrying", exc_info=True
            )
    [record] = caplog.records
    assert record.exc_info is None and record.exc_text is None
    assert record.getMessage().startswith(
        "Failed to restore the pool connection floor; retrying: ConnectionRefusedError: "
    )
    assert "\n" not in caplog.text.strip()
