"""The connection budget and the transaction pooler: where they come from, how a driver
splits the budget among its pools, what it sends a pooler, and what is refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from txtasks import App, create_async_engine, create_engine
from txtasks.driver import driver_for_url
from txtasks.driver.pooling import ENV_CONNECTIONS, connections_resolve, pooler_of
from txtasks.driver.postgresql import RAW_SETTINGS, PostgresDatabase
from txtasks.driver.urls import url_async, url_sync
from txtasks.errors import ConfigurationError

PG = "postgresql://app:pw@db/app"
POOLED = f"{PG}?pooler=transaction&sslmode=require"


@pytest.fixture(autouse=True)
def no_budget_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """No budget from the environment; and whatever a flag sets there is undone after."""
    monkeypatch.setenv(ENV_CONNECTIONS, "")  # remembered: restored (or removed) at the end
    monkeypatch.delenv(ENV_CONNECTIONS)


def pg(url: str = PG, **options: Any) -> PostgresDatabase:
    db = driver_for_url(url, **options).db
    assert isinstance(db, PostgresDatabase)
    return db


# -- the pooler -------------------------------------------------------------------------------


def test_the_pooler_is_read_from_the_url_and_never_reaches_the_database_drivers() -> None:
    assert pooler_of(make_url(POOLED)) == ("transaction", make_url(f"{PG}?sslmode=require"))
    for value in ("session", "none", "NONE"):
        assert pooler_of(make_url(f"{PG}?pooler={value}"))[0] is None
    assert pooler_of(make_url(PG)) == (None, make_url(PG))
    for made in (url_sync(POOLED), url_async(POOLED)):
        assert dict(made.query) == {"sslmode": "require"}
    db = pg(POOLED)
    assert db.pooler == "transaction"
    assert db.url.query["pooler"] == "transaction"  # another driver from it gets it too
    assert pg(str(db.url)).pooler == "transaction"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"{PG}?pooler=statement", "pooler: expected transaction, session, none"),
        (f"{PG}?pooler=transaction&pooler=session", "pooler: given more than once"),
        ("sqlite:///x.db?pooler=transaction", "PostgreSQL only, not on sqlite"),
        ("mysql://app:pw@db/app?pooler=transaction", "PostgreSQL only, not on mysql"),
    ],
)
def test_a_pooler_txtasks_cannot_work_behind_is_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        driver_for_url(url)


def test_behind_a_transaction_pooler_nothing_is_kept_in_a_server_session() -> None:
    direct, pooled = pg(), pg(POOLED)
    assert "idle_in_transaction_session_timeout" in direct.server_settings()
    # PgBouncer refuses any of these in the startup packet
    assert pooled.server_settings() == {}
    async_args = pooled.connect_args(sync=False)
    assert async_args["server_settings"] == {}
    assert async_args["statement_cache_size"] == 0  # asyncpg: unnamed statements
    assert async_args["prepared_statement_cache_size"] == 0  # SQLAlchemy's cache above it
    assert pooled.connect_args(sync=True)["prepare_threshold"] is None  # psycopg: never
    assert "statement_cache_size" not in direct.connect_args(sync=False)
    assert "prepare_threshold" not in direct.connect_args(sync=True)
    # the asyncpg pools' settings go with each statement (SET LOCAL), not with the session
    assert pooled.raw_local and not direct.raw_local


def test_txtasks_engines_for_the_application_follow_the_pooler() -> None:
    sync = create_engine(POOLED)
    assert "pooler" not in sync.url.query
    sync.dispose()
    with pytest.raises(ConfigurationError, match="PostgreSQL only"):
        create_async_engine("sqlite+aiosqlite:///x.db?pooler=transaction")


def test_a_refused_startup_parameter_names_the_pooler_setting() -> None:
    from sqlalchemy.exc import DBAPIError

    refused = DBAPIError(None, None, Exception("unsupported startup parameter: x"))
    error = pg().connect_refused(refused)
    assert isinstance(error, ConfigurationError)
    assert "?pooler=transaction" in str(error)
    assert pg(POOLED).connect_refused(refused) is None  # not that, then
    assert pg().connect_refused(DBAPIError(None, None, Exception("password"))) is None


# -- the budget -------------------------------------------------------------------------------


def test_without_a_budget_each_pool_keeps_its_size() -> None:
    db = pg()
    assert db.connections is None and db.engine_connections() is None
    assert "pool_size" not in db._options(sync=False)
    assert not db.raw_shared


@pytest.mark.parametrize(
    ("budget", "engine", "shared"),
    [(3, 2, True), (4, 2, False), (5, 3, False), (10, 8, False)],
)
def test_postgresql_splits_the_budget_between_its_engine_and_asyncpg_pools(
    budget: int, engine: int, shared: bool
) -> None:
    db = pg(connections=budget)
    assert db.engine_connections() == engine
    assert db.raw_shared is shared
    raw = 1 if shared else len(RAW_SETTINGS)  # each pool at most one connection
    assert engine + raw == budget
    options = db._options(sync=False)
    assert (options["pool_size"], options["max_overflow"]) == (engine, 0)
    assert options["pool_timeout"] > db.timeouts.checkout  # the bound of checkout() stands
    assert db._options(sync=True)["pool_size"] == engine


@pytest.mark.parametrize(
    ("budget", "async_engine", "sync_engine", "shared"),
    [(5, 2, 2, True), (6, 2, 2, False), (8, 3, 3, False), (9, 4, 3, False)],
)
async def test_sync_handlers_split_the_engines_share_between_both_engines(
    budget: int, async_engine: int, sync_engine: int, shared: bool
) -> None:
    db = pg(connections=budget)
    await db.share_with_sync()
    assert db.sync_shared and db.raw_shared is shared
    assert (db.engine_connections(), db.engine_connections(sync=True)) == (
        async_engine,
        sync_engine,
    )
    raw = 1 if shared else len(RAW_SETTINGS)
    assert async_engine + sync_engine + raw == budget
    assert db._options(sync=True)["pool_size"] == sync_engine
    await db.close()


async def test_a_budget_too_small_for_both_engines_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"db_connections: at least 5 .* sync handlers"):
        await pg(connections=4).share_with_sync()
    unbounded = pg()
    await unbounded.share_with_sync()  # no budget: nothing to share
    assert not unbounded.sync_shared


def test_other_databases_give_the_engine_the_whole_budget() -> None:
    mysql = driver_for_url("mysql://app:pw@db/app", connections=2).db
    assert mysql.engine_connections() == 2
    assert mysql._options(sync=False)["pool_size"] == 2
    sqlite = driver_for_url("sqlite:///x.db", connections=3).db
    assert sqlite._options(sync=False)["pool_size"] == 3
    memory = driver_for_url("sqlite://", connections=3).db  # one connection by design
    assert "pool_size" not in memory._options(sync=False)


def test_the_environment_wins_over_code_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="txtasks.driver"):
        assert connections_resolve(6, {ENV_CONNECTIONS: "3"}) == 3
    assert "TXTASKS_DB_CONNECTIONS=3 used, over the 6 given in code" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="txtasks.driver"):
        assert connections_resolve(3, {ENV_CONNECTIONS: "3"}) == 3
        assert connections_resolve(None, {}) is None
        assert connections_resolve(5, {}) == 5
    assert caplog.text == ""  # nothing to say when they agree


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "nan", "many", "100000"])
def test_a_bad_budget_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigurationError, match=ENV_CONNECTIONS):
        connections_resolve(None, {ENV_CONNECTIONS: value})


def test_a_budget_below_what_the_pools_need_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="db_connections: at least 3"):
        driver_for_url(PG, connections=2)
    with pytest.raises(ConfigurationError, match="db_connections: at least 2"):
        driver_for_url("sqlite:///x.db", connections=1)
    assert driver_for_url("sqlite:///x.db", connections=2).connections == 2
    for bad in (0, 1.5, True):
        with pytest.raises(ConfigurationError, match="db_connections"):
            App(database_url=PG, db_connections=bad)  # type: ignore[arg-type]


def test_the_app_gives_its_budget_to_the_driver_it_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert App(database_url=PG, db_connections=5).driver.connections == 5  # type: ignore[attr-defined]
    monkeypatch.setenv(ENV_CONNECTIONS, "3")
    assert App(database_url=PG, db_connections=5).driver.connections == 3  # type: ignore[attr-defined]


def test_the_flag_reaches_every_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from cleaner.cli import cleaner
    from txtasks.cli.main import main

    runner = CliRunner()
    bad = runner.invoke(main, ["worker", "x:app", "--db-connections", "0"])
    assert bad.exit_code == 2
    assert "--db-connections" in bad.output
    with monkeypatch.context() as patched:
        patched.setattr("txtasks.cli.common.load_app", lambda spec: 1 / 0)
        runner.invoke(main, ["worker", "x:app", "--db-connections", "4"])
        assert driver_for_url(PG).connections == 4
    monkeypatch.delenv(ENV_CONNECTIONS)
    with monkeypatch.context() as patched:
        patched.setattr("cleaner.cli.load_app", lambda spec: 1 / 0)
        runner.invoke(cleaner, ["x:app", "--db-connections", "3"])
        assert driver_for_url(PG).connections == 3
