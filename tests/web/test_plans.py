"""Every statement the dashboard runs is served by an index: with a million live tasks and
millions of finished ones, on PostgreSQL, MariaDB and SQLite, each page and action is rendered
(and a pass of the cleaner's stats sweep, which writes the queues' history, is run) while the
driver's statements are recorded, and the plan of each (EXPLAIN) must read no task table whole
(no sequential scan on PostgreSQL, no join type ALL on MariaDB, no SCAN without an index on
SQLite)."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text

from cleaner.stats import Stats, StatsConfig
from tests.conftest import backends
from tests.web import bulk
from tests.web.conftest import act, client_for
from txtasks import App
from txtasks.clock import utcnow
from txtasks.driver.history import minute_number
from txtasks.driver.sql import SqlDriver
from txtasks.web import create_app

pytestmark = [
    pytest.mark.parametrize(
        "database_url", backends("postgresql", "mysql", "sqlite"), indirect=True
    ),
    pytest.mark.timeout(180),
]
LIVE_ROWS = 1_000_000
#: Finished tasks: a million on PostgreSQL, a quarter million on MariaDB and SQLite (slower to
#: load); ten million take PostgreSQL longer to load than a test should.
ARCHIVED_ROWS = {"postgresql": 1_000_000, "mysql": 250_000, "sqlite": 250_000}
TASK_TABLES = ("txtasks_tasks", "txtasks_archive")
#: A page's plan may sort this many rows at most (MariaDB).
SORT_ROWS = 5_000


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
    dialect = bulk.dialect_of(driver)
    # the fill is the test's setup, not a statement of the product: not bounded by the driver's
    # command timeout (30 s), which a slow machine's MariaDB takes to load the rows
    async with driver.db.begin(bounded=False) as conn:
        await bulk.load(conn, dialect, LIVE_ROWS, ARCHIVED_ROWS[dialect], now=utcnow())
    async with driver.db.connect(bounded=False) as conn:
        if dialect == "postgresql":
            await conn.execution_options(isolation_level="AUTOCOMMIT")
        await bulk.analyze(conn, dialect)
    loaded = time.monotonic() - started

    app.task(name="task0", queue="q0")(_noop)
    app.periodic("task0", name="hourly", every=3600)
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if any(t in statement for t in TASK_TABLES) and not statement.startswith("INSERT"):
            statements.append((statement, params))

    event.listen(driver.db.engine.sync_engine, "before_cursor_execute", record)
    async with client_for(create_app(app, refresh=0, page_size=50)) as http:
        await visit_every_page(http)
        await act_on_tasks(http)
    await Stats(app, StatsConfig()).run_once()
    event.remove(driver.db.engine.sync_engine, "before_cursor_execute", record)

    bad = []
    async with driver.db.connect() as conn:
        for statement, params in statements:
            seq = await full_scans(conn, dialect, statement, params)
            if seq:
                bad.append(f"{statement}\n  params {params}\n  full scan of {seq}")
    assert len(statements) >= 20, statements
    assert not bad, "\n\n".join(bad)
    print(f"loaded in {loaded:.1f}s; {len(statements)} statements explained")


async def test_the_history_of_a_day_is_read_along_its_primary_key(app: App) -> None:
    """The queues' history at its largest (a week of minutes of 20 queues): the last minute
    written, a day of it summed in buckets, the purge of the minutes past a week."""
    driver = app.driver
    assert isinstance(driver, SqlDriver)
    dialect = bulk.dialect_of(driver)
    last = minute_number(utcnow())
    async with driver.db.begin(bounded=False) as conn:
        await conn.execute(text(bulk.history_sql(dialect, WEEK_MINUTES, 20, last)))
    async with driver.db.connect(bounded=False) as conn:
        if dialect == "postgresql":
            await conn.execution_options(isolation_level="AUTOCOMMIT")
        await bulk.analyze(conn, dialect)
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "txtasks_history" in statement:
            statements.append((statement, params))

    event.listen(driver.db.engine.sync_engine, "before_cursor_execute", record)
    assert await driver.sweeps.history_last() == last
    top = last - last % 15  # the buckets of a day ending at a quarter hour
    day = await driver.dashboard.history_buckets(first=top - 1440, last=top, minutes=15)
    assert day["q3"]["enqueued"] == [150] * 96
    assert await driver.sweeps.history_purge(before=last - WEEK_MINUTES) == 0
    event.remove(driver.db.engine.sync_engine, "before_cursor_execute", record)
    async with driver.db.connect() as conn:
        bad = [
            (statement, seq)
            for statement, params in statements
            if (seq := await full_scans(conn, dialect, statement, params, ("txtasks_history",)))
        ]
    assert len(statements) == 3 and not bad, bad


#: Minutes in a week: what the history keeps by default.
WEEK_MINUTES = 7 * 1440


async def full_scans(
    conn: Any, dialect: str, statement: str, params: Any, tables: tuple[str, ...] = TASK_TABLES
) -> list[str]:
    """The tables (task tables by default) a statement's plan reads whole: a sequential scan
    (PostgreSQL), a join type ALL or a page sorted from more than `SORT_ROWS` rows (MariaDB), a
    SCAN without an index (SQLite)."""
    if dialect == "sqlite":
        # a SCAN of a table alone walks its rowid b-tree: read whole, unless the statement
        # takes its first rows by id (PostgreSQL's backward scan of the primary key)
        result = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
        details = [str(r.detail).split() for r in result.all()]
        return [
            d[1]
            for d in details
            if d[:1] == ["SCAN"] and d[1] in tables and len(d) == 2
            if not re.search(rf"ORDER BY {d[1]}\.id DESC\s+LIMIT", statement)
        ]
    if dialect == "postgresql":
        result = await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", params)
        plan = result.scalar_one()[0]["Plan"]
        return [t for node, t in scans(plan) if node == "Seq Scan" and t in tables]
    aliases = {a: t for t in tables for a in aliases_of(statement, t)}
    result = await conn.exec_driver_sql(f"EXPLAIN {statement}", params)
    rows = [r for r in result.all() if r.table in aliases]
    # a page (ORDER BY ... LIMIT) must follow an index in its order, not sort a whole range
    # (MariaDB chose the dead letters' index by queue for every dead letter, then sorted them)
    paged = re.search(r"ORDER BY [^()]*LIMIT", statement) is not None
    return [
        aliases[r.table]
        for r in rows
        if r.type == "ALL"
        or (paged and "filesort" in (r.Extra or "") and int(r.rows or 0) > SORT_ROWS)
    ]


def aliases_of(statement: str, table: str) -> set[str]:
    """The names a statement gives `table` in its FROM clauses (itself, and any alias)."""
    found = {table}
    for after in statement.split(f"{table} AS ")[1:]:
        found.add(after.split()[0].strip("`,()"))
    return found


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
        ("/tasks", {"payload": '"n": 17'}),
        ("/tasks", {"state": "retryable", "payload": "7}"}),
        ("/tasks", {"queue": "q1", "payload": "7}"}),
        ("/tasks", {"state": "completed", "payload": "null"}),
        ("/dead", {"queue": "q4", "payload": "null", "error": "bad row"}),
        ("/", {"range": "24h"}),
        ("/", {"range": "7d"}),
        ("/timings", {}),
        ("/limits", {}),
        ("/dead", {}),
        ("/dead", {"queue": "q0"}),
        ("/periodic", {}),
        ("/busy", {}),
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
        ("run_now", {"id": ["23", "24", "50"]}),
        ("cancel", {"id": ["25", "26", "100"]}),
        ("retry", {"id": ["2000030", "2000031", "27"]}),
        ("delete", {"id": ["2000040", "2000041", "28"]}),
        ("requeue", {"id": "2000010"}),
        ("purge", {"id": "2000020"}),
        ("requeue", {"match": "yes", "match_queue": "q5", "match_task": "task5"}),
        ("purge", {"match": "yes", "match_error": "bad row 3"}),
        ("requeue", {"queue": "q6"}),
        ("pause", {"queue": "q1"}),
        ("resume", {"queue": "q1"}),
        ("periodic_now", {"schedule": "hourly"}),
        ("queue_rate", {"queue": "q1", "rate": "10/s", "burst": "3"}),
        ("queue_rate_clear", {"queue": "q1"}),
        ("key_limits", {"key": "k3", "queue": "q3", "concurrency": "2", "rate": "5/m"}),
        ("key_limits_clear", {"key": "k3", "queue": "q3"}),
        ("purge", {"match": "yes", "match_queue": "q7", "match_payload": "null"}),
    ]:
        done = await act(http, action, **fields)
        assert done.status_code == 303, (action, done.text[:300])
