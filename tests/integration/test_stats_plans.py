"""What `txtasks status`, the cleaner's metrics and the KEDA example read, on PostgreSQL with
many more rows than they look at: every statement reads an index, never the whole table.

The tables hold 100,000 processing tasks and 100,000 archived ones enqueued and finished long
ago, beside a few hundred ready tasks and a few dozen recent arrivals and finishes: with
statistics taken, a plan that scans a table is what the planner would pick if the statement
could not use an index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Connection, Engine, create_engine, event, text

from tests.conftest import reset_schema
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.driver.sql_admin import (
    stmt_arrivals_and_finishes,
    stmt_newest_before,
    stmt_ready_due,
)
from txtasks.driver.urls import url_sync
from txtasks.types import QueueRates

pytestmark = pytest.mark.postgresql

OLD = 100_000
KEDA = Path(__file__).parents[2] / "deploy" / "kubernetes" / "keda" / "worker-scaledobject.yaml"

TASKS = """
INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority, run_at,
    attempt, max_attempts, created_at, partition_key)
SELECT 'orders', 't', 'null', 'application/json', :state, 0, :run_at, 0, 3, :created_at,
    CASE WHEN :keyed THEN 'k' || (n % 7) END
FROM generate_series(1, :n) AS n
"""
ARCHIVE = """
INSERT INTO txtasks_archive (id, queue, task_name, payload, content_type, state, priority,
    run_at, attempt, max_attempts, created_at, finished_at)
SELECT :first + n, 'orders', 't', 'null', 'application/json', :state, 0, :at, 1, 3, :at, :at
FROM generate_series(1, :n) AS n
"""


@pytest.fixture(scope="module")
def filled(postgres_url: str) -> Iterator[tuple[str, Engine, datetime]]:
    reset_schema(postgres_url)
    engine = create_engine(url_sync(postgres_url))
    now = utcnow()
    long_ago = now - timedelta(days=2)
    with engine.begin() as conn:

        def tasks(n: int, state: str, run_at: datetime, created_at: datetime, keyed: bool) -> None:
            values = {"n": n, "state": state, "run_at": run_at, "created_at": created_at}
            conn.execute(text(TASKS), {**values, "keyed": keyed})

        tasks(OLD, "processing", long_ago, long_ago, False)
        tasks(300, "pending", now - timedelta(minutes=5), long_ago, False)
        tasks(100, "retryable", now - timedelta(minutes=1), long_ago, True)
        tasks(50, "pending", now + timedelta(hours=1), long_ago, False)  # not due
        tasks(20, "pending", now - timedelta(seconds=10), now - timedelta(seconds=10), False)
        for first, n, state, at in (
            (10_000_000, OLD, "completed", long_ago),
            (20_000_000, 30, "completed", now - timedelta(seconds=5)),
            (30_000_000, 10, "dead", now - timedelta(seconds=5)),
        ):
            conn.execute(text(ARCHIVE), {"first": first, "n": n, "state": state, "at": at})
        conn.execute(text("ANALYZE txtasks_tasks"))
        conn.execute(text("ANALYZE txtasks_archive"))
    yield postgres_url, engine, now
    engine.dispose()


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


def scans(conn: Connection, statement: Any, params: dict[str, Any] | None = None) -> list[Any]:
    """The table reads of a statement's plan: (node type, table, index)."""

    def explain(*args: Any) -> tuple[str, Any]:  # before_cursor_execute, retval=True
        return "EXPLAIN (FORMAT JSON) " + args[2], args[3]

    event.listen(conn, "before_cursor_execute", explain, retval=True)
    try:
        [[plan]] = conn.execute(statement, params or {}).all()
    finally:
        event.remove(conn, "before_cursor_execute", explain)
    tree = nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return [
        (n["Node Type"], n["Relation Name"], n.get("Index Name"))
        for n in tree
        if n.get("Relation Name", "").startswith("txtasks_")
    ]


def assert_indexed(read: list[Any]) -> None:
    assert read, "the plan reads no table"
    assert not [r for r in read if r[0] == "Seq Scan"], read


def test_ready_tasks_are_counted_along_the_claim_indexes(filled: Any) -> None:
    _, engine, now = filled
    with engine.connect() as conn:
        read = scans(conn, stmt_ready_due(now))
        rows = conn.execute(stmt_ready_due(now)).all()
    assert_indexed(read)
    assert {r[2] for r in read} == {"ix_txtasks_tasks_claim", "ix_txtasks_tasks_claim_keyed"}
    assert sorted(r[2] for r in rows) == [100, 320]


def test_arrivals_and_finishes_are_counted_along_indexes(filled: Any) -> None:
    _, engine, now = filled
    since = now - timedelta(seconds=60)
    with engine.connect() as conn:
        newest = scans(conn, stmt_newest_before(since - timedelta(seconds=60)))
        before = conn.execute(stmt_newest_before(since - timedelta(seconds=60))).scalar_one()
        counted = scans(conn, stmt_arrivals_and_finishes(since, before))
    assert_indexed(newest)
    assert_indexed(counted)
    # the same count without the bound along the primary key reads the whole table
    unbounded = text("SELECT count(*) FROM txtasks_tasks WHERE created_at > :since")
    with engine.connect() as conn:
        assert ("Seq Scan", "txtasks_tasks", None) in scans(conn, unbounded, {"since": since})
    assert ("txtasks_archive", "ix_txtasks_archive_state") in {r[1:] for r in counted}


async def test_queue_rates_on_those_rows(filled: Any) -> None:
    url, _, now = filled
    driver = driver_for_url(url)
    try:
        rates = await driver.admin.queue_rates(now=now, window=60.0)
        [stats] = await driver.admin.queue_stats(now=now, archived=False)
    finally:
        await driver.close()
    # 20 live tasks and the 40 archived ones were enqueued in the last minute
    assert rates == [QueueRates("orders", 60.0, 60, {"completed": 30, "dead": 10})]
    assert stats.ready == 420


def keda_query() -> str:
    [scaled] = [d for d in yaml.safe_load_all(KEDA.read_text()) if d["kind"] == "ScaledObject"]
    [trigger] = scaled["spec"]["triggers"]
    query: str = trigger["metadata"]["query"]
    return query


def test_the_keda_query_counts_the_backlog_along_the_claim_indexes(filled: Any) -> None:
    _, engine, _ = filled
    with engine.connect() as conn:
        read = scans(conn, text(keda_query()))
        backlog = conn.execute(text(keda_query())).scalar_one()
    assert_indexed(read)
    assert backlog == 420  # ready and due: 300 + 100 keyed + 20 recent; not the 50 delayed
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO txtasks_paused_queues VALUES ('orders', now())"))
    try:
        with engine.connect() as conn:
            assert conn.execute(text(keda_query())).scalar_one() == 0
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM txtasks_paused_queues"))
