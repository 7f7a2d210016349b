"""Staged rows written by schema version 15 (keyed by id, write key and stage id) survive the
move to `(stage, n)` keys and the migrations after it (17: no times of their own): an open
write's attempts still commit, and a deferred commit's rows still publish, each exactly once and
in staging order, on every database."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import Engine, MetaData, create_engine, select, table, text
from sqlalchemy.sql import column

from tests.conftest import reset_schema
from tests.integration.test_staging_conformance import (
    T0,
    TARGET,
    at,
    attempt,
    claim,
    ledger,
    staged_rows,
    table_rows,
)
from txtasks.driver import driver_for_url
from txtasks.driver.urls import url_sync
from txtasks.schema.migrate import latest_version, migrate, migrate_sql
from txtasks.schema.tables import deferred, stages
from txtasks.spark.staging import DROPPED, staging_for, target_json
from txtasks.spark.staging.publisher import publish_pending

#: The staged table of version 15.
V15_COLUMNS = ("write_key", "stage_id", "payload", "priority", "run_at", "dedup_key")
STAGED_V15 = table(
    "txtasks_staged", *(column(c) for c in (*V15_COLUMNS, "created_at", "partition_key"))
)
DEFERRED_V15 = table(
    "txtasks_deferred",
    *(column(c) for c in ("stage_id", "write_key", "commit_id", "target", "committed_at")),
)


def at_version_15(url: str) -> Engine:
    """An empty database at schema version 15."""
    reset_schema(url)
    engine = create_engine(url_sync(url))
    with engine.begin() as conn:
        found = MetaData()
        found.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
        found.drop_all(conn)
    with engine.begin() as conn:
        migrate(conn, target=15)
    return engine


def v15_rows(write_key: str, stage_id: str, values: list[str]) -> list[dict[str, object]]:
    return [
        {
            "write_key": write_key,
            "stage_id": stage_id,
            "payload": json.dumps({"v": v}).encode(),
            "priority": 0,
            "run_at": T0,
            "dedup_key": None,
            "created_at": T0,
            "partition_key": None,
        }
        for v in values
    ]


async def test_staged_rows_of_version_15_commit_and_publish_once_after_the_upgrade(
    database_url: str,
) -> None:
    engine = at_version_15(database_url)
    try:
        with engine.begin() as conn:
            # an open write: attempt a (reported by the commit to come) and a loser, b; rows
            # of the two interleaved, as concurrent attempts stage them
            conn.execute(text("INSERT INTO txtasks_writes VALUES ('open', :t)"), {"t": T0})
            a, b = (
                v15_rows("open", "open.a", ["a0", "a1", "a2"]),
                v15_rows("open", "open.b", ["b0"]),
            )
            conn.execute(STAGED_V15.insert(), [a[0], b[0], a[1], a[2]])
            # a deferred commit of another write, not published yet: 5 rows in one attempt
            conn.execute(
                STAGED_V15.insert(), v15_rows("done", "done.a", [f"d{i}" for i in range(5)])
            )
            conn.execute(
                DEFERRED_V15.insert(),
                {
                    "stage_id": "done.a",
                    "write_key": "done",
                    "commit_id": "c-done",
                    "target": target_json(TARGET),
                    "committed_at": T0,
                },
            )
            conn.execute(text("INSERT INTO txtasks_commits VALUES ('c-done', :t, 5)"), {"t": T0})
        with engine.begin() as conn:
            # 16 and every migration after it, with the rows of version 15 there
            assert [m.version for m in migrate(conn)] == list(range(16, latest_version() + 1))
    finally:
        engine.dispose()

    sql = driver_for_url(database_url)
    await sql.open()
    try:
        staging = staging_for(sql)
        assert staged_rows(staging) == {"open.a": 3, "open.b": 1, "done.a": 5}
        waiting = select(stages.c.stage_id, deferred.c.commit_id).join_from(
            deferred, stages, deferred.c.stage == stages.c.id
        )
        assert table_rows(staging, waiting) == [("done.a", "c-done")]

        # the open write's commit publishes its reported attempt, in staging order
        assert staging.commit("c-open", "open", {"open.a": 3}, TARGET, now=at(1)) == {"q": 3}
        rows = await claim(sql)
        assert [json.loads(r.payload)["v"] for r in rows] == ["a0", "a1", "a2"]

        # the deferred commit publishes in batches of 2 (the last one resumes at d4)
        done = await publish_pending(sql, clock=lambda: at(2), wake=lambda _q: None, limit=2)
        assert (done.rows, done.tasks, done.batches) == (5, 5, 3)
        rows = await claim(sql)
        assert [json.loads(r.payload)["v"] for r in rows] == [f"d{i}" for i in range(5)]
        assert staged_rows(staging) == {} and table_rows(staging, waiting) == []
        of_a_write = select(stages.c.stage_id).where(stages.c.write_key != DROPPED)
        assert table_rows(staging, of_a_write) == []  # the open write's: ended by its commit
        assert ledger(staging) == {"c-done": 5, "c-open": 3}

        # a new attempt of a write staged after the upgrade takes a number of its own
        staging.open("next", T0)
        assert staging.stage("next", "next.a", [attempt(["n0"])]) == 1
        assert staging.commit("c-next", "next", {"next.a": 1}, TARGET, now=at(3)) == {"q": 1}
        assert [json.loads(r.payload)["v"] for r in await claim(sql)] == ["n0"]
    finally:
        await sql.close()


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_every_table_the_upgrade_creates_has_a_primary_key(dialect: str) -> None:
    """Those it sets rows aside in too: MySQL with `sql_require_primary_key` and MariaDB with
    `innodb_force_primary_key` refuse a table without one. (Neither can be set for one
    session on the test servers: MariaDB's is global, MySQL's needs a privilege.)"""
    created = re.findall(r"CREATE TABLE (\w+) \((.*?)\n\)", migrate_sql(dialect, since=15), re.S)
    assert {name for name, _ in created} >= {"txtasks_staged", "txtasks_staged_moved"}
    assert [name for name, body in created if "PRIMARY KEY" not in body] == []
