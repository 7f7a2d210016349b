"""The commit of a staged write with dedup keys, at scale and beside the application.

Two promises, on real databases and without Spark (the staging layer is driven as
`test_staging_conformance.py` drives it):

- the commit's statements stay linear in rows whatever the planner's statistics say: on
  PostgreSQL no statement of a 300,000-row dedup commit runs a subquery per row (a plan that
  went quadratic once its estimate no longer fitted `work_mem`); on MariaDB and SQLite none
  scans the tasks table or runs a scan per row (a row's dedup check is an index lookup);
- an application enqueueing a key of the write while the commit runs never fails it: the
  application's task wins (as a live task always does) and every other row is published.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import Connection, Engine, event, func, select, text

import txtasks
from tests.conftest import backends
from tests.integration.test_staging_conformance import T0, attempt, ledger, staged_rows
from tests.waiting import until_sync
from txtasks.driver import SqlDriver
from txtasks.driver.urls import url_sync
from txtasks.enqueue import insert_many_tx, publish_many_tx
from txtasks.schema.tables import stages, tasks
from txtasks.spark.staging import SqlStaging, StageTarget, TopicTarget
from txtasks.types import JSON_CONTENT_TYPE, NewPublish, NewTask, Subscription

#: Rows of the plan test: past the ~262,000 rows where a hashed subplan stops fitting work_mem.
ROWS = 300_000
#: Rows per dedup key in the plan test (and every tenth row has no key).
REPEATS = 3
#: Seconds a test waits for the commit to block, or to finish.
WAIT = 60.0

TASK = StageTarget("q", "staged.task", max_attempts=3, dedup=True, keyed=True)
TOPIC = TopicTarget("order.created", dedup=True, keyed=True)
TASK_DEDUP = StageTarget("q", "staged.task", max_attempts=3, dedup=True)
GROUPS = [
    Subscription("order.created", "billing", "bill", "q"),
    Subscription("order.created", "shipping", "ship", "q2"),
]


@pytest.fixture
def app_engine(database_url: str) -> Iterator[Engine]:
    """The application's own engine, as an application makes it."""
    engine = txtasks.create_engine(url_sync(database_url))
    yield engine
    engine.dispose()


def begin_attempt(staging: SqlStaging, write_key: str, stage_id: str) -> int:
    """Record an attempt of an open write (staging no row): its number, for rows staged by
    hand."""
    staging.stage(write_key, stage_id, [])
    query = select(stages.c.id).where(stages.c.stage_id == stage_id)
    return count(staging, query)


def count(staging: SqlStaging, query: Any) -> int:
    with staging.driver.sync_engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


# -- the plan at scale ------------------------------------------------------------------------

#: 300,000 staged rows made by the database: keys k0, k0, k0, k1, ... and every tenth row none.
STAGE_ROWS = text(
    "INSERT INTO txtasks_staged "
    "(stage, n, payload, priority, run_at, dedup_key, partition_key) "
    "SELECT :stage, g, convert_to('{\"v\":' || g || '}', 'UTF8'), 0, :t0, "
    f"CASE WHEN g % 10 = 0 THEN NULL ELSE 'k' || (g / {REPEATS}) END, "
    f"'p' || (g % 1000) FROM generate_series(0, {ROWS - 1}) AS g"
)


@pytest.mark.parametrize("database_url", backends("postgresql"), indirect=True)
@pytest.mark.parametrize("statistics", ["stale", "fresh"])
@pytest.mark.parametrize("target", [TASK, TOPIC], ids=["task", "topic"])
async def test_a_dedup_commit_of_300k_rows_runs_no_subquery_per_row(
    sql: SqlDriver, staging: SqlStaging, statistics: str, target: StageTarget | TopicTarget
) -> None:
    """Every INSERT of the commit is explained just before it runs (in its transaction, with
    its parameters); a plan with a SubPlan stops the commit at once (it would run for hours)."""
    if isinstance(target, TopicTarget):
        await sql.topics.subscription_set_many(GROUPS[:1], now=T0)
    engine = staging.driver.sync_engine
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE txtasks_staged SET (autovacuum_enabled = off)"))
        conn.execute(text("ANALYZE txtasks_staged"))  # empty: the statistics of a quiet table
        conn.execute(text("ANALYZE txtasks_tasks"))
    staging.open("w", T0)
    stage = begin_attempt(staging, "w", "w.a")
    with engine.begin() as conn:
        conn.execute(STAGE_ROWS, {"t0": T0, "stage": stage})
    if statistics == "fresh":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE txtasks_staged"))
    plans: list[str] = []

    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if not statement.lstrip().upper().startswith("INSERT INTO TXTASKS_"):
            return
        with cursor.connection.cursor() as probe:
            probe.execute("EXPLAIN " + statement, parameters)
            plan = "\n".join(row[0] for row in probe.fetchall())
        plans.append(plan)
        if "SubPlan" in plan:
            raise AssertionError(f"a subquery per row:\n{statement}\n{plan}")

    event.listen(engine, "before_cursor_execute", explain)
    try:
        published = staging.commit("c", "w", {"w.a": ROWS}, target, now=T0)
    finally:
        event.remove(engine, "before_cursor_execute", explain)

    firsts = ROWS // 10 + len({g // REPEATS for g in range(ROWS) if g % 10})
    assert published == {"q": firsts}
    assert count(staging, select(func.count()).select_from(tasks)) == firsts
    assert len(plans) == 3  # the commit ledger, the key hints, the tasks
    assert ledger(staging) == {"c": firsts}


#: The same rows on MariaDB (its SEQUENCE engine) and SQLite (a recursive CTE).
STAGE_ROWS_ON = {
    "mysql": text(
        "INSERT INTO txtasks_staged "
        "(stage, n, payload, priority, run_at, dedup_key, partition_key) "
        "SELECT :stage, seq, concat('{\"v\":', seq, '}'), 0, :t0, "
        f"CASE WHEN seq % 10 = 0 THEN NULL ELSE concat('k', seq DIV {REPEATS}) END, "
        f"concat('p', seq % 1000) FROM seq_0_to_{ROWS - 1}"
    ),
    "sqlite": text(
        f"WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < {ROWS - 1}) "
        "INSERT INTO txtasks_staged "
        "(stage, n, payload, priority, run_at, dedup_key, partition_key) "
        "SELECT :stage, n, CAST('{\"v\":' || n || '}' AS BLOB), 0, :t0, "
        f"CASE WHEN n % 10 = 0 THEN NULL ELSE 'k' || (n / {REPEATS}) END, "
        "'p' || (n % 1000) FROM g"
    ),
}
#: MariaDB's EXPLAIN access types that read a whole table or index.
FULL_SCANS = ("ALL", "index")


def plan_faults(backend: str, plan: list[dict[str, Any]]) -> list[str]:
    """What in a plan reads more than the write's rows once: on MariaDB a full scan of the
    tasks table or a dependent subquery (run per row) that scans instead of looking up an
    index; on SQLite a SCAN of the tasks table, or a scan in a correlated subquery."""
    if backend == "mysql":
        return [
            f"{row['select_type']} {row['table']}: {row['type']}"
            for row in plan
            if row["type"] in FULL_SCANS
            and (row["table"] == "txtasks_tasks" or "DEPENDENT" in row["select_type"])
        ]
    correlated = {row["id"] for row in plan if row["detail"].startswith("CORRELATED")}
    return [
        row["detail"]
        for row in plan
        if row["detail"].startswith("SCAN txtasks_tasks")
        or (row["parent"] in correlated and not row["detail"].startswith("SEARCH"))
    ]


@pytest.mark.parametrize("database_url", backends("mysql", "sqlite"), indirect=True)
@pytest.mark.parametrize("statistics", ["stale", "fresh"])
@pytest.mark.parametrize("target", [TASK, TOPIC], ids=["task", "topic"])
async def test_a_dedup_commit_of_300k_rows_reads_the_tasks_table_by_index_only(
    sql: SqlDriver, staging: SqlStaging, statistics: str, target: StageTarget | TopicTarget
) -> None:
    """The PostgreSQL test above on MariaDB and SQLite: every INSERT of the commit is explained
    (EXPLAIN, EXPLAIN QUERY PLAN) just before it runs, in its transaction, with its parameters;
    a plan that scans the tasks table, or runs a scan per row, stops the commit at once."""
    backend = sql.capabilities.name
    if isinstance(target, TopicTarget):
        await sql.topics.subscription_set_many(GROUPS[:1], now=T0)
    engine = staging.driver.sync_engine
    analyze = "ANALYZE TABLE txtasks_staged, txtasks_tasks" if backend == "mysql" else "ANALYZE"
    with engine.begin() as conn:
        if backend == "mysql":  # statistics of a quiet table, kept while the rows arrive
            conn.execute(text("ALTER TABLE txtasks_staged STATS_AUTO_RECALC = 0"))
        conn.execute(text(analyze))
    staging.open("w", T0)
    stage = begin_attempt(staging, "w", "w.a")
    with engine.begin() as conn:
        conn.execute(STAGE_ROWS_ON[backend], {"t0": T0, "stage": stage})
    if statistics == "fresh":
        with engine.begin() as conn:
            conn.execute(text(analyze))
    plans: list[list[dict[str, Any]]] = []
    prefix = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "

    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        head = statement.lstrip().upper()
        if not head.startswith("INSERT") or "INTO TXTASKS_" not in head:
            return
        probe = cursor.connection.cursor()
        try:
            probe.execute(prefix + statement, parameters)
            names = [d[0] for d in probe.description]
            plan = [dict(zip(names, row, strict=True)) for row in probe.fetchall()]
        finally:
            probe.close()
        plans.append(plan)
        if faults := plan_faults(backend, plan):
            raise AssertionError(f"{faults}:\n{statement}\n{plan}")

    event.listen(engine, "before_cursor_execute", explain)
    try:
        published = staging.commit("c", "w", {"w.a": ROWS}, target, now=T0)
    finally:
        event.remove(engine, "before_cursor_execute", explain)

    firsts = ROWS // 10 + len({g // REPEATS for g in range(ROWS) if g % 10})
    assert published == {"q": firsts}
    assert count(staging, select(func.count()).select_from(tasks)) == firsts
    assert len(plans) == 3  # the commit ledger, the key hints, the tasks
    assert any("txtasks_tasks" in str(plan) for plan in plans[1:])  # the dedup check's lookups
    assert ledger(staging) == {"c": firsts}


# -- an application enqueueing a key of the write ---------------------------------------------


def commit_waits(staging: SqlStaging) -> bool:
    """Whether the commit's INSERT waits for a lock (the application's, on the key)."""
    if staging.driver.capabilities.name == "postgresql":
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'INSERT INTO txtasks_tasks%' AND datname = current_database()"
        )
    else:  # a 10-row INSERT is still running only while it waits for the other transaction
        query = text(
            "SELECT count(*) FROM information_schema.PROCESSLIST "
            "WHERE COMMAND = 'Query' AND INFO LIKE 'INSERT%INTO txtasks_tasks%' "
            "AND DB = DATABASE()"
        )
    return count(staging, query) > 0


def app_enqueue(conn: Connection, key: str) -> int:
    """The application's task with dedup key `key`, in its transaction on `conn`."""
    task = NewTask("q", "app.task", b'{"v": "app"}', JSON_CONTENT_TYPE, 0, T0, 5, T0, dedup_key=key)
    [task_id] = insert_many_tx(conn, [task])
    return task_id


@pytest.mark.parametrize("app_commits", ["before", "while the commit waits"])
@pytest.mark.parametrize("target", [TASK, TOPIC], ids=["task", "topic"])
async def test_an_application_enqueue_of_a_key_never_fails_the_commit(
    sql: SqlDriver,
    staging: SqlStaging,
    app_engine: Engine,
    app_commits: str,
    target: StageTarget | TopicTarget,
) -> None:
    """The application inserts dedup key "k5" (or `billing/k5`, the key of one group's task
    of a topic's row) and holds its transaction open; the commit starts and waits for it on the
    key (SQLite: for its write lock); the application commits. The write goes through: the
    application's task holds the key once, every other row is published, and the counts the
    commit returns and records are those of the tasks it made."""
    topic = isinstance(target, TopicTarget)
    if topic:
        await sql.topics.subscription_set_many(GROUPS, now=T0)
    raced = "billing/k5" if topic else "k5"
    staging.open("w", T0)
    keys = [f"k{n}" for n in range(10)]
    staging.stage("w", "w.a", [attempt(list(range(10)), dedup=keys)])
    backend = sql.capabilities.name
    about_to_begin = threading.Event()

    def waits_for_lock(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            about_to_begin.set()

    engine = staging.driver.sync_engine
    pool = ThreadPoolExecutor(1)
    with app_engine.connect() as conn:
        with conn.begin():
            app_id = app_enqueue(conn, raced)
            if app_commits != "before":
                event.listen(engine, "before_cursor_execute", waits_for_lock)
                try:
                    commit = pool.submit(staging.commit, "c", "w", {"w.a": 10}, target, now=T0)
                    if backend == "sqlite":  # one writer: the commit cannot start before
                        assert about_to_begin.wait(WAIT)
                    else:
                        until_sync(lambda: commit_waits(staging), "the commit waits", timeout=WAIT)
                finally:
                    event.remove(engine, "before_cursor_execute", waits_for_lock)
        if app_commits == "before":
            commit = pool.submit(staging.commit, "c", "w", {"w.a": 10}, target, now=T0)
        published = commit.result(WAIT)
    pool.shutdown()

    expected = {"q": 9, "q2": 10} if topic else {"q": 9}
    assert published == expected
    assert ledger(staging) == {"c": sum(expected.values())}
    assert staged_rows(staging) == {}
    with engine.connect() as conn:
        rows = conn.execute(select(tasks.c.id, tasks.c.dedup_key, tasks.c.payload)).all()
    holders = [r for r in rows if r.dedup_key == raced]
    assert [(r.id, json.loads(r.payload)["v"]) for r in holders] == [(app_id, "app")]
    published_keys = sorted(r.dedup_key for r in rows if r.id != app_id)
    if topic:
        assert published_keys == sorted(
            [f"billing/{k}" for k in keys if k != "k5"] + [f"shipping/{k}" for k in keys]
        )
    else:
        assert published_keys == sorted(k for k in keys if k != "k5")


@pytest.mark.parametrize("database_url", backends("mysql"), indirect=True)
async def test_a_value_insert_ignore_would_change_fails_the_commit(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """MariaDB's INSERT IGNORE turns more than duplicate keys into warnings: any other warning
    (here a staged task key longer than the hot table takes, which it would cut short) rolls
    the commit back instead of publishing a changed row."""
    from txtasks.spark.staging.mysql import PublishWarning

    with staging.driver.sync_engine.begin() as conn:
        conn.execute(text("ALTER TABLE txtasks_staged MODIFY partition_key VARCHAR(300)"))
    staging.open("w", T0)
    rows = attempt(["a", "b"], dedup=["k1", "k2"])
    too_long = pa.array(["x" * 300, None], pa.large_string())
    staging.stage("w", "w.a", [rows.append_column("partition_key", too_long)])

    with pytest.raises(PublishWarning, match=r"1265 Data truncated for column 'partition_key'"):
        staging.commit("c", "w", {"w.a": 2}, StageTarget("q", "t", 1, dedup=True), now=T0)

    assert count(staging, select(func.count()).select_from(tasks)) == 0
    assert ledger(staging) == {}
    assert staged_rows(staging) == {"w.a": 2}


# -- an application enqueueing several keys of the write at once ------------------------------


def session_id(conn: Connection) -> int:
    """The database's id of the session on `conn`."""
    postgres = conn.dialect.name == "postgresql"
    query = "SELECT pg_backend_pid()" if postgres else "SELECT CONNECTION_ID()"
    return int(conn.exec_driver_sql(query).scalar_one())


def session_waits(staging: SqlStaging, session: int) -> bool:
    """Whether the session `session` waits for a lock (held by another transaction)."""
    if staging.driver.capabilities.name == "postgresql":
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = :s AND wait_event_type = 'Lock'"
        )
    else:  # a 2-row INSERT is still running only while it waits for the other transaction
        query = text(
            "SELECT count(*) FROM information_schema.PROCESSLIST "
            "WHERE ID = :s AND COMMAND = 'Query' AND INFO LIKE 'INSERT%INTO txtasks_tasks%'"
        )
    with staging.driver.sync_engine.connect() as conn:
        return int(conn.execute(query, {"s": session}).scalar_one()) > 0


def bulk_enqueue_tx(conn: Connection, topic: bool, keys: list[str]) -> list[int]:
    """The application's tasks (payload {"v": "app"}) with dedup keys `keys`, in one bulk
    insert (`enqueue_many_tx`), or published to the topic of `TOPIC` in one bulk publish: the
    ids of the tasks holding the keys, or of the deliveries the publish made."""
    payload = b'{"v": "app"}'
    if topic:
        head, tail = '{"txtasks-group":"', '"}'
        publishes = [
            NewPublish(TOPIC.topic, payload, JSON_CONTENT_TYPE, T0, T0, head, tail, dedup_key=k)
            for k in keys
        ]
        return [d.id for made in publish_many_tx(conn, publishes) for d in made]
    rows = [
        NewTask("q", "app.task", payload, JSON_CONTENT_TYPE, 0, T0, 5, T0, dedup_key=k)
        for k in keys
    ]
    return insert_many_tx(conn, rows)


def race(
    staging: SqlStaging, app_engine: Engine, topic: bool, staged_keys: list[str], held: str
) -> tuple[list[int], dict[str, int] | None]:
    """The write stages `staged_keys`; a first application transaction holds the key `held`
    (enqueued, not committed), so the commit waits at that key; a second one enqueues every
    other staged key in one bulk insert (or publish) and commits; then the first rolls back.
    Returns what the bulk insert and the commit returned, each within `WAIT` seconds."""
    prefix = "billing/" if topic else ""
    staging.open("w", T0)
    count = len(staged_keys)
    staging.stage("w", "w.a", [attempt(list(range(count)), dedup=staged_keys)])
    target = TopicTarget(TOPIC.topic, dedup=True) if topic else TASK_DEDUP
    pool = ThreadPoolExecutor(2)
    bulk_session: list[int] = []

    def bulk_enqueue() -> list[int]:
        with app_engine.connect() as conn, conn.begin():
            bulk_session.append(session_id(conn))
            return bulk_enqueue_tx(conn, topic, [k for k in staged_keys if k != held])

    def bulk_done_or_waits() -> bool:
        return bulk.done() or bool(bulk_session and session_waits(staging, bulk_session[0]))

    with app_engine.connect() as holder:
        holding = holder.begin()
        app_enqueue(holder, prefix + held)
        commit = pool.submit(staging.commit, "c", "w", {"w.a": count}, target, now=T0)
        until_sync(lambda: commit_waits(staging), "the commit waits for the held key", timeout=WAIT)
        bulk = pool.submit(bulk_enqueue)
        until_sync(bulk_done_or_waits, "the bulk insert is done or waits", timeout=WAIT)
        holding.rollback()
    try:
        return bulk.result(WAIT), commit.result(WAIT)
    finally:
        pool.shutdown()


def assert_each_key_once(
    staging: SqlStaging,
    topic: bool,
    keys: list[str],
    held: str,
    app_ids: list[int],
    published: dict[str, int] | None,
) -> None:
    """Each key is held by one task; the held one by the commit's, the others by whichever side
    made them, whose ids the bulk insert returned (a publish: of the tasks it made); the commit
    counts the tasks it made."""
    prefix = "billing/" if topic else ""
    with staging.driver.sync_engine.connect() as conn:
        rows = conn.execute(select(tasks.c.id, tasks.c.dedup_key, tasks.c.payload)).all()
    holders = {r.dedup_key: r for r in rows}
    app_made = [r.id for r in rows if json.loads(r.payload)["v"] == "app"]
    assert sorted(holders) == sorted(prefix + k for k in keys) and len(rows) == len(keys)
    assert holders[prefix + held].id not in app_made
    if topic:
        assert sorted(app_ids) == sorted(app_made)
    else:
        assert app_ids == [holders[k].id for k in keys if k != held]
    made = len(keys) - len(app_made)
    assert published == {"q": made}
    assert ledger(staging) == {"c": made}
    assert staged_rows(staging) == {}


@pytest.mark.parametrize("database_url", backends("postgresql", "mysql"), indirect=True)
@pytest.mark.parametrize("topic", [False, True], ids=["task", "topic"])
async def test_an_application_enqueueing_keys_of_the_write_at_once_never_deadlocks_with_it(
    sql: SqlDriver, staging: SqlStaging, app_engine: Engine, topic: bool
) -> None:
    """The write stages keys k1, a, k0 in that order; the application holds "a", then enqueues
    k1 and k0 in one bulk insert, which inserts keys in key order (`race`). Had the commit
    inserted its rows in staging order, on PostgreSQL it would hold k1 while waiting for "a",
    the bulk insert would hold k0 while waiting for k1, and once "a" is free the commit would
    wait for k0: a deadlock, which fails one of the two (here the application's enqueue).
    Inserting in key order, as the enqueue does, neither waits for a key the other holds: both
    go through (on MariaDB the bulk insert waits for the commit's statement to end, which holds
    the table's AUTO_INCREMENT lock). With a topic, the same with the group's keys (`billing/a`,
    ...) and a bulk publish."""
    if topic:
        await sql.topics.subscription_set_many(GROUPS[:1], now=T0)
    keys = ["k1", "a", "k0"]
    app_ids, published = race(staging, app_engine, topic, keys, "a")
    assert_each_key_once(staging, topic, keys, "a", app_ids, published)


@pytest.mark.parametrize("database_url", backends("postgresql"), indirect=True)
@pytest.mark.parametrize("topic", [False, True], ids=["task", "topic"])
async def test_keys_go_in_in_byte_order_whatever_the_collation(
    sql: SqlDriver, staging: SqlStaging, app_engine: Engine, topic: bool
) -> None:
    """As above, where the columns the statements sort by have a collation that sorts "a"
    before "b" before "B" (ICU's English, as a database made with `en_US.UTF-8` does), while an
    enqueue sorts keys as Python does: "B", "a", "b". Had the commit sorted by the collation,
    it would wait for "b" holding "a", and the bulk insert of "B" and "a" wait for "a" holding
    "B"; then the commit would wait for "B": a deadlock. Had it sorted in byte order but a
    publish by the collation, the commit would wait for "billing/a" holding "billing/B", the
    publish of "b" and "B" wait for "billing/B" holding "billing/b", and so on. Both sort in
    byte order."""
    with staging.driver.sync_engine.begin() as conn:
        conn.execute(
            text('ALTER TABLE txtasks_staged ALTER dedup_key TYPE varchar(255) COLLATE "en-x-icu"')
        )
        conn.execute(
            text(
                "ALTER TABLE txtasks_subscriptions "
                'ALTER group_name TYPE varchar(128) COLLATE "en-x-icu"'
            )
        )
    if topic:
        await sql.topics.subscription_set_many(GROUPS[:1], now=T0)
    keys, held = ["B", "b", "a"], "a" if topic else "b"
    app_ids, published = race(staging, app_engine, topic, keys, held)
    assert_each_key_once(staging, topic, keys, held, app_ids, published)
