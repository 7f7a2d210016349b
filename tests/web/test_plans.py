"""Every statement the dashboard runs is served by an index: on PostgreSQL with a million live
tasks and a quarter million finished ones, each page and action is rendered while the driver's
statements are recorded, and the plan of each (EXPLAIN) must have no sequential scan of the
task tables."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text

from tests.conftest import backends
from tests.web.conftest import act, client_for
from txtasks import App
from txtasks.driver.sql import SqlDriver
from txtasks.web import create_app

pytestmark = [
    pytest.mark.parametrize("database_url", backends("postgresql"), indirect=True),
    pytest.mark.timeout(120),
]
LIVE_ROWS = 1_000_000
ARCHIVED_ROWS = 250_000
TASK_TABLES = ("txtasks_tasks", "txtasks_archive")

#: A million live tasks in 20 queues: mostly pending, some scheduled later, retrying with an
#: error, processing under a lease, and keyed (1,000 keys).
LOAD_LIVE = f"""
INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority, run_at,
    attempt, max_attempts, created_at, partition_key, last_error, worker_id, lease_expires_at)
SELECT 'q' || (i % 20), 'task' || (i % 7), convert_to('{{"n": ' || i || '}}', 'UTF8'),
    'application/json',
    CASE WHEN i % 50 = 0 THEN 'processing' WHEN i % 20 = 1 THEN 'retryable' ELSE 'pending' END,
    0,
    now() AT TIME ZONE 'UTC' + CASE WHEN i % 10 = 2 THEN interval '1 hour' ELSE interval '0' END,
    CASE WHEN i % 20 = 1 THEN 1 ELSE 0 END, 5,
    now() AT TIME ZONE 'UTC' - interval '1 second' * (1000000 - i),
    CASE WHEN i % 8 = 3 THEN 'k' || (i % 1000) END,
    CASE WHEN i % 20 = 1 THEN 'RuntimeError: upstream ' || (i % 97) || ' timed out' END,
    CASE WHEN i % 50 = 0 THEN 'worker-' || (i % 4) END,
    CASE WHEN i % 50 = 0 THEN now() AT TIME ZONE 'UTC' + interval '30 seconds' END
FROM generate_series(1, {LIVE_ROWS}) AS i
"""
#: Finished tasks over the last day: mostly completed, some dead with an error.
LOAD_ARCHIVE = f"""
INSERT INTO txtasks_archive (id, queue, task_name, payload, content_type, state, priority,
    run_at, attempt, max_attempts, created_at, last_error, finished_at)
SELECT 2000000 + i, 'q' || (i % 20), 'task' || (i % 7), convert_to('null', 'UTF8'),
    'application/json', CASE WHEN i % 10 = 0 THEN 'dead' ELSE 'completed' END, 0,
    now() AT TIME ZONE 'UTC' - interval '1 day', 1, 5, now() AT TIME ZONE 'UTC' - interval '1 day',
    CASE WHEN i % 10 = 0 THEN 'ValueError: bad row ' || (i % 31) END,
    now() AT TIME ZONE 'UTC' - interval '1 second' * (86400.0 * i / {ARCHIVED_ROWS})
FROM generate_series(1, {ARCHIVED_ROWS}) AS i
"""


def scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(node type, table) of every node of a plan that reads a table."""
    found = []
    if "Relation Name" in plan:
        found.append((plan["Node Type"], plan["Relation Name"]))
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


async def test_every_dashboard_statement_uses_an_index(app: App) -> None:
    started = time.monotonic()
    driver = app.driver
    assert isinstance(driver, SqlDriver)
    async with driver.begin() as conn:
        await conn.execute(text(LOAD_LIVE))
        await conn.execute(text(LOAD_ARCHIVE))
    async with driver.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in TASK_TABLES:
            await conn.execute(text(f"VACUUM ANALYZE {table}"))
    loaded = time.monotonic() - started

    app.task(name="task0", queue="q0")(_noop)
    app.periodic("task0", name="hourly", every=3600)
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if any(t in statement for t in TASK_TABLES) and not statement.startswith("INSERT"):
            statements.append((statement, params))

    event.listen(driver.engine.sync_engine, "before_cursor_execute", record)
    async with client_for(create_app(app, refresh=0, page_size=50)) as http:
        await visit_every_page(http)
        await act_on_tasks(http)
    event.remove(driver.engine.sync_engine, "before_cursor_execute", record)

    bad = []
    async with driver.connect() as conn:
        for statement, params in statements:
            result = await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", params)
            plan = result.scalar_one()[0]["Plan"]
            seq = [t for node, t in scans(plan) if node == "Seq Scan" and t in TASK_TABLES]
            if seq:
                bad.append(f"{statement}\n  params {params}\n  seq scan of {seq}")
    assert len(statements) >= 20, statements
    assert not bad, "\n\n".join(bad)
    print(f"loaded in {loaded:.1f}s; {len(statements)} statements explained")


async def _noop(payload: Any) -> None:
    return None


async def visit_every_page(http: httpx.AsyncClient) -> None:
    pages = [
        ("/", {}),
        ("/tasks", {}),
        ("/tasks", {"queue": "q3"}),
        ("/tasks", {"queue": "q3", "state": "retryable"}),
        ("/tasks", {"task": "task2"}),
        ("/tasks", {"queue": "q3", "key": "k3"}),
        ("/tasks", {"key": "k3"}),
        ("/tasks", {"state": "processing"}),
        ("/tasks", {"state": "retryable", "error": "upstream 5 timed"}),
        ("/tasks", {"state": "completed"}),
        ("/tasks", {"state": "dead", "queue": "q4", "error": "bad row"}),
        ("/dead", {}),
        ("/dead", {"queue": "q0"}),
        ("/periodic", {}),
        ("/workers", {}),
        ("/tasks/1000", {}),
        ("/tasks/2000010", {}),
    ]
    for path, params in pages:
        page = await http.get(path, params=params)
        assert page.status_code == 200, (path, page.text[:300])
        if 'id="next-page"' in page.text:  # and the next page, by its cursor
            after = page.text.split('id="next-page" href="?')[1].split('"')[0]
            nxt = await http.get(f"{path}?{after.replace('&amp;', '&')}")
            assert nxt.status_code == 200, (path, nxt.text[:300])


async def act_on_tasks(http: httpx.AsyncClient) -> None:
    for action, fields in [
        ("run_now", {"id": "21"}),
        ("cancel", {"id": "22"}),
        ("requeue", {"id": "2000010"}),
        ("purge", {"id": "2000020"}),
        ("requeue", {"match": "yes", "match_queue": "q5", "match_task": "task5"}),
        ("purge", {"match": "yes", "match_error": "bad row 3"}),
        ("requeue", {"queue": "q6"}),
        ("pause", {"queue": "q1"}),
        ("resume", {"queue": "q1"}),
        ("periodic_now", {"schedule": "hourly"}),
    ]:
        done = await act(http, action, **fields)
        assert done.status_code == 303, (action, done.text[:300])
