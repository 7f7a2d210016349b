"""A claim reads only the rows it takes: the databases' own plans, with thousands of ready rows.

A claim that sorts every ready row of its queue costs time in proportion to the backlog; with
the claim index in claim order it costs the same with 10 or 100,000 rows waiting.
"""

from __future__ import annotations

import json
import warnings
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import create_engine, event, make_url, select, text
from sqlalchemy.exc import SAWarning

from tests.conftest import BACKENDS, reset_schema, server_url
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.driver.dialect import dialect_for
from txtasks.driver.postgresql import CLAIM_SQL, FINISH_SQL, KEYS_LOOK_SQL, PostgresDriver
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sql_claims import Claim
from txtasks.driver.urls import url_sync
from txtasks.schema.tables import keys as keys_table
from txtasks.types import NewTask

BACKLOG = 3000
LIMIT = 10


@pytest.fixture(params=BACKENDS)
async def backlog(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A database holding BACKLOG ready tasks in two queues, at two priorities, with stats."""
    url = server_url(request, request.param, tmp_path)
    reset_schema(url)
    driver = driver_for_url(url)
    now = utcnow()
    rows = [
        NewTask(
            queue="q" if i % 3 else "other",
            task_name="t",
            payload=b"null",
            content_type="application/json",
            max_attempts=3,
            created_at=now,
            priority=i % 2,
            run_at=now - timedelta(seconds=i),
        )
        for i in range(BACKLOG)
    ]
    await driver.tasks.task_insert_many(rows)
    await driver.close()
    engine = create_engine(url_sync(url))
    with engine.begin() as conn:
        conn.execute(text("ANALYZE" if request.param != "mysql" else "ANALYZE TABLE txtasks_tasks"))
    yield request.param, url, engine
    engine.dispose()


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a PostgreSQL JSON plan."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


async def test_a_claim_reads_only_the_rows_it_takes(backlog: Any) -> None:
    backend, url, engine = backlog
    now = utcnow()
    if backend == "postgresql":
        import asyncpg

        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn)
        try:
            claim = conn.transaction()  # EXPLAIN ANALYZE runs the claim: roll it back
            await claim.start()
            args = (now, "w", now, ["q"], LIMIT)
            plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIM_SQL, *args)
            await claim.rollback()
        finally:
            await conn.close()
        tree = nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
        scans = [n for n in tree if n.get("Relation Name") == "txtasks_tasks"]
        claim = [n for n in scans if n.get("Index Name") == "ix_txtasks_tasks_claim"]
        read = [(n["Node Type"], n.get("Index Name"), n["Actual Rows"]) for n in scans]
        assert claim, f"the claim does not read the claim index: {read}"
        assert all(n["Actual Rows"] <= LIMIT for n in claim), read
        assert not [n for n in scans if n["Node Type"] == "Seq Scan"], read
        return
    driver = driver_for_url(url)
    assert isinstance(driver, SqlDriver)
    prefix = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "

    def explain(*args: Any) -> tuple[str, Any]:  # before_cursor_execute, retval=True
        return prefix + args[2], args[3]

    event.listen(engine, "before_cursor_execute", explain, retval=True)
    with engine.connect() as conn:
        params = {"queues": ["q"], "now": now, "limit": LIMIT}
        explained = conn.execute(driver.db.sql.claims.stmt_ready(), params).mappings().all()
    if backend == "sqlite":
        steps = [row["detail"] for row in explained]
        assert any("ix_txtasks_tasks_claim" in s for s in steps), steps
        assert not any("TEMP B-TREE" in s for s in steps), steps  # no sort
    else:
        read = [r for r in explained if r["table"] == "txtasks_tasks"]
        assert [r["key"] for r in read] == ["ix_txtasks_tasks_claim"], explained
        assert "filesort" not in (read[0]["Extra"] or ""), explained
        others = [r for r in explained if r["table"] != "txtasks_tasks"]  # paused queues
        assert all(r["key"] == "PRIMARY" for r in others), explained


async def test_finishing_outcomes_looks_up_each_row_whatever_the_statistics_say(
    request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """Statistics taken while no task was processing (the usual moment for an ANALYZE of a
    queue with a backlog) must not turn finishing a batch into comparing every row with
    every outcome."""
    import asyncpg

    url = server_url(request, "postgresql", tmp_path)
    reset_schema(url)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn, server_settings={"plan_cache_mode": "force_custom_plan"})
    try:
        now = utcnow()
        driver = driver_for_url(url)
        new = NewTask("q", "t", b"null", "application/json", 0, now, 3, now)
        await driver.tasks.task_insert_many([new] * 5000)
        await driver.close()
        await conn.execute("ANALYZE txtasks_tasks")  # every row pending
        claimed = await conn.fetch(CLAIM_SQL, now + timedelta(minutes=1), "w", now, ["q"], 500)
        args = (
            ",".join(str(r["id"]) for r in claimed),
            ",".join(str(r["attempt"]) for r in claimed),
            ",".join("completed" for _ in claimed),
            None,
            "w",
            None,
            now,
            True,
        )
        finish = conn.transaction()  # EXPLAIN ANALYZE runs it: roll it back
        await finish.start()
        plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + FINISH_SQL, *args)
        await finish.rollback()
    finally:
        await conn.close()
    tree = nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    assert len(claimed) == 500 and tree[0]["Actual Rows"] == 500
    compared = sum(n.get("Rows Removed by Join Filter", 0) for n in tree)
    scans = [n for n in tree if n.get("Relation Name") == "txtasks_tasks"]
    read = [
        (n["Node Type"], n.get("Index Name"), n["Actual Loops"], n.get("Rows Removed by Filter"))
        for n in scans
    ]
    assert compared == 0, f"{compared} rows compared and dropped: {read}"
    # a scan repeated per outcome must find its one row by the primary key, reading no other
    looped = [n for n in scans if n["Actual Loops"] > 1]
    assert all(n.get("Index Name") == "txtasks_tasks_pkey" for n in looped), read
    assert all(n.get("Rows Removed by Filter", 0) <= 1 for n in looped), read


async def test_a_key_claim_counts_each_key_s_running_tasks_along_their_own_index(
    request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """With thousands of tasks processing, counting those of the keys a claim holds reads only
    theirs (one probe of the running index per key), not every processing task."""
    import asyncpg

    url = server_url(request, "postgresql", tmp_path)
    reset_schema(url)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority,"
            " run_at, attempt, max_attempts, created_at, partition_key, worker_id,"
            " lease_expires_at) SELECT 'q', 't', 'null', 'application/json', 'processing', 0,"
            " now(), 1, 3, now(), CASE WHEN i % 2 = 0 THEN 'k' || (i % 1000) END, 'w',"
            " now() + interval '1 minute' FROM generate_series(1, 6000) AS i"
        )
        await conn.execute("ANALYZE txtasks_tasks")
        names = [f"k{i}" for i in range(0, 20, 2)]
        args = (json.dumps(["q"] * len(names)), json.dumps(names), "[]", "[]", "[]", "[]", "")
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + KEYS_LOOK_SQL, *args, utcnow()
        )
        counts = await conn.fetch(KEYS_LOOK_SQL, *args, utcnow())
    finally:
        await conn.close()
    assert sorted((r["kind"], names[r["i"] - 1], r["n"]) for r in counts) == sorted(
        ("r", k, 6) for k in names
    )
    tree = nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    read = [
        (n["Node Type"], n.get("Index Name"), n["Actual Rows"], n["Actual Loops"])
        for n in tree
        if n.get("Relation Name") == "txtasks_tasks"
    ]
    scans = [n for n in tree if n.get("Relation Name") == "txtasks_tasks" and n["Actual Loops"]]
    assert [n.get("Index Name") for n in scans] == ["ix_txtasks_tasks_running"], read
    assert all(n["Actual Rows"] <= 6 for n in scans), read  # per probe: that key's tasks


def test_a_key_claim_reads_each_key_s_due_tasks_along_the_claim_index_on_mariadb(
    request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """MariaDB/MySQL, statistics taken while the table held only tasks without a key, of another
    queue: the due tasks of the keys a claim holds are still read by one short probe of the
    claim index per key and task, not by a walk along a whole index until a key's task turns
    up (the plan those statistics give the probe)."""
    url = server_url(request, "mysql", tmp_path)
    reset_schema(url)
    engine = create_engine(url_sync(url))
    keys = [f"k{i}" for i in range(980, 1000)]  # last along the index
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE txtasks_tasks STATS_AUTO_RECALC=0"))  # kept stale
            without_key = INSERT_TASKS.format(queue="other", key="NULL", count=20_000)
            conn.execute(text(without_key))
            conn.execute(text("ANALYZE TABLE txtasks_tasks"))  # the stale statistics
            conn.execute(text("DELETE FROM txtasks_tasks"))
            conn.execute(
                text(INSERT_TASKS.format(queue="q", key="concat('k', seq MOD 1000)", count=6000))
            )
            conn.execute(
                text(
                    "INSERT INTO txtasks_keys (queue, partition_key, ready_at, updated_at)"
                    " SELECT 'q', concat('k', seq), now(6), now(6) FROM seq_980_to_999"
                )
            )
        with engine.begin() as conn:
            names = dict(conn.execute(select(keys_table.c.id, keys_table.c.partition_key)).all())
            params = {"ids": list(names), "now": utcnow()}
            sql = dialect_for(conn.dialect)
            statement = sql.keys.stmt_keys_due_first(1)
            state = statement.compile(dialect=conn.dialect).construct_expanded_state(params)
            explain = "EXPLAIN " + state.statement
            plan = conn.exec_driver_sql(explain, state.parameters).mappings().all()
            before = handler_reads(conn)
            due = sql.rows(conn.execute(statement, params))  # (key id, its first due task)
            read = handler_reads(conn) - before
    finally:
        engine.dispose()
    assert sorted(names[key_id] for key_id, _first in due) == sorted(keys)
    assert all(first is not None for _key_id, first in due)
    probes = [dict(row) for row in plan if row["select_type"] == "DEPENDENT SUBQUERY"]
    assert len(probes) == 1, plan
    assert all(p["type"] == "ref" and p["key"] == "ix_txtasks_tasks_claim" for p in probes), plan
    assert read <= len(keys) * 10, read


#: `count` ready tasks in `queue`, with the key `key` (SQL of `seq`, MariaDB's sequence).
INSERT_TASKS = (
    "INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority, run_at,"
    " attempt, max_attempts, created_at, partition_key) SELECT '{queue}', 't', 'null',"
    " 'application/json', 'pending', 0, now(6), 0, 3, now(6), {key} FROM seq_1_to_{count}"
)


def handler_reads(conn: Any) -> int:
    """The rows this MariaDB/MySQL session has read so far (index and table reads)."""
    rows = conn.execute(text("SHOW SESSION STATUS LIKE 'Handler_read%'")).all()
    return sum(int(value) for _name, value in rows)


async def test_on_mariadb_a_claim_and_an_outcome_reach_key_rows_by_their_primary_keys_only(
    request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """InnoDB locks every index entry a statement passes. A claim that locked its keys along
    the index of ready keys held the entries of the full keys it passed as well, so that an
    outcome arming one of them waited for the claim (or deadlocked with it). Every statement
    that locks or changes key rows in a claim, and the outcome's arming, reads them by their
    primary keys."""
    url = server_url(request, "mysql", tmp_path)
    reset_schema(url)
    engine = create_engine(url_sync(url))
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO txtasks_keys (queue, partition_key, ready_at, updated_at)"
                " SELECT 'q', concat('k', seq), IF(seq % 2 = 0, NULL, now(6) - INTERVAL 1 MINUTE),"
                " now(6) FROM seq_1_to_2000"
            )
        )
        conn.execute(text("ANALYZE TABLE txtasks_keys"))
        conn.execute(text(INSERT_TASKS.format(queue="q", key="concat('k', seq * 2)", count=100)))
    driver = driver_for_url(url)
    assert isinstance(driver, SqlDriver)
    sent: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    event.listen(driver.db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        now = utcnow()
        async with driver.db.begin() as conn:
            params = {"queues": ["q"], "now": now, "limit": 50}
            held, _stored = await driver.claims.lanes.keys_lock(conn, params)
            settle = {"b_ready_at": None, "b_next_start_at": None, "now": now}
            await driver.claims.lanes.keys_settle(conn, [{"b_id": h.id, **settle} for h in held])
        async with driver.db.begin() as conn:
            await driver.claims.lanes.keys_wake(
                conn, [("q", f"k{i}") for i in range(2, 200, 2)], now
            )
    finally:
        await driver.close()
    assert len(held) == 50
    changing = [
        (statement, parameters)
        for statement, parameters in sent
        if "txtasks_keys" in statement
        and (statement.lstrip().upper().startswith("UPDATE") or "SKIP LOCKED" in statement)
        and "FORCE INDEX (uq_txtasks_keys)" not in statement  # an outcome's keys, by name
    ]
    assert len(changing) == 3, [s for s, _p in sent]  # the lock, the settle, the arming
    with engine.begin() as conn:
        for statement, parameters in changing:
            plan = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
            read = [r for r in plan if r["table"] in ("txtasks_keys", "k")]
            assert read and all(r["key"] == "PRIMARY" for r in read), (statement, plan)
    engine.dispose()


def test_on_mariadb_keys_given_by_id_or_name_are_read_alone_whatever_the_statistics(
    request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """MariaDB read every key of the table, along a whole index, for each statement given the
    keys of a claim or of an outcome (the due tasks of the keys a claim holds, whether the keys
    of finished tasks have a ready task left, the keys of finished tasks by name) in a
    burn-down of 10,000 keys: 10,000 keys read per claim and per outcome batch (`ANALYZE` of
    those statements during the benchmark). Each, and the read of the heads of ordered keys
    built the same way, now reads the keys it is given along the primary or the unique key,
    whatever the statistics. (The plan of the
    benchmark, taken on statistics of a busy table, did not come back here, on statistics of
    a table of one key: this guards the forced indexes, it did not fail before them.)"""
    url = server_url(request, "mysql", tmp_path)
    reset_schema(url)
    engine = create_engine(url_sync(url))
    with engine.begin() as conn:
        # statistics of a table of one key, kept (as between two recalculations of a busy
        # table: a burst of new keys arrives faster)
        keys_made = (
            "INSERT INTO txtasks_keys (queue, partition_key, ready_at, updated_at)"
            " SELECT 'q', concat('k', seq), now(6), now(6) FROM seq_{}_to_{}"
        )
        conn.execute(text("ALTER TABLE txtasks_keys STATS_AUTO_RECALC = 0"))
        conn.execute(text(keys_made.format(1, 1)))
        conn.execute(text("ANALYZE TABLE txtasks_keys"))
        conn.execute(text(keys_made.format(2, 10000)))
        conn.execute(text(INSERT_TASKS.format(queue="q", key="concat('k', seq)", count=10000)))
    given = 240  # a claim's keys
    try:
        with engine.begin() as conn:
            rows = conn.execute(
                select(keys_table.c.id, keys_table.c.queue, keys_table.c.partition_key)
                .where(keys_table.c.id % 40 == 0)  # spread over the table
                .limit(given)
            ).all()
            sql = dialect_for(conn.dialect)
            ids = {"ids": [r.id for r in rows]}
            statements = {
                "due": (sql.keys.stmt_keys_due_first(2), {**ids, "now": utcnow()}),
                "busy": (sql.keys.stmt_keys_busy(), ids),
                "heads": (sql.keys.stmt_keys_heads(), ids),
                "keys of": (sql.keys.stmt_keys_of(), {"pairs": [(r.queue, r.partition_key) for r in rows]}),
            }  # fmt: skip
            read = {}

            def analyzing(_c: Any, _cursor: Any, sent: str, parameters: Any, *_: Any) -> Any:
                return "ANALYZE FORMAT=JSON " + sent, parameters

            event.listen(engine, "before_cursor_execute", analyzing, retval=True)
            for name, (statement, params) in statements.items():
                with warnings.catch_warnings():  # the plan's one column, not the statement's
                    warnings.simplefilter("ignore", SAWarning)
                    analyzed = conn.execute(statement, params).scalar_one()
                read[name] = [
                    (n.get("access_type"), n.get("key"), n.get("r_rows"))
                    for n in json_nodes(json.loads(analyzed))
                    if n.get("table_name") in ("txtasks_keys", "k")
                ]
    finally:
        engine.dispose()
    for name, tables in read.items():
        assert tables and all(rows_read <= given for _a, _k, rows_read in tables), (name, read)


def json_nodes(plan: Any) -> list[dict[str, Any]]:
    """Every object of a MariaDB `ANALYZE FORMAT=JSON` plan that names a table."""
    found: list[dict[str, Any]] = []
    if isinstance(plan, dict):
        if "table_name" in plan:
            found.append(plan)
        for value in plan.values():
            found += json_nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            found += json_nodes(value)
    return found


async def test_a_key_claim_reads_only_the_keys_it_locks_along_their_indexes(
    request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statistics taken while the keys were few and none was armed (an idle queue, the usual
    moment for autovacuum to analyze them) must not turn the lock of a claim's keys, once a
    burst of tasks armed thousands, into reading and sorting every armed key; nor putting the
    keys aside, or the write of when to look at the keys it took again, into a read of every
    key of the table."""
    url = server_url(request, "postgresql", tmp_path)
    reset_schema(url)
    engine = create_engine(url_sync(url))
    keys_made = (
        "INSERT INTO txtasks_keys (queue, partition_key, updated_at)"
        " SELECT :queue, 'k' || i, now() FROM generate_series(1, :n) AS i"
    )
    with engine.begin() as conn:
        conn.execute(text(keys_made), {"queue": "other", "n": 20})
        conn.execute(text("ANALYZE txtasks_keys"))  # a few idle keys (none armed)
        conn.execute(text(keys_made), {"queue": "q", "n": 5000})
        for _ in range(6):  # armed and put aside by earlier claims, not vacuumed yet
            conn.execute(text("UPDATE txtasks_keys SET ready_at = now() WHERE queue = 'q'"))
            conn.execute(text("UPDATE txtasks_keys SET ready_at = NULL WHERE queue = 'q'"))
        conn.execute(
            text(
                "UPDATE txtasks_keys SET ready_at = now() - id * interval '1 second'"
                " WHERE queue = 'q'"
            )
        )
        conn.execute(  # three due tasks for each of the 10 keys that waited longest
            text(
                "INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state,"
                " priority, run_at, attempt, max_attempts, created_at, partition_key)"
                " SELECT 'q', 't', 'null', 'application/json', 'pending', 0,"
                " now() - interval '1 hour', 0, 3, now(), 'k' || i"
                " FROM generate_series(4991, 5000) AS i, generate_series(1, 3)"
            )
        )
    engine.dispose()
    driver = driver_for_url(url)
    assert isinstance(driver, PostgresDriver)
    plans: dict[str, Any] = {}

    def explaining(method: Any) -> Any:
        """The statements of a key claim on the asyncpg connection, explained first (run and
        undone), in its transaction, with its settings."""

        async def run(self: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
            kind = (
                "lock" if "FROM txtasks_keys" in sql and "FOR UPDATE" in sql
                else "settle" if sql.startswith("UPDATE txtasks_keys AS k")
                else None
            )  # fmt: skip
            if kind is not None:  # explained in a savepoint, undone: the lock changes keys
                savepoint = self.transaction()
                await savepoint.start()
                try:
                    plan = await self.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args)
                finally:
                    await savepoint.rollback()
                plans[kind] = json.loads(plan) if isinstance(plan, str) else plan
                plans[kind + " scans"] = (
                    await self.fetchval("SHOW enable_bitmapscan"),
                    await self.fetchval("SHOW enable_seqscan"),
                )
            return await method(self, sql, *args, **kwargs)

        return run

    monkeypatch.setattr(asyncpg.Connection, "fetch", explaining(asyncpg.Connection.fetch))
    monkeypatch.setattr(asyncpg.Connection, "execute", explaining(asyncpg.Connection.execute))
    now = utcnow()
    try:
        claimed = await driver.claims.keyed_claim(
            Claim(["q"], now, now + timedelta(minutes=1), "w"), LIMIT, {}
        )
        # and the intake of key hints, on the claims' pool, reads the first hints of its queues
        # (a bitmap scan read every hint of the backlog to take a thousand; a sequential scan
        # read the whole table, dead hints included, to find none)
        intake = [
            (await driver.db.raw_fetch("claims", f"SHOW {setting}"))[0][0]
            for setting in ("enable_bitmapscan", "enable_seqscan")
        ]
    finally:
        await driver.close()
    # no bitmap scan, no sequential scan (bitmap, sequential), whatever the statistics say
    assert len(claimed) == LIMIT  # a task of each key, whose next look is then written
    assert plans["lock scans"] == plans["settle scans"] == ("off", "off")
    assert intake == ["off", "off"]

    def keys_read(kind: str) -> list[tuple[str, str | None, int, int]]:
        return [
            (n["Node Type"], n.get("Index Name"), n["Actual Rows"], n["Actual Loops"])
            for n in nodes(plans[kind][0]["Plan"])
            if n.get("Relation Name") == "txtasks_keys" and n["Node Type"] != "ModifyTable"
        ]

    # the keys locked along the ready index, then put aside, each found by its primary key
    assert keys_read("lock") == [
        ("Index Scan", "ix_txtasks_keys_ready", LIMIT, 1),
        ("Index Scan", "txtasks_keys_pkey", 1, LIMIT),
    ]
    # their next look (more tasks are due), each found by its primary key
    assert keys_read("settle") == [("Index Scan", "txtasks_keys_pkey", LIMIT, 1)]
