"""MariaDB / MySQL staging by LOAD DATA LOCAL INFILE (the data source's option `local_infile`):
on a connection opened with `local_infile`, the same rows go in as by multi-row INSERTs, and a
row the server would change fails the batch."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import Connection, event, make_url, select, text

from tests.conftest import SPARK_GROUP, backends
from tests.integration.test_staging_conformance import (
    AWKWARD,
    T0,
    TARGET,
    attempt,
    keyed_attempt,
    table_rows,
)
from txtasks.driver import SqlDriver, driver_for_url
from txtasks.schema.tables import staged, stages, tasks
from txtasks.spark.staging import SqlStaging, staging_for
from txtasks.spark.staging.mysql import StagingWarning

pytestmark = [
    pytest.mark.parametrize("database_url", backends("mysql"), indirect=True),
    # in the process of the Spark tests: with a Spark write's (`local_infile`), these are the
    # only tests that run LOAD DATA, and both count them with the server's counter (Com_load)
    pytest.mark.xdist_group(SPARK_GROUP),
]

#: Values LOAD DATA's text format must escape, a value that reads as its NULL, an empty key.
HARD = [*AWKWARD, "\\N", "NULL", "a\tb", "nul\0byte", "trailing\\"]


def loads(conn: Connection) -> int:
    """LOAD DATA statements the server has run (all sessions, every database)."""
    return int(conn.execute(text("SHOW GLOBAL STATUS LIKE 'Com_load'")).one()[1])


@pytest.fixture
async def loading(database_url: str) -> AsyncIterator[SqlStaging]:
    """The staging on a driver whose connections are opened with `local_infile`."""
    url = make_url(database_url).update_query_dict({"local_infile": "1"})
    driver = driver_for_url(url.render_as_string(hide_password=False))
    await driver.open()
    yield staging_for(driver)
    await driver.close()


def rows_of(staging: SqlStaging, stage_id: str) -> list[Any]:
    """The staged rows of an attempt, in order, without their key."""
    s = staged.c
    query = (
        select(s.payload, s.priority, s.run_at, s.dedup_key, s.partition_key)
        .join_from(staged, stages, s.stage == stages.c.id)
        .where(stages.c.stage_id == stage_id)
        .order_by(s.n)
    )
    return table_rows(staging, query)


async def test_load_data_stages_the_rows_an_insert_stages(
    sql: SqlDriver, staging: SqlStaging, loading: SqlStaging
) -> None:
    keyed = [
        (v, None if n % 3 else f"k{n}", [None, "", f"key\t{n}"][n % 3]) for n, v in enumerate(HARD)
    ]
    batches = [keyed_attempt(keyed[:5]), keyed_attempt(keyed[5:])]
    late = attempt(["later"], run_at=T0 + timedelta(microseconds=7))
    staging.open("w", T0)
    with staging.driver.sync_engine.connect() as conn:
        before = loads(conn)

    assert (
        loading.stage("w", "w.load", [*batches, late.append_column("partition_key", pa.nulls(1))])
        == len(HARD) + 1
    )
    assert (
        staging.stage("w", "w.insert", [*batches, late.append_column("partition_key", pa.nulls(1))])
        == len(HARD) + 1
    )

    with staging.driver.sync_engine.connect() as conn:
        assert loads(conn) - before == 3  # one per batch, by LOAD DATA
    loaded, inserted = rows_of(staging, "w.load"), rows_of(staging, "w.insert")
    assert loaded == inserted
    assert [json.loads(r.payload)["v"] for r in loaded] == [*HARD, "later"]
    assert [r.partition_key for r in loaded[:3]] == [None, "", "key\t2"]
    assert loaded[-1].run_at == T0 + timedelta(microseconds=7)

    assert staging.commit("c", "w", {"w.load": len(HARD) + 1}, TARGET, now=T0) == {
        "q": len(HARD) + 1
    }
    published = select(tasks.c.payload, tasks.c.partition_key).order_by(tasks.c.id)
    assert [(json.loads(p)["v"], k) for p, k in table_rows(staging, published)] == [
        (json.loads(r.payload)["v"], r.partition_key) for r in loaded
    ]


async def test_a_row_load_data_would_change_fails_its_batch(
    staging: SqlStaging, loading: SqlStaging
) -> None:
    """A value the staged table cannot hold as it is (here a task key longer than its column,
    which a lenient server cuts short with a warning) stages nothing."""
    lenient = loading.driver.sync_engine

    def no_strict_mode(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")

    event.listen(lenient, "connect", no_strict_mode)
    lenient.dispose()  # every connection from now on is lenient
    staging.open("w", T0)
    too_long = keyed_attempt([("a", None, "x" * 300)])

    truncated = r"LOAD DATA loaded 1 of 1 rows \(first warning: 1265 Data truncated for column"
    with pytest.raises(StagingWarning, match=truncated + " 'partition_key'"):
        loading.stage("w", "w.a", [too_long])

    assert rows_of(staging, "w.a") == []
