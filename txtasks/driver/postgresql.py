"""PostgreSQL: ON CONFLICT for dedup, UPDATE ... RETURNING with SKIP LOCKED for claims."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
from collections.abc import Generator, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Connection, Executable, Result, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from txtasks.driver.base import Capabilities, WriteResult
from txtasks.driver.database import CLOSE_WITHIN, ENGINE_MIN, SqlDatabase
from txtasks.driver.dialect import SqlDialect
from txtasks.driver.insert_plan import CopyRows, Statement, Step
from txtasks.driver.pooling import POOLED_CONNECT_ARGS, POOLER_PARAM, TRANSACTION
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sql_claims import Claim, SqlClaims
from txtasks.driver.sql_lanes import SqlLanes
from txtasks.driver.statements.dashboard import minute_of
from txtasks.driver.statements.enqueue import EnqueueStatements
from txtasks.driver.statements.keys import (
    HeldKey,
    KeyHead,
    KeysLook,
)
from txtasks.driver.statements.topics import TopicStatements
from txtasks.driver.timeouts import Watchdog, keepalive_set, socket_of
from txtasks.errors import ConfigurationError
from txtasks.keys import HINTS_PER_CLAIM
from txtasks.schema import migrate as schema_migrate
from txtasks.schema.tables import READY, TASK_COLUMNS
from txtasks.types import CLAIMED_COLUMNS, NewPublish, NewTask, Outcome, TaskKey, TaskRow

#: SQLSTATEs worth a fresh transaction: serialization failure, deadlock.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})


#: The claim as one autocommit statement, sent straight to asyncpg: one round trip, no
#: BEGIN/COMMIT, no SQLAlchemy row processing on the latency-critical path. Tasks with a key are
#: claimed by the keys' lane (`SqlClaims.keyed_claim`), not here. Each queue is read
#: on its own along the claim index (an index scan cannot merge several queues in order), at
#: most `limit` rows each; the first `limit` of those in claim order are taken. A paused queue
#: is not read at all (a one-time filter of its lookup: one probe of a tiny table per queue).
CLAIM_SQL = f"""
WITH claimed AS (
UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1,
       lease_expires_at = $1, worker_id = $2, started_at = $3
 WHERE id IN (SELECT r.id FROM unnest($4::varchar[]) AS q(name),
              LATERAL (SELECT id, priority, run_at FROM txtasks_tasks
                        WHERE queue = q.name AND partition_key IS NULL AND {READY}
                          AND run_at <= $3
                          AND NOT EXISTS (SELECT 1 FROM txtasks_paused_queues p
                                           WHERE p.queue = q.name)
                        ORDER BY priority DESC, run_at, id
                        LIMIT $5
                        FOR UPDATE SKIP LOCKED) AS r
              ORDER BY r.priority DESC, r.run_at, r.id
              LIMIT $5)
RETURNING {", ".join(CLAIMED_COLUMNS)}
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id
"""


#: Claim those of the tasks $4 (ids, comma-separated) that `CLAIM_SQL` would take from the
#: queues $5, each found by its primary key (`SqlClaims.task_claim_ids`). One UPDATE, no
#: sub-select: a row another transaction holds is waited for (a claim's or a sweep's single
#: statement), then checked again, so a task claimed meanwhile is left out.
CLAIM_NAMED_SQL = f"""
UPDATE txtasks_tasks AS t SET state = 'processing', attempt = t.attempt + 1,
       lease_expires_at = $1, worker_id = $2, started_at = $3
 WHERE t.id = ANY(string_to_array($4, ',')::bigint[])
   AND t.queue = ANY($5::varchar[]) AND t.partition_key IS NULL
   AND t.{READY} AND t.run_at <= $3
   AND NOT EXISTS (SELECT 1 FROM txtasks_paused_queues p WHERE p.queue = t.queue)
RETURNING {", ".join("t." + c for c in CLAIMED_COLUMNS)}
"""


#: Claim the ready rows $4 (their ids, comma-separated: asyncpg checks every element of an
#: array parameter in Python) of keys the claim holds, as `CLAIM_SQL` does.
CLAIM_IDS_SQL = f"""
UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1,
       lease_expires_at = $1, worker_id = $2, started_at = $3
 WHERE id = ANY(string_to_array($4, ',')::bigint[]) AND {READY}
RETURNING {", ".join(CLAIMED_COLUMNS)}
"""
#: Take up to :limit hints of :queues and arm their keys, in one statement, without waiting
#: for a claim: a key a claim holds (locked) keeps its hints, which a later intake takes once
#: the claim has let go (the claim may put the key aside, having read its tasks before the
#: hint's task was committed). The others' hints are deleted, their keys armed for the hint's
#: time, or made. Any hints will do: a key is armed for its hint's time, so which hint comes
#: first does not change the turns (an `ORDER BY id` read and sorted every hint when the
#: statistics were stale). The hints deleted travel as an array of ids, so that the delete
#: finds them by the primary key (`IN (SELECT ...)` became a hash join over a sequential scan
#: of every hint).
HINTS_TAKE = """
WITH picked AS (
  SELECT id, queue, partition_key, run_at FROM txtasks_key_hints
   WHERE queue = ANY($1::varchar[]) LIMIT $2 FOR UPDATE SKIP LOCKED
), wanted AS (
  SELECT queue, partition_key, min(run_at) AS run_at FROM picked GROUP BY queue, partition_key
), free AS (
  SELECT k.id, k.queue, k.partition_key, k.ready_at, w.run_at
    FROM txtasks_keys k JOIN wanted w USING (queue, partition_key)
   ORDER BY k.id FOR UPDATE OF k SKIP LOCKED
), armed AS (
  UPDATE txtasks_keys k SET ready_at = f.run_at, updated_at = $3
    FROM free f WHERE k.id = f.id AND (f.ready_at IS NULL OR f.ready_at > f.run_at)
), made AS (
  INSERT INTO txtasks_keys AS k (queue, partition_key, ready_at, updated_at)
  SELECT w.queue, w.partition_key, w.run_at, $3 FROM wanted w
   WHERE NOT EXISTS (SELECT 1 FROM txtasks_keys e
                      WHERE e.queue = w.queue AND e.partition_key = w.partition_key)
   ORDER BY w.queue, w.partition_key
  ON CONFLICT (queue, partition_key) DO NOTHING
  RETURNING k.queue, k.partition_key
)
DELETE FROM txtasks_key_hints WHERE id = ANY(ARRAY(
  SELECT p.id FROM picked p
   WHERE (p.queue, p.partition_key) IN (SELECT queue, partition_key FROM free
                                        UNION ALL SELECT queue, partition_key FROM made)))
"""
#: Each held key's next look and rate start, from arrays (the ids comma-separated, as
#: `CLAIM_IDS_SQL`'s). The keys are found by their primary key (`k.id = ANY($1)`, and no
#: sequential scan in the claim's transaction: `KEYS_PLANS`): a join with the arrays alone was
#: planned as a hash of every key of the table, read in full at each claim.
KEYS_SETTLE = (
    "UPDATE txtasks_keys AS k SET ready_at = v.ready_at, next_start_at = v.next_start_at, "
    "updated_at = $4 FROM unnest(string_to_array($1, ',')::bigint[], $2::timestamp[], "
    "$3::timestamp[]) AS v(id, ready_at, next_start_at) "
    "WHERE k.id = v.id AND k.id = ANY(string_to_array($1, ',')::bigint[])"
)
#: The plans of a claim of the keys' lane, for its transaction: every statement of it reads a
#: few rows along an index in that index's order, and a bitmap scan reads every match before it
#: sorts them. Statistics taken before a queue's keys were armed (a new queue, a burst of new
#: keys: the table grows faster than autovacuum analyzes it) estimate a row or two, and the lock
#: of the keys that waited longest then read and sorted every armed key (10,000 keys: 9,607 rows
#: sorted to lock 107), per claim. Nor a sequential scan: a plan made while the table held a few
#: thousand keys (and kept by the connection's prepared statement) read every key to write the
#: next look of the 250 a claim took, long after the table held 30,000.
KEYS_PLANS = (
    "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)"
)
#: What the keys a claim holds have (`SqlLanes.keys_look`), in one statement. The keys travel
#: as JSON arrays of their queues and names (asyncpg checks every element of an array parameter
#: in Python, and names may hold any character), and come back as their place in them: rows
#: 'r' count the tasks processing of each key ($1[i], $2[i]), one probe of the running index
#: per key; rows 'h' give the first live task of each ordered key ($3[i], $4[i]); rows 'd' the
#: first $7[i] due ready tasks of each other key ($5[i], $6[i]; $7 comma-separated), in claim
#: order.
KEYS_LOOK_SQL = f"""
SELECT 'r' AS kind, k.i, r.n, NULL::bigint AS id, NULL::varchar AS state,
       NULL::timestamp AS run_at, NULL::bigint[] AS ids
  FROM ROWS FROM (json_array_elements_text($1::json), json_array_elements_text($2::json))
       WITH ORDINALITY AS k(queue, partition_key, i)
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM txtasks_tasks t
                       WHERE t.queue = k.queue AND t.partition_key = k.partition_key
                         AND t.state = 'processing') AS r
 WHERE r.n > 0
UNION ALL
SELECT 'h', k.i, NULL, t.id, t.state, t.run_at, NULL
  FROM ROWS FROM (json_array_elements_text($3::json), json_array_elements_text($4::json))
       WITH ORDINALITY AS k(queue, partition_key, i)
  CROSS JOIN LATERAL (SELECT id, state, run_at FROM txtasks_tasks
                       WHERE queue = k.queue AND partition_key = k.partition_key
                         AND state IN ('pending', 'retryable', 'processing')
                       ORDER BY id LIMIT 1) AS t
UNION ALL
SELECT 'd', k.i, NULL, NULL, NULL, NULL, d.ids
  FROM ROWS FROM (json_array_elements_text($5::json), json_array_elements_text($6::json),
                  unnest(string_to_array($7, ',')::int[]))
       WITH ORDINALITY AS k(queue, partition_key, n, i)
  CROSS JOIN LATERAL (SELECT array_agg(id ORDER BY priority DESC, run_at, id) AS ids
                        FROM (SELECT id, priority, run_at FROM txtasks_tasks
                               WHERE queue = k.queue AND partition_key = k.partition_key
                                 AND {READY} AND run_at <= $8
                               ORDER BY priority DESC, run_at, id LIMIT k.n) AS x) AS d
 WHERE d.ids IS NOT NULL
"""

#: The limits a `txtasks_key_limits` row stores.
_LIMIT_COLUMNS = ("concurrency", "ordered", "rate_count", "rate_per", "rate_burst")


@functools.cache
def _keys_lock_sql(queues: int) -> str:
    """The keys of `queues` ($3...) not paused, ready by $1, longest waiting first, up to $2,
    locked, skipping those another claim holds, and put aside (`ready_at` NULL: the claim's
    settle writes only the keys it looks at again, see `SqlLanes.keys_lock_clears`); each
    with the limits stored for it (a row per stored limit, of its queue or of every queue
    '*'). The queues are separate parameters, so that with one queue the scan of the ready
    index is an equality, in the index's order."""
    names = ", ".join(f"${i + 3}" for i in range(queues))
    return f"""
WITH held AS (
  SELECT id, ready_at FROM txtasks_keys
   WHERE queue IN ({names}) AND queue NOT IN (SELECT queue FROM txtasks_paused_queues)
     AND ready_at <= $1::timestamp
   ORDER BY ready_at, id LIMIT $2::int FOR UPDATE SKIP LOCKED
), taken AS (
  UPDATE txtasks_keys k SET ready_at = NULL, updated_at = $1::timestamp
    FROM held WHERE k.id = held.id
  RETURNING k.id, k.queue, k.partition_key, k.next_start_at, held.ready_at)
SELECT h.id, h.queue, h.partition_key, h.next_start_at, o.queue,
       {", ".join(f"o.{c}" for c in _LIMIT_COLUMNS)}
  FROM taken h LEFT JOIN txtasks_key_limits o
    ON o.partition_key = h.partition_key AND (o.queue = h.queue OR o.queue = '*')
 ORDER BY h.ready_at, h.id
"""


_ARCHIVED = [c for c in TASK_COLUMNS if c not in ("state", "lease_expires_at", "last_error")]

#: Finishing outcomes (completed, failed, discarded, dead) in one autocommit statement: lock the
#: outcomes' rows in id order and keep the still-current attempts (the fence: id, attempt,
#: processing, held by worker $5 unless NULL, lease expired before $6 unless NULL), delete them
#: from the hot table and copy them into the archive with their final state (completed ones
#: only when $8), and arm the keys they had that still have a ready task (`SqlLanes.keys_wake`,
#: see txtasks.keys: a probe per key of the claim index from its far end, away from the entries
#: its claimed and finished tasks leave until a vacuum; an EXISTS would be planned as a
#: sequential scan for a key with many tasks). Each
#: outcome finds its row by the primary key whatever the statistics say (a join planned from
#: stale ones compared every row with every outcome); `OFFSET 0` keeps the
#: fence out of the lookup, so that no partial index stands in for the primary key, and a row
#: that fails the fence is only locked for the moment of the statement. Ids, attempts and
#: states travel as comma-separated text (asyncpg checks every element of an array parameter
#: in Python); errors as an array, or NULL when the batch has none.
FINISH_SQL = f"""
WITH o AS (
  SELECT * FROM unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ',')::int[],
                       string_to_array($3, ',')::varchar[], coalesce($4::text[], '{{}}'))
           AS o(id, attempt, final_state, error)
   ORDER BY id
), locked AS (
  SELECT t.id, o.final_state, o.error
    FROM o CROSS JOIN LATERAL (
      SELECT t.id, t.attempt, t.state, t.worker_id, t.lease_expires_at
        FROM txtasks_tasks t WHERE t.id = o.id OFFSET 0 FOR UPDATE OF t) AS t
   WHERE t.attempt = o.attempt AND t.state = 'processing'
     AND ($5::varchar IS NULL OR t.worker_id = $5)
     AND ($6::timestamp IS NULL OR t.lease_expires_at < $6)
), done AS (
  DELETE FROM txtasks_tasks t USING locked l WHERE t.id = l.id
  RETURNING t.*, l.final_state, l.error
), kept AS (
  INSERT INTO txtasks_archive ({", ".join(_ARCHIVED)},
                               state, lease_expires_at, last_error, finished_at)
  SELECT {", ".join(_ARCHIVED)}, final_state, NULL, coalesce(error, last_error), $7
    FROM done WHERE $8 OR final_state <> 'completed'
), ended AS (
  SELECT e.queue, e.partition_key
    FROM (SELECT DISTINCT queue, partition_key FROM done WHERE partition_key IS NOT NULL) AS e
   WHERE (SELECT 1 FROM txtasks_tasks t
           WHERE t.queue = e.queue AND t.partition_key = e.partition_key
             AND t.state IN ('pending', 'retryable')
           ORDER BY t.priority, t.run_at DESC, t.id DESC LIMIT 1) IS NOT NULL
), held AS (
  SELECT k.id, k.queue, k.partition_key, k.ready_at
    FROM txtasks_keys k JOIN ended e USING (queue, partition_key)
   ORDER BY k.id FOR UPDATE OF k SKIP LOCKED
), woken AS (
  UPDATE txtasks_keys k SET ready_at = $7, updated_at = $7
    FROM held WHERE k.id = held.id AND (held.ready_at IS NULL OR held.ready_at > $7)
), hinted AS (
  INSERT INTO txtasks_key_hints (queue, partition_key, run_at)
  SELECT queue, partition_key, $7::timestamp FROM ended
   WHERE (queue, partition_key) NOT IN (SELECT queue, partition_key FROM held)
)
SELECT id, attempt FROM done
"""

#: The columns of a bulk enqueue, with the array type each travels in when COPY is not at hand.
_ARRAY_TYPES = {
    "id": "bigint[]",
    "queue": "varchar[]",
    "task_name": "varchar[]",
    "payload": "bytea[]",
    "content_type": "varchar[]",
    "state": "varchar[]",
    "priority": "int[]",
    "run_at": "timestamp[]",
    "attempt": "int[]",
    "max_attempts": "int[]",
    "created_at": "timestamp[]",
    "dedup_key": "varchar[]",
    "headers": "text[]",
    "expires_at": "timestamp[]",
    "stage_id": "varchar[]",
    "partition_key": "varchar[]",
}
BULK_COLUMNS = tuple(_ARRAY_TYPES)
#: Ids for a bulk enqueue, drawn before its rows are sent.
DRAW_IDS = text("SELECT array_agg(nextval('txtasks_tasks_id_seq')) FROM generate_series(1, :n)")
#: A bulk enqueue as one statement of one array per column (where COPY is not at hand).
INSERT_ARRAYS = text(
    "INSERT INTO txtasks_tasks ({}) SELECT * FROM unnest({})".format(
        ", ".join(BULK_COLUMNS), ", ".join(f"CAST(:{c} AS {t})" for c, t in _ARRAY_TYPES.items())
    )
)


#: The publishes of a bulk publish, one array per field, with the array type each travels in.
_PUBLISH_ARRAYS = {
    "topic": "varchar[]",
    "payload": "bytea[]",
    "content_type": "varchar[]",
    "run_at": "timestamp[]",
    "created_at": "timestamp[]",
    "dedup": "varchar[]",
    "head": "text[]",
    "tail": "text[]",
    "partition_key": "varchar[]",
    "priority": "int[]",
}
#: The most publishes one statement of arrays carries (and the most payload bytes).
PUBLISH_ARRAY_CHUNK = 1000
PUBLISH_ARRAY_BYTES = 16 * 1024 * 1024


def _publish_arrays_sql(dedup: bool) -> str:
    """A bulk publish as one INSERT ... SELECT of arrays (one per field, whatever the number of
    publishes) joined to the subscriptions; with dedup keys, in key order (`byte_order`) and
    skipping a group's delivery whose key is live."""
    fields = ", ".join(_PUBLISH_ARRAYS)
    arrays = ", ".join(f"CAST(:{f} AS {t})" for f, t in _PUBLISH_ARRAYS.items())
    dedup_key = "s.group_name || '/' || p.dedup" if dedup else "NULL"
    # keys in byte order, as an enqueue sorts them, whatever the database's collation
    order = f'({dedup_key}) COLLATE "C", p.i' if dedup else "p.i, s.group_name"
    skip = " ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING" if dedup else ""
    return (
        "INSERT INTO txtasks_tasks (queue, task_name, payload, content_type, state, priority, "
        "run_at, attempt, max_attempts, created_at, dedup_key, headers, partition_key) "
        "SELECT s.queue, s.task_name, p.payload, p.content_type, 'pending', "
        "coalesce(p.priority, s.priority), p.run_at, 0, s.max_attempts, p.created_at, "
        f"{dedup_key}, p.head || s.group_name || p.tail, p.partition_key "
        f"FROM unnest({arrays}) WITH ORDINALITY AS p({fields}, i) "
        f"JOIN txtasks_subscriptions s ON s.topic = p.topic ORDER BY {order}{skip} "
        "RETURNING id, queue, headers"
    )


#: A bulk publish (see `_publish_arrays_sql`), without and with dedup keys.
PUBLISH_ARRAYS = {dedup: text(_publish_arrays_sql(dedup)) for dedup in (False, True)}


def _bulk_record(new_id: int, row: NewTask) -> tuple[Any, ...]:
    """A new task as a record of `BULK_COLUMNS`."""
    return (
        new_id,
        row.queue,
        row.task_name,
        row.payload,
        row.content_type,
        row.state.value,
        row.priority,
        row.run_at,
        0,
        row.max_attempts,
        row.created_at,
        row.dedup_key,
        row.headers,
        row.expires_at,
        row.stage_id,
        row.partition_key,
    )


def _bulk_arrays(records: list[tuple[Any, ...]]) -> Statement:
    """`INSERT_ARRAYS` of the records."""
    columns = zip(*records, strict=True)
    return INSERT_ARRAYS, {c: list(v) for c, v in zip(BULK_COLUMNS, columns, strict=True)}


def _lock_settings(conn: Connection, lock: str, statement: str) -> None:
    """Set lock_timeout and statement_timeout for the rest of the transaction."""
    query = text(
        "SELECT set_config('lock_timeout', :lock, true), "
        "set_config('statement_timeout', :statement, true)"
    )
    conn.execute(query, {"lock": lock, "statement": statement})


def _sqlstate(exc: DBAPIError) -> str | None:
    """The SQLSTATE of a PostgreSQL error (asyncpg: sqlstate; psycopg: pgcode)."""
    orig = exc.orig
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


async def _raw(conn: AsyncConnection) -> Any:
    """The asyncpg connection under `conn`, inside its transaction (begun by a statement
    `conn` ran before)."""
    return (await conn.get_raw_connection()).driver_connection


#: The SQLSTATE of a lock wait that ran out of lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


@compiles(minute_of, "postgresql")
def _minute_postgresql(element: minute_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"to_char({compiler.process(element.clauses, **kw)}, 'YYYY-MM-DD HH24:MI')"


class PostgresEnqueueStatements(EnqueueStatements):
    """Postgres's enqueue statements."""

    @classmethod
    def _insert_plain(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        """Several rows: ids drawn in one statement, then the rows sent with COPY (or one
        statement of arrays); one row: the plain INSERT."""
        if len(todo) == 1:
            yield from super()._insert_plain(rows, todo, ids)
            return
        drawn = yield DRAW_IDS, {"n": len(todo)}
        new_ids = sorted(drawn.scalar_one())
        records = [_bulk_record(n, rows[i]) for n, i in zip(new_ids, todo, strict=True)]
        yield CopyRows("txtasks_tasks", BULK_COLUMNS, records, lambda: _bulk_arrays(records))
        for i, new_id in zip(todo, new_ids, strict=True):
            ids[i] = new_id


class PostgresTopicStatements(TopicStatements):
    """Postgres's topics statements."""

    @classmethod
    @functools.cache
    def stmt_publish(cls, count: int, dedup: bool) -> Executable:
        """Fan publishes out to their topics' groups in one INSERT ... SELECT of arrays: one
        statement shape whatever the number of publishes (a `UNION ALL` of bound rows takes
        PostgreSQL long to plan)."""
        return PUBLISH_ARRAYS[dedup]

    @staticmethod
    def publish_chunks(publishes: Sequence[NewPublish]) -> list[tuple[int, int]]:
        """Up to PUBLISH_ARRAY_CHUNK publishes per statement, within PUBLISH_ARRAY_BYTES."""
        chunks, start, size, size_bytes = [], 0, 0, 0
        for p in publishes:
            if size and (
                size == PUBLISH_ARRAY_CHUNK or size_bytes + len(p.payload) > PUBLISH_ARRAY_BYTES
            ):
                chunks.append((start, size))
                start, size, size_bytes = start + size, 0, 0
            size += 1
            size_bytes += len(p.payload)
        if size:
            chunks.append((start, size))
        return chunks

    @staticmethod
    def publish_params(chunk: Sequence[NewPublish]) -> dict[str, Any]:
        """The arrays of `stmt_publish`."""
        return {
            "topic": [p.topic for p in chunk],
            "payload": [p.payload for p in chunk],
            "content_type": [p.content_type for p in chunk],
            "run_at": [p.run_at for p in chunk],
            "created_at": [p.created_at for p in chunk],
            "dedup": [p.dedup_key for p in chunk],
            "head": [p.headers_head for p in chunk],
            "tail": [p.headers_tail for p in chunk],
            "partition_key": [p.partition_key for p in chunk],
            "priority": [p.priority for p in chunk],
        }


class PostgresLanes(SqlLanes):
    """A claim's statements run the Postgres way."""

    keys_lock_clears: ClassVar[bool] = True

    async def keys_settle(self, conn: AsyncConnection, params: list[dict[str, Any]]) -> None:
        """One statement of arrays, not one per key, on the asyncpg connection."""
        await (await _raw(conn)).execute(
            KEYS_SETTLE,
            ",".join([str(p["b_id"]) for p in params]),
            [p["b_ready_at"] for p in params],
            [p["b_next_start_at"] for p in params],
            params[0]["now"],
        )

    async def claim_ids(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """The claim's own statement (as `CLAIM_SQL`), on the asyncpg connection under `conn`,
        inside its transaction."""
        raw = await _raw(conn)
        p = params
        records = await raw.fetch(
            CLAIM_IDS_SQL, p["lease_until"], p["worker_id"], p["now"], ",".join(map(str, p["ids"]))
        )
        return [TaskRow.from_claim(r, p["worker_id"], p["lease_until"], p["now"]) for r in records]

    async def keys_lock(
        self, conn: AsyncConnection, params: dict[str, Any]
    ) -> tuple[list[Any], list[Any]]:
        """One statement on the asyncpg connection (`_keys_lock_sql`): the keys locked, each
        with the limits stored for it (if any). First the claim's transaction turns bitmap
        and sequential scans off (`KEYS_PLANS`)."""
        await conn.exec_driver_sql(KEYS_PLANS)  # begins the transaction, as its first statement
        queues = params["queues"]
        records = await (await _raw(conn)).fetch(
            _keys_lock_sql(len(queues)), params["now"], params["limit"], *queues
        )
        held: dict[int, HeldKey] = {}
        stored = []
        for r in records:
            if r[0] not in held:
                held[r[0]] = HeldKey(r[0], r[1], r[2], r[3])
            if r[4] is not None:
                stored.append(
                    {"queue": r[4], "partition_key": r[2]}
                    | dict(zip(_LIMIT_COLUMNS, r[5:], strict=True))
                )
        return list(held.values()), stored

    async def keys_look(
        self,
        conn: AsyncConnection,
        *,
        counted: list[tuple[str, str]],
        ordered: list[tuple[str, str]],
        asked: list[tuple[str, str, int]],
        key_ids: Mapping[tuple[str, str], int],
        now: datetime,
    ) -> KeysLook:
        """One statement, on the asyncpg connection, the keys as JSON arrays."""
        raw = await _raw(conn)
        rows = await raw.fetch(
            KEYS_LOOK_SQL,
            json.dumps([q for q, _k in counted]),
            json.dumps([k for _q, k in counted]),
            json.dumps([q for q, _k in ordered]),
            json.dumps([k for _q, k in ordered]),
            json.dumps([q for q, _k, _n in asked]),
            json.dumps([k for _q, k, _n in asked]),
            ",".join([str(n) for _q, _k, n in asked]),
            now,
        )
        look = KeysLook()
        for kind, i, n, task_id, state, run_at, ids in rows:
            if kind == "r":
                look.running[counted[i - 1]] = n
            elif kind == "h":
                look.heads[ordered[i - 1]] = KeyHead(task_id, state, run_at)
            else:
                queue, key, _n = asked[i - 1]
                look.due[(queue, key)] = ids
        return look


class PostgresDialect(SqlDialect):
    """PostgreSQL 12+: ON CONFLICT for dedup, COPY for bulk enqueues, an advisory migration
    lock."""

    capabilities: ClassVar[Capabilities] = Capabilities("postgresql")

    upsert = staticmethod(pg_insert)
    enqueue = PostgresEnqueueStatements
    topics = PostgresTopicStatements

    @staticmethod
    @contextlib.contextmanager
    def migration_lock(conn: Connection) -> Iterator[None]:
        """A transaction-level advisory lock, waited for up to LOCK_WAIT seconds (whatever the
        session's statement_timeout): the commit (or rollback) of the migrating transaction
        releases it."""
        saved = conn.execute(
            text("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")
        ).one()
        _lock_settings(conn, f"{schema_migrate.LOCK_WAIT}s", "0")
        try:
            conn.exec_driver_sql(
                f"SELECT pg_advisory_xact_lock(hashtext('{schema_migrate.LOCK_NAME}'))"
            )
        except DBAPIError as exc:
            if _sqlstate(exc) == LOCK_NOT_AVAILABLE:
                raise schema_migrate.lock_timeout_error() from None
            raise
        _lock_settings(conn, *saved)
        yield

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        code: Any = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        return code in TRANSIENT_SQLSTATES


#: The session settings of the asyncpg pools, by purpose (`PostgresDatabase.raw_pool`).
RAW_SETTINGS: dict[str, dict[str, str]] = {
    # claims: no bitmap or sequential scan either, as in a claim of the keys' lane
    # (`KEYS_PLANS`): the intake of key hints read every hint of its queues, from stale
    # statistics, to take a thousand of them, or to find none
    "claims": {"synchronous_commit": "off", "enable_bitmapscan": "off", "enable_seqscan": "off"},
    # a plan per batch: a generic plan of the outcome statement walks the lease index (every
    # claimed-then-deleted row leaves a dead entry there) instead of the ids
    "writes": {"plan_cache_mode": "force_custom_plan"},
}
#: The same, where a statement carries them itself (`PostgresDatabase.raw_local`): no
#: statement is kept by name there, so each is planned for its own parameters anyway.
RAW_LOCAL_SETTINGS = {
    purpose: "; ".join(
        f"SET LOCAL {name} = '{value}'" for name, value in settings.items()
        if name != "plan_cache_mode"
    )
    for purpose, settings in RAW_SETTINGS.items()
}  # fmt: skip
#: The name of the one pool all purposes share under a small budget.
RAW_SHARED = "shared"
#: Seconds an asyncpg pool's connection stays open unused.
RAW_IDLE = 60.0


class PostgresDatabase(SqlDatabase):
    """PostgreSQL 12+ through asyncpg (async) and psycopg (sync), and small asyncpg pools of
    its own for the worker's hot path (`raw_fetch`): one autocommit statement each, no
    SQLAlchemy compilation or row processing. Claim sessions run with `synchronous_commit =
    off` (no wait for the WAL flush): a claim lost in a database crash only leaves its task
    pending, to be claimed again. Outcomes and enqueues keep the server's durability
    setting.

    Behind a transaction pooler (the URL's `pooler=transaction`, txtasks.driver.pooling), and
    when a small connection budget gives the asyncpg pools one connection to share
    (`raw_shared`), no session holds a purpose's settings: a statement whose purpose has
    some runs in a transaction of its own that sets them first (`SET LOCAL`)."""

    dialect_class = PostgresDialect
    #: One connection for the asyncpg pools, two for the engine.
    min_connections: ClassVar[int] = 1 + ENGINE_MIN
    poolable: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: dict[str, tuple[asyncio.AbstractEventLoop, Any]] = {}
        self._pool_locks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = {}
        #: Per raw pool (by `raw_name`), the connection of its last statement, kept for the
        #: next (`raw_fetch`).
        self._kept: dict[str, tuple[Any, Any]] = {}
        #: Per raw pool, the statements waiting for one of its connections: the connection a
        #: statement is done with goes back to the pool then, not kept.
        self._acquiring: dict[str, int] = {}

    @property
    def raw_shared(self) -> bool:
        """Whether the asyncpg pools are one pool of one connection: under a budget that
        would leave the engines less than `ENGINE_MIN` each with a pool per purpose."""
        if self.connections is None:
            return False
        engines = 2 if self.sync_shared else 1
        return self.connections - len(RAW_SETTINGS) < ENGINE_MIN * engines

    @property
    def raw_local(self) -> bool:
        """Whether the asyncpg pools' statements carry their purpose's settings themselves
        (`SET LOCAL` in a transaction of their own) instead of their sessions: behind a
        transaction pooler, or in the shared pool."""
        return self.pooler is not None or self.raw_shared

    def engines_budget(self) -> int | None:
        """The budget less the asyncpg pools' connections (one each, or one shared)."""
        if self.connections is None:
            return None
        return self.connections - (1 if self.raw_shared else len(RAW_SETTINGS))

    def server_settings(self) -> dict[str, str]:
        """The server's side of the bounds: it ends a session left idle in a transaction (its
        client gone) and probes idle clients, so locks of a vanished worker are freed.
        Behind a transaction pooler, none: they would go in the startup packet, which
        PgBouncer refuses ("unsupported startup parameter"); its own `idle_transaction_timeout`
        and keepalives stand in for them."""
        if self.pooler is not None:
            return {}
        t = self.timeouts
        settings = {
            "tcp_keepalives_idle": str(int(t.keepalive_idle)),
            "tcp_keepalives_interval": str(int(t.keepalive_interval)),
            "tcp_keepalives_count": str(t.keepalive_count),
        }
        if t.command is not None:
            settings["idle_in_transaction_session_timeout"] = str(int(t.command * 1000))
        return settings

    def connect_args(self, sync: bool) -> dict[str, Any]:
        t = self.timeouts
        pooled = self.pooler is not None
        if not sync:  # asyncpg; keepalives are set on the socket by engine_setup
            args = {"timeout": t.connect, "server_settings": self.server_settings()}
            return {**args, **(POOLED_CONNECT_ARGS["asyncpg"] if pooled else {})}
        return {  # psycopg: libpq's own parameters
            "connect_timeout": max(1, math.ceil(t.connect)),
            "keepalives": 1,
            "keepalives_idle": max(1, int(t.keepalive_idle)),
            "keepalives_interval": max(1, int(t.keepalive_interval)),
            "keepalives_count": t.keepalive_count,
            "tcp_user_timeout": int(t.dead_after * 1000),
            **(POOLED_CONNECT_ARGS["psycopg"] if pooled else {}),
        }

    def connect_refused(self, exc: DBAPIError) -> Exception | None:
        """PgBouncer refuses the settings txtasks sends when it connects: name the URL
        parameter that stops them."""
        detail = str(exc.orig)
        if self.pooler is None and "unsupported startup parameter" in detail:
            return ConfigurationError(
                f"the database refused to connect ({detail}): a PgBouncer in transaction mode? "
                f"add ?{POOLER_PARAM}={TRANSACTION} to the database URL (docs/connections.md)"
            )
        return None

    async def raw_pool(self, purpose: str = "claims") -> Any:
        """asyncpg connections outside SQLAlchemy (one pool per purpose and event loop, or
        one for all under a small budget, `raw_shared`): "claims" without waiting for the
        WAL flush, "writes" with the server's setting (`RAW_SETTINGS`). A connection idle for
        `RAW_IDLE` seconds is closed."""
        import asyncpg  # the postgres extra

        name = self.raw_name(purpose)
        loop = asyncio.get_running_loop()
        held = self._pools.get(name)
        if held is not None and held[0] is loop:
            return held[1]
        async with self._pool_lock(name, loop):  # callers racing at start share one pool
            held = self._pools.get(name)
            if held is not None and held[0] is loop:
                return held[1]
            url = self.url.difference_update_query([POOLER_PARAM])
            dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
            settings = {} if self.raw_local else RAW_SETTINGS.get(purpose, {})
            local = self.raw_local
            pool = await asyncpg.create_pool(
                dsn,
                min_size=0,
                max_size=1 if self.connections is not None else 2,
                max_inactive_connection_lifetime=RAW_IDLE,
                timeout=self.timeouts.connect,
                server_settings={**self.server_settings(), **settings},
                # no statement kept by name in a session another client may get next, nor
                # one whose plan was made for another purpose's settings
                **({"statement_cache_size": 0} if local else {}),
                init=self._raw_init,
                reset=self._raw_reset,
            )
            self._pools[name] = (loop, pool)
            return pool

    def raw_name(self, purpose: str) -> str:
        """The name of the asyncpg pool of `purpose`: its own, or the one all share."""
        return RAW_SHARED if self.raw_shared else purpose

    def _pool_lock(self, purpose: str, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        """What callers wait on while the pool of `purpose` is made on `loop`."""
        held = self._pool_locks.get(purpose)
        if held is None or held[0] is not loop:
            held = self._pool_locks[purpose] = (loop, asyncio.Lock())
        return held[1]

    async def _raw_init(self, connection: Any) -> None:
        keepalive_set(socket_of(connection), self.timeouts)

    @staticmethod
    async def _raw_reset(connection: Any) -> None:
        """Nothing to undo when a raw pool's connection comes back: it ran one autocommit
        statement (or one in a transaction it ended), which leaves no session state (no
        cursor, LISTEN, advisory lock or SET), and asyncpg rolls back a transaction left open
        by itself. asyncpg's default reset (`RESET ALL`, `UNLISTEN *`, ...) would cost a
        round trip per claim and per write."""

    async def raw_fetch(self, purpose: str, sql: str, *params: Any) -> list[Any]:
        """One autocommit statement on a raw pool, bounded by the command timeout. The
        connection of a statement that succeeded is kept for the pool's next one: asyncpg's
        acquire and release cost a task and a turn of the event loop each, on the path from
        a wake-up to the handler. One that failed goes back to the pool, which replaces it
        if it broke."""
        pool = await self.raw_pool(purpose)
        name = self.raw_name(purpose)
        kept = self._kept.pop(name, None)
        connection = kept[1] if kept is not None and kept[0] is pool else None
        if connection is not None and connection.is_closed():
            await pool.release(connection)
            connection = None
        if connection is None:
            self._acquiring[name] = self._acquiring.get(name, 0) + 1
            try:
                connection = await pool.acquire(timeout=self.timeouts.checkout)
            finally:
                self._acquiring[name] -= 1
        watchdog = Watchdog(self.timeouts.command, connection.terminate)
        try:
            with watchdog.armed():
                try:
                    records = await self._raw_run(connection, purpose, sql, params)
                except BaseException:  # its release may roll a transaction back: bounded too
                    await pool.release(connection)
                    raise
        finally:
            if watchdog.fired:
                await self.stale_pool()
        if (
            name in self._kept
            or self._acquiring.get(name)  # another statement waits for it (a pool of one)
            or self._pools.get(name, (None, None))[1] is not pool
        ):
            await pool.release(connection)  # another statement kept one meanwhile
        else:
            self._kept[name] = (pool, connection)
        return records

    async def _kept_release(self) -> None:
        """Hand the kept connections of this loop's pools back (closed if expired)."""
        loop = asyncio.get_running_loop()
        for purpose, (pool, connection) in list(self._kept.items()):
            pool_loop = self._pools.get(purpose, (None, None))[0]
            if pool_loop is loop and self._kept.get(purpose, (None, None))[1] is connection:
                del self._kept[purpose]
                with contextlib.suppress(Exception):
                    await pool.release(connection)

    async def _raw_run(
        self, connection: Any, purpose: str, sql: str, params: Sequence[Any]
    ) -> list[Any]:
        """The statement on `connection`: on its own, or, when its purpose's settings are not
        the session's (`raw_local`), after them in a transaction of its own (`BEGIN` and the
        settings in one round trip)."""
        settings = RAW_LOCAL_SETTINGS.get(purpose) if self.raw_local else None
        if not settings:
            return await connection.fetch(sql, *params)  # type: ignore[no-any-return]
        await connection.execute(f"BEGIN; {settings}")
        try:
            records = await connection.fetch(sql, *params)
            await connection.execute("COMMIT")
        except BaseException:
            if not connection.is_closed() and connection.is_in_transaction():
                with contextlib.suppress(Exception):
                    await connection.execute("ROLLBACK")
            raise
        return records  # type: ignore[no-any-return]

    async def stale_pool(self) -> None:
        """Also the raw pools' connections: replaced at their next acquire."""
        await super().stale_pool()
        loop = asyncio.get_running_loop()
        for pool_loop, pool in list(self._pools.values()):
            if pool_loop is loop:
                await pool.expire_connections()
        await self._kept_release()

    async def close(self) -> None:
        await self._kept_release()
        self._kept.clear()
        pools, self._pools = self._pools, {}
        for loop, pool in pools.values():
            if loop is asyncio.get_running_loop():
                try:
                    await asyncio.wait_for(pool.close(), CLOSE_WITHIN)
                except asyncio.TimeoutError:
                    pool.terminate()  # stalled connections: closed without a goodbye
        await super().close()

    async def raw_retrying(self, purpose: str, sql: str, params: Sequence[Any]) -> list[Any]:
        """One autocommit statement on a raw pool, again after a deadlock or serialization
        failure."""
        return await self.retrying(lambda: self.raw_fetch(purpose, sql, *params))


class PostgresClaims(SqlClaims):
    """Claims without a key, the intake of key hints and finishing outcomes as one asyncpg
    statement each (`CLAIM_SQL`, `HINTS_TAKE`, `FINISH_SQL`)."""

    db: PostgresDatabase
    lanes_class = PostgresLanes

    async def _hints_take(self, claim: Claim) -> None:
        """One autocommit statement on the claims' pool: delete the hints, arm their keys."""
        params = (claim.queues, HINTS_PER_CLAIM, claim.now)
        await self.db.raw_retrying("claims", HINTS_TAKE, params)

    async def plain_claim(self, claim: Claim, limit: int) -> list[TaskRow]:
        c = claim
        records = await self.db.raw_fetch(
            "claims", CLAIM_SQL, c.lease_until, c.worker_id, c.now, c.queues, limit
        )
        return [TaskRow.from_claim(r, c.worker_id, c.lease_until, c.now) for r in records]

    async def named_claim(self, claim: Claim, ids: list[int]) -> list[TaskRow]:
        c = claim
        text_ids = ",".join(map(str, ids))
        records = await self.db.raw_fetch(
            "claims", CLAIM_NAMED_SQL, c.lease_until, c.worker_id, c.now, text_ids, c.queues
        )
        return [TaskRow.from_claim(r, c.worker_id, c.lease_until, c.now) for r in records]

    async def outcome_write_many(
        self,
        outcomes: Sequence[Outcome],
        *,
        now: datetime,
        archive_completed: bool = True,
        worker_id: str | None = None,
        expired_before: datetime | None = None,
    ) -> WriteResult:
        """Finishing outcomes in one statement (it locks their rows in id order); retries,
        releases and results the generic way."""
        finishing = [o for o in outcomes if o.kind.finishes and o.result is None]
        others = [o for o in outcomes if not o.kind.finishes or o.result is not None]
        stale: list[TaskKey] = []
        if finishing:
            errors = [o.error for o in finishing]
            params = (
                ",".join([str(o.key.id) for o in finishing]),
                ",".join([str(o.key.attempt) for o in finishing]),
                ",".join([o.kind for o in finishing]),  # str members: their values
                errors if any(e is not None for e in errors) else None,
                worker_id,
                expired_before,
                now,
                archive_completed,
            )
            records = await self.db.raw_retrying("writes", FINISH_SQL, params)
            if len(records) < len(finishing):  # some fenced off (keys are unique per batch)
                done = {TaskKey(r[0], r[1]) for r in records}
                stale.extend(o.key for o in finishing if o.key not in done)
        if others:
            result = await super().outcome_write_many(
                others,
                now=now,
                archive_completed=archive_completed,
                worker_id=worker_id,
                expired_before=expired_before,
            )
            stale.extend(result.stale)
        return WriteResult(len(outcomes) - len(stale), tuple(stale))


class PostgresDriver(SqlDriver):
    """PostgreSQL 12+: `PostgresDatabase`, and the worker's hot path on asyncpg
    (`PostgresClaims`)."""

    database_class = PostgresDatabase
    claims_class = PostgresClaims
    db: PostgresDatabase
