"""Large tables for the dashboard's plan test and benchmark, made by the database itself (one
INSERT ... SELECT over a series of numbers): live tasks in 20 queues and finished ones over
the last day, the same rows on PostgreSQL, MariaDB/MySQL and SQLite."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text

#: Per database: the rows 1..n (column i), now (UTC), a number of seconds as an interval, text
#: concatenation, a text as payload bytes.
_SQL = {
    "postgresql": {
        "series": "generate_series(1, {n}) AS s(i)",
        "now": "(now() AT TIME ZONE 'UTC')",
        "seconds": "interval '1 second' * ({x})",
        "cat": "{a} || {b}",
        "bytes": "convert_to({x}, 'UTF8')",
    },
    "mysql": {
        "series": "(SELECT CAST(seq AS SIGNED) AS i FROM seq_1_to_{n}) AS s",
        "now": "UTC_TIMESTAMP(6)",
        "seconds": "INTERVAL ({x}) * 1000000 MICROSECOND",
        "cat": "CONCAT({a}, {b})",
        "bytes": "{x}",
    },
    "sqlite": {
        "series": "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n})"
        " SELECT i FROM s) AS s",
        "now": "'{now}'",
        "seconds": "",
        "cat": "{a} || {b}",
        "bytes": "CAST({x} AS BLOB)",
    },
}


def _plus(dialect: str, at: str, seconds: str) -> str:
    """A timestamp `at` plus `seconds` (an SQL number) as a timestamp."""
    if dialect == "sqlite":
        return f"strftime('%Y-%m-%d %H:%M:%f', {at}, ({seconds}) || ' seconds') || '000'"
    return f"{at} + {_SQL[dialect]['seconds'].format(x=seconds)}"


def live_sql(dialect: str, rows: int, now: str = "") -> str:
    """`rows` live tasks in 20 queues: mostly pending, a tenth scheduled an hour later, some
    retrying with an error, processing under a lease (one in 50), keyed (1,000 keys)."""
    d = _SQL[dialect]
    at = d["now"].format(now=now)

    def cat(*parts: str) -> str:
        out = parts[0]
        for part in parts[1:]:
            out = d["cat"].format(a=out, b=part)
        return out

    m = (lambda a, b: f"MOD({a}, {b})") if dialect == "mysql" else (lambda a, b: f"({a} % {b})")
    payload = d["bytes"].format(x=cat("'{\"n\": '", "i", "'}'"))
    return f"""
INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority, run_at,
    attempt, max_attempts, created_at, partition_key, last_error, worker_id, lease_expires_at)
SELECT {cat("'q'", m("i", 20))}, {cat("'task'", m("i", 7))},
    {payload}, 'application/json',
    CASE WHEN {m("i", 50)} = 0 THEN 'processing' WHEN {m("i", 20)} = 1 THEN 'retryable'
        ELSE 'pending' END,
    0,
    CASE WHEN {m("i", 10)} = 2 THEN {_plus(dialect, at, "3600")} ELSE {_plus(dialect, at, "0")} END,
    CASE WHEN {m("i", 20)} = 1 THEN 1 ELSE 0 END, 5,
    {_plus(dialect, at, f"i - {rows}")},
    CASE WHEN {m("i", 8)} = 3 THEN {cat("'k'", m("i", 1000))} END,
    CASE WHEN {m("i", 20)} = 1 THEN {cat("'RuntimeError: upstream '", m("i", 97), "' timed out'")}
        END,
    CASE WHEN {m("i", 50)} = 0 THEN {cat("'worker-'", m("i", 4))} END,
    CASE WHEN {m("i", 50)} = 0 THEN {_plus(dialect, at, "3600")} END
FROM {d["series"].format(n=rows)}
"""


def archive_sql(dialect: str, rows: int, first_id: int, now: str = "") -> str:
    """`rows` finished tasks (ids after `first_id`) over the last day: completed, one in ten
    dead with an error."""
    d = _SQL[dialect]
    at = d["now"].format(now=now)
    m = (lambda a, b: f"MOD({a}, {b})") if dialect == "mysql" else (lambda a, b: f"({a} % {b})")

    def cat(a: str, b: str) -> str:
        return d["cat"].format(a=a, b=b)

    day_ago = _plus(dialect, at, "-86400")
    return f"""
INSERT INTO txtasks_archive (id, queue, task_name, payload, content_type, state, priority,
    run_at, attempt, max_attempts, created_at, last_error, finished_at)
SELECT {first_id} + i, {cat("'q'", m("i", 20))}, {cat("'task'", m("i", 7))},
    {d["bytes"].format(x="'null'")}, 'application/json',
    CASE WHEN {m("i", 10)} = 0 THEN 'dead' ELSE 'completed' END, 0, {day_ago}, 1, 5, {day_ago},
    CASE WHEN {m("i", 10)} = 0 THEN {cat("'ValueError: bad row '", m("i", 31))} END,
    {_plus(dialect, at, f"-86400.0 * i / {rows}")}
FROM {d["series"].format(n=rows)}
"""


def history_sql(dialect: str, minutes: int, queues: int, last: int) -> str:
    """The queues' history of `minutes` minutes up to minute `last` (its number) for `queues`
    queues: every row there can be, as a week of the cleaners' passes leaves it."""
    d = _SQL[dialect]
    m = (lambda a, b: f"MOD({a}, {b})") if dialect == "mysql" else (lambda a, b: f"({a} % {b})")
    minute = (
        f"{last} - ((i - 1) / {queues})"
        if dialect != "mysql"
        else f"{last} - ((i - 1) DIV {queues})"
    )
    return f"""
INSERT INTO txtasks_history (minute, queue, enqueued, completed, failed, dead)
SELECT {minute}, {d["cat"].format(a="'q'", b=m("i", queues))}, 10, 9, 0, 1
FROM {d["series"].format(n=minutes * queues)}
"""


def dialect_of(driver: Any) -> str:
    """The key of `_SQL` for a SQL driver's database."""
    name = str(driver.db.engine.dialect.name)
    return "mysql" if name in ("mysql", "mariadb") else name


async def load(conn: Any, dialect: str, live: int, archived: int, now: datetime) -> None:
    """Insert the rows (`now`: the time SQLite takes for now; the servers use their clock).
    `conn` is an AsyncConnection in a transaction."""
    at = now.strftime("%Y-%m-%d %H:%M:%S.%f")
    await conn.execute(text(live_sql(dialect, live, at)))
    if archived:
        await conn.execute(text(archive_sql(dialect, archived, 2 * live, at)))


async def analyze(conn: Any, dialect: str) -> None:
    """Fresh planner statistics of the task tables (`conn` in autocommit on PostgreSQL)."""
    for table in ("txtasks_tasks", "txtasks_archive", "txtasks_history"):
        if dialect == "postgresql":
            await conn.execute(text(f"VACUUM ANALYZE {table}"))
        elif dialect == "mysql":
            await conn.execute(text(f"ANALYZE TABLE {table}"))
    if dialect == "sqlite":
        await conn.execute(text("ANALYZE"))
