"""A commit that meets an application's transaction holding one of its dedup keys waits for it,
up to the write's option `lock_wait_timeout`, on every server database; past it the commit
fails naming the key and the option, and publishes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text

from tests import pace
from tests.conftest import backends
from tests.spark.test_spark_write import live_rows, state_counts
from txtasks import App
from txtasks.driver.urls import backend_name, url_sync

pytestmark = pytest.mark.parametrize("database_url", backends("postgresql", "mysql"), indirect=True)

#: The lock wait the write's connections start with (their command timeout): what a commit
#: would get from the session it inherits, without a bound of its own.
SESSION_WAIT = 1
#: How long the application holds the key once the commit waits for it: longer than that.
HOLD = 3.0
#: The dedup key the application holds, among the write's 0..5.
HELD = 3

#: Statements of this database that wait for a lock (the commit's, once it waits).
WAITING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
    "AND info LIKE 'INSERT IGNORE INTO txtasks_tasks%' AND time_ms > 200",
}


def keyed_writer(url: str, **options: str) -> Any:
    """A write of columns k (its dedup key) and v."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from txtasks.spark import WriteOptions
    from txtasks.spark.datasource import TxtasksWriter

    schema = StructType([StructField("k", LongType()), StructField("v", StringType())])
    given = {"url": url, "task": "spark.order", "dedup": "k", **options}
    return TxtasksWriter(WriteOptions.parse(given, schema))


def rows(count: int) -> Iterator[Any]:
    import pyarrow as pa

    return iter([pa.RecordBatch.from_pylist([{"k": n, "v": "spark"} for n in range(count)])])


def with_command_timeout(url: str, seconds: int) -> str:
    """`url` whose connections' command timeout (and so their lock wait) is `seconds`."""
    changed = make_url(url).update_query_dict({"command_timeout": str(seconds)})
    return changed.render_as_string(hide_password=False)


class Commit(threading.Thread):
    """A write's commit in a thread: its error, if any, and when it ended."""

    def __init__(self, writer: Any, message: Any) -> None:
        super().__init__(daemon=True)
        self.writer, self.message = writer, message
        self.error: BaseException | None = None
        self.ended: float | None = None

    def run(self) -> None:
        try:
            self.writer.commit([self.message])
        except BaseException as exc:  # reported to the test
            self.error = exc
        finally:
            self.ended = time.monotonic()


def wait_until_waiting(url: str, commit: Commit) -> float:
    """Wait until the commit waits for a lock (or ended); when it was seen waiting."""
    engine = create_engine(url_sync(url))
    try:
        deadline = time.monotonic() + pace.seconds(30)
        while time.monotonic() < deadline and commit.is_alive():
            with engine.connect() as conn:
                if conn.execute(text(WAITING[backend_name(url)])).scalar_one():
                    return time.monotonic()
            time.sleep(0.05)
    finally:
        engine.dispose()
    raise AssertionError(f"the commit never waited for the key (error: {commit.error!r})")


def app_holding_key(url: str) -> tuple[Any, Any]:
    """An application transaction that enqueued dedup key `HELD` and has not committed: its
    engine and its open transaction's connection."""
    engine = create_engine(url_sync(url))
    conn = engine.connect()
    conn.begin()
    app = App("spark-test", database_url=url)
    task = app.task(name="spark.order", queue="default")(lambda payload: None)
    task.enqueue_tx(conn, {"k": HELD, "v": "app"}, dedup_key=str(HELD))
    return engine, conn


def test_a_commit_waits_for_an_application_holding_a_key_longer_than_its_session_would(
    database_url: str,
) -> None:
    writer = keyed_writer(with_command_timeout(database_url, SESSION_WAIT))
    message = writer.write(rows(6))
    engine, app_conn = app_holding_key(database_url)
    try:
        commit = Commit(writer, message)
        commit.start()
        waiting_since = wait_until_waiting(database_url, commit)
        time.sleep(HOLD)  # the application's long transaction, well past SESSION_WAIT
        assert commit.is_alive(), f"the commit gave up waiting: {commit.error!r}"
        app_conn.commit()
    finally:
        app_conn.close()
        engine.dispose()
    commit.join(pace.seconds(30))
    assert commit.error is None
    assert commit.ended is not None and commit.ended - waiting_since >= HOLD

    live = {r["dedup_key"]: r for r in live_rows(database_url)}
    assert sorted(live) == [str(n) for n in range(6)]
    assert b'"app"' in bytes(live[str(HELD)]["payload"])  # the application's task won
    assert state_counts(database_url) == {"pending": 6}


def test_a_commit_that_waits_longer_than_its_option_fails_naming_the_key_and_the_option(
    database_url: str,
) -> None:
    from txtasks.spark import LockWaitTimeout

    writer = keyed_writer(database_url, lock_wait_timeout="1")
    message = writer.write(rows(6))
    engine, app_conn = app_holding_key(database_url)
    try:
        commit = Commit(writer, message)
        started = time.monotonic()
        commit.start()
        commit.join(pace.seconds(60))  # the application holds the key until the commit gave up
        assert not commit.is_alive()
        app_conn.commit()
    finally:
        app_conn.close()
        engine.dispose()
    assert isinstance(commit.error, LockWaitTimeout), repr(commit.error)
    error = str(commit.error)
    assert f"dedup key '{HELD}'" in error and "'lock_wait_timeout'" in error
    assert "waited 1 s" in error and "nothing was published" in error
    assert commit.ended is not None and commit.ended - started >= 1
    assert state_counts(database_url) == {"pending": 1}  # the application's task only


def test_the_default_bound_is_ten_minutes_or_the_databases_own_when_longer(
    database_url: str,
) -> None:
    """Without the option the bound is `LOCK_WAIT_TIMEOUT`, or the database's own when longer
    (here a database default of PostgreSQL's lock_timeout); the session is left as it was."""
    from txtasks.driver import driver_for_url
    from txtasks.spark.staging import LOCK_WAIT_TIMEOUT, staging_for

    url, backend = with_command_timeout(database_url, SESSION_WAIT), backend_name(database_url)
    engine = create_engine(url_sync(database_url))
    name = make_url(database_url).database
    session = {
        "postgresql": "SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout'",
        "mysql": "SELECT @@SESSION.innodb_lock_wait_timeout",
    }[backend]

    def bounds() -> tuple[float | None, float | None, int, int]:
        driver = driver_for_url(url)
        staging = staging_for(driver)
        try:
            with driver.db.sync_engine.connect() as conn:
                before = conn.exec_driver_sql(session).scalar_one()
                with staging.lock_waits(conn, None) as default:
                    pass
                with staging.lock_waits(conn, 5) as given:
                    pass
                after = conn.exec_driver_sql(session).scalar_one()
                return default, given, int(before), int(after)
        finally:
            driver.db.sync_engine.dispose()

    try:
        default, given, before, after = bounds()
        assert given == 5 and before == after
        if backend == "mysql":
            with engine.connect() as conn:
                server = conn.exec_driver_sql("SELECT @@GLOBAL.innodb_lock_wait_timeout")
                assert default == max(LOCK_WAIT_TIMEOUT, int(server.scalar_one()))
            assert before == SESSION_WAIT  # the command timeout's, put back
            return
        assert default == LOCK_WAIT_TIMEOUT
        with engine.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE \"{name}\" SET lock_timeout = '700s'")
            conn.commit()
        default, given, before, after = bounds()
        assert (default, before, after) == (700, 700_000, 700_000)
    finally:
        if backend == "postgresql":
            with engine.connect() as conn:
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" RESET lock_timeout')
                conn.commit()
        engine.dispose()
