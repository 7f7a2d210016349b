"""`SqlDriver.retrying`: deadlocks and serialization failures are retried, nothing else is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy.exc import DBAPIError

from txtasks.driver.database import TRANSIENT_RETRIES
from txtasks.driver.postgresql import PostgresDriver


class PgError(Exception):
    """What asyncpg raises: the SQLSTATE in `sqlstate`."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"SQLSTATE {sqlstate}")
        self.sqlstate = sqlstate


def failing(times: int, error: Exception) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def once() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"

    return calls, once


@pytest.fixture
def driver() -> PostgresDriver:
    return PostgresDriver("postgresql://nobody@127.0.0.1:1/none")  # never connects


@pytest.mark.parametrize(
    "error",
    [
        PgError("40P01"),  # deadlock, raised by asyncpg itself (the raw pools)
        PgError("40001"),  # serialization failure
        DBAPIError("UPDATE", {}, PgError("40P01")),  # the same, as SQLAlchemy wraps it
    ],
    ids=["deadlock", "serialization", "wrapped"],
)
async def test_a_transient_failure_is_retried(driver: PostgresDriver, error: Exception) -> None:
    calls, once = failing(2, error)
    assert await driver.db.retrying(once) == "done"
    assert len(calls) == 3


async def test_other_failures_are_raised_at_once(driver: PostgresDriver) -> None:
    calls, once = failing(1, PgError("23505"))  # unique violation
    with pytest.raises(PgError, match="23505"):
        await driver.db.retrying(once)
    calls_wrapped, once_wrapped = failing(1, DBAPIError("INSERT", {}, PgError("23505")))
    with pytest.raises(DBAPIError):
        await driver.db.retrying(once_wrapped)
    assert (len(calls), len(calls_wrapped)) == (1, 1)


async def test_retries_end_with_the_last_failure(driver: PostgresDriver) -> None:
    calls, once = failing(TRANSIENT_RETRIES + 1, PgError("40P01"))
    with pytest.raises(PgError, match="40P01"):
        await driver.db.retrying(once)
    assert len(calls) == TRANSIENT_RETRIES


def test_mysql_tells_deadlocks_from_anything_else() -> None:
    from txtasks.driver.mysql import MySQLDialect

    assert MySQLDialect.error_is_transient(Exception(1213, "Deadlock found"))
    assert not MySQLDialect.error_is_transient(Exception(1062, "Duplicate entry"))
    assert not MySQLDialect.error_is_transient(ValueError(["not", "a", "code"]))
