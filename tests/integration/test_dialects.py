"""One SQL dialect object per database, picked once: the driver runs its statements, and an
enqueue in the application's own transaction runs its insert plan."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import oracle

import txtasks
from txtasks import ConfigurationError
from txtasks.driver import SqlDialect, dialect_for, driver_for_url
from txtasks.driver.mysql import MariaDBDialect, MySQLDialect


async def test_a_driver_and_the_application_s_transactions_share_one_dialect(
    database_url: str,
) -> None:
    driver = driver_for_url(database_url)
    engine = txtasks.create_engine(database_url)
    try:
        await driver.ping()  # the first connection settles the driver's SQL
        with engine.connect() as conn:
            assert dialect_for(conn.dialect) is driver.db.sql
        assert isinstance(driver.db.sql, SqlDialect)
        assert driver.capabilities is driver.db.sql.capabilities
    finally:
        engine.dispose()
        await driver.close()


@pytest.mark.mysql
async def test_a_mysql_url_on_mariadb_gets_mariadb_s_sql_once_connected(mysql_url: str) -> None:
    """The test server is MariaDB: INSERT ... RETURNING is used, though the URL says mysql."""
    driver = driver_for_url(mysql_url)
    try:
        assert type(driver.db.sql) is MySQLDialect  # all the URL tells
        await driver.ping()
        assert type(driver.db.sql) is MariaDBDialect
        assert driver.db.sql.returning_insert and not MySQLDialect.returning_insert
    finally:
        await driver.close()


def test_an_unsupported_database_is_named() -> None:
    with pytest.raises(ConfigurationError, match="unsupported database dialect 'oracle'"):
        dialect_for(oracle.dialect())
