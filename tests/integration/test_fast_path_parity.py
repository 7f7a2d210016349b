"""PostgreSQL's asyncpg fast path gives the same rows as the statements it mirrors.

`PostgresDriver` claims (`CLAIM_SQL`, `CLAIM_IDS_SQL`, `KEYS_LOOK_SQL`, `HINTS_TAKE`) and
finishes outcomes (`FINISH_SQL`) with raw asyncpg statements, for speed; the generic SQL path
(`SqlDriver`, `SqlDialect`) does the same with SQLAlchemy statements on every other database.
One workload runs on each, from the same empty schema and the same clock: enqueues with and
without keys, claims of a few rows at a time under key limits, outcomes of every kind. The
claims must hand out the same tasks in the same order, and the tables must end up the same.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from tests.conftest import reset_schema
from txtasks.driver.postgresql import PostgresDriver
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sql_claims import SqlClaims
from txtasks.driver.urls import url_sync
from txtasks.keys import KeyLimits
from txtasks.schema.tables import archive, key_hints, keys, tasks
from txtasks.types import NewTask, Outcome, OutcomeKind

pytestmark = [pytest.mark.postgresql, pytest.mark.timeout(120)]

T0 = datetime(2030, 1, 1)
LIMITS = {"keyed": KeyLimits(concurrency=1)}
QUEUES = ["plain", "keyed"]
#: Outcomes by claim position, in turn: every kind the worker writes.
KINDS = [
    OutcomeKind.COMPLETE,
    OutcomeKind.RETRY,
    OutcomeKind.COMPLETE,
    OutcomeKind.DEAD,
    OutcomeKind.DISCARD,
    OutcomeKind.FAIL,
    OutcomeKind.RELEASE,
    OutcomeKind.CANCEL,
]


class GenericDriver(PostgresDriver):
    """PostgreSQL through the generic SQL path only: the claims role (and its lanes) every
    database shares, instead of PostgreSQL's single asyncpg statements."""

    claims_class = SqlClaims


def workload_rows() -> list[NewTask]:
    rows = []
    for i in range(40):
        keyed = i % 3 == 0
        rows.append(
            NewTask(
                queue="keyed" if keyed else "plain",
                task_name="t",
                payload=f'{{"n":{i}}}'.encode(),
                content_type="application/json",
                priority=i % 4,
                run_at=T0 - timedelta(seconds=i % 7),
                max_attempts=2,
                created_at=T0,
                partition_key=f"k{i % 4}" if keyed else None,
            )
        )
    return rows


async def run_workload(driver: SqlDriver) -> list[list[tuple[int, int, str]]]:
    """Claims of 5 at a time until none is left, each batch's outcomes written; the claims."""
    await driver.open()
    try:
        ids = await driver.tasks.task_insert_many(workload_rows())
        claims: list[list[tuple[int, int, str]]] = []
        now = T0
        for turn in range(200):
            now += timedelta(seconds=10)  # past every retry's backoff below
            lease_until = now + timedelta(seconds=30)
            rows = await driver.claims.task_claim_ids(  # as named by a wake-up: some of them
                QUEUES,
                ids[turn * 3 : turn * 3 + 4],
                now=now,
                lease_until=lease_until,
                worker_id="w",
            )
            rows += await driver.claims.task_claim_many(
                QUEUES, 5, now=now, lease_until=lease_until, worker_id="w", keys=LIMITS
            )
            if not rows:
                break
            claims.append([(r.id, r.attempt, r.queue) for r in rows])
            outcomes = [
                Outcome(
                    r.key,
                    KINDS[(r.id + turn) % len(KINDS)],  # a release comes back
                    error=f"boom at turn {turn}",
                    run_at=now + timedelta(seconds=1),
                )
                for r in rows
            ]
            result = await driver.claims.outcome_write_many(outcomes, now=now, worker_id="w")
            assert result.stale == ()
        else:
            raise AssertionError("the workload never ran dry")
        return claims
    finally:
        await driver.close()


def tables(url: str) -> dict[str, list[Any]]:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            return {
                t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key))]
                for t in (tasks, archive, keys, key_hints)
            }
    finally:
        engine.dispose()


async def test_the_fast_path_claims_and_finishes_as_the_generic_statements_do(
    postgres_url: str,
) -> None:
    found = {}
    for name, cls in (("fast", PostgresDriver), ("generic", GenericDriver)):
        reset_schema(postgres_url)
        claims = await run_workload(cls(postgres_url))
        found[name] = (claims, tables(postgres_url))
    (fast_claims, fast_tables), (generic_claims, generic_tables) = found["fast"], found["generic"]
    assert len(fast_claims) > 5 and any(q == "keyed" for b in fast_claims for _, _, q in b)
    assert fast_claims == generic_claims
    for table in fast_tables:
        assert fast_tables[table] == generic_tables[table], table
    assert fast_tables[archive.name], "outcomes archived nothing"
