"""How a claim reads and writes on one database: the statements of the claim's tables run on a
connection of the claim's transaction (`SqlClaims` holds one; a database with a faster way,
PostgreSQL's single statements or MySQL's primary-key reads, has its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.database import SqlDatabase
from txtasks.driver.insert_plan import plan_run_async
from txtasks.driver.statements.keys import DUE_FIRST, KeysLook
from txtasks.keys import HINTS_PER_CLAIM
from txtasks.types import TaskRow


class SqlLanes:
    """The claim's statements, run on a connection of its transaction."""

    #: `keys_lock` puts the keys it locks aside (`ready_at` NULL) in the same statement, so
    #: that a claim's settle writes only the keys it looks at again (or whose rate moved).
    keys_lock_clears: ClassVar[bool] = False

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def claim(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """Claim a batch on `conn`, in its transaction (`params` as `stmt_claim`'s)."""
        result = await conn.execute(self.db.sql.claims.stmt_claim(), params)
        return [TaskRow.from_row(r) for r in result.mappings().all()]

    async def claim_named(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """Claim those of the tasks `ids` a claim would take (`params` as `claim`'s, with
        `ids`), on `conn`, in its transaction."""
        result = await conn.execute(self.db.sql.claims.stmt_claim_named(), params)
        return [TaskRow.from_row(r) for r in result.mappings().all()]

    async def hints_take(self, conn: AsyncConnection, queues: list[str], now: datetime) -> None:
        """Turn up to HINTS_PER_CLAIM hints of `queues` into armed keys, deleting them: their
        ids read and locked, the keys armed from them and the hints deleted, in the database."""
        params = {"queues": queues, "limit": HINTS_PER_CLAIM}
        ids = self.db.sql.scalars(await conn.execute(self.db.sql.keys.stmt_hints_take(), params))
        if not ids:
            return
        await conn.execute(self.db.sql.keys.stmt_hints_arm(), {"ids": ids, "now": now})
        await conn.execute(self.db.sql.keys.stmt_hints_delete(), {"ids": ids})

    async def keys_wake(
        self, conn: AsyncConnection, pairs: Sequence[tuple[str, str]], now: datetime
    ) -> None:
        """`keys_wake_plan` on `conn`."""
        await plan_run_async(conn, self.db.sql.keys.keys_wake_plan(pairs, now))

    async def keys_settle(self, conn: AsyncConnection, params: list[dict[str, Any]]) -> None:
        """Write each key's next look and rate start (params b_id, b_ready_at,
        b_next_start_at, now): one statement per distinct pair of times, which most keys of a
        claim share (an UPDATE per key is a round trip per key where the driver does not batch
        them)."""
        settled: dict[tuple[Any, Any, Any], list[int]] = {}
        for p in params:
            settled.setdefault((p["b_ready_at"], p["b_next_start_at"], p["now"]), []).append(
                p["b_id"]
            )
        for (ready_at, next_start_at, now), ids in settled.items():
            values = {"ready_at": ready_at, "next_start_at": next_start_at, "now": now}
            await conn.execute(self.db.sql.keys.stmt_keys_settle(), {"ids": sorted(ids), **values})

    async def keys_lock(
        self, conn: AsyncConnection, params: dict[str, Any]
    ) -> tuple[list[Any], list[Any]]:
        """The keys a claim serves (`keys_held`) and the `txtasks_key_limits` rows stored for
        them."""
        held = await self.keys_held(conn, params)
        if not held or (await conn.execute(self.db.sql.keys.stmt_key_limits_any())).first() is None:
            return held, []  # no limits stored at all, as usual: no names sent to look for
        return held, await self.key_overrides(conn, sorted({h.partition_key for h in held}))

    async def keys_held(self, conn: AsyncConnection, params: dict[str, Any]) -> list[Any]:
        """The keys a claim serves, locked, longest waiting first (params as
        `stmt_keys_lock`'s)."""
        return list(await conn.execute(self.db.sql.keys.stmt_keys_lock(), params))

    async def key_overrides(self, conn: AsyncConnection, names: list[str]) -> list[Any]:
        """The `txtasks_key_limits` rows of keys `names` (mappings)."""
        return list(
            (await conn.execute(self.db.sql.keys.stmt_key_overrides(), {"names": names})).mappings()
        )

    async def keys_running(
        self, conn: AsyncConnection, pairs: list[tuple[str, str]]
    ) -> list[tuple[str, str, int]]:
        """(queue, key, tasks processing) of the keys `pairs` (queue, key) that have some."""
        names = sorted({k for _q, k in pairs})
        result = await conn.execute(self.db.sql.keys.stmt_keys_running(), {"names": names})
        return [(q, k, int(n)) for q, k, n in self.db.sql.rows(result)]

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
        """The running counts of the keys `counted`, the heads of the keys `ordered`, and up to
        n due ready tasks of each (queue, key, n) `asked` (`key_ids`: each key's row): one
        statement each, and one more for keys asking for more than `DUE_FIRST` tasks."""
        look = KeysLook()
        if counted:
            look.running = {(q, k): n for q, k, n in await self.keys_running(conn, counted)}
        if ordered:
            heads = await self.keys_heads(conn, [key_ids[pair] for pair in ordered])
            look.heads = {(r.queue, r.partition_key): r for r in heads}
        few = [(q, k, n) for q, k, n in asked if n <= DUE_FIRST]
        if few:
            count = max(n for _q, _k, n in few)
            wanted = {(q, k): n for q, k, n in few}
            params = {"ids": [key_ids[(q, k)] for q, k, _n in few], "now": now}
            pairs = {key_id: pair for pair, key_id in key_ids.items()}
            due_first = await conn.execute(self.db.sql.keys.stmt_keys_due_first(count), params)
            for key_id, *first in self.db.sql.rows(due_first):
                pair = pairs[key_id]
                due = [task_id for task_id in first[: wanted[pair]] if task_id is not None]
                if due:
                    look.due[pair] = due
        many = [(q, k, n) for q, k, n in asked if n > DUE_FIRST]
        if many:
            for task_id, queue, key in await self.keys_due(conn, many, now):
                look.due.setdefault((queue, key), []).append(task_id)
        return look

    async def keys_heads(self, conn: AsyncConnection, ids: list[int]) -> list[Any]:
        """The first live task (id, queue, partition_key, state, run_at) of the keys of rows
        `ids`."""
        return list(await conn.execute(self.db.sql.keys.stmt_keys_heads(), {"ids": ids}))

    async def keys_due(
        self, conn: AsyncConnection, asked: list[tuple[str, str, int]], now: datetime
    ) -> list[Any]:
        """Up to n due ready tasks (id, queue, partition_key) of each (queue, key, n)."""
        params: dict[str, Any] = {"now": now}
        for i, (queue, key, n) in enumerate(asked):
            params.update({f"q{i}": queue, f"k{i}": key, f"n{i}": n})
        return list(await conn.execute(self.db.sql.keys.stmt_keys_due(len(asked)), params))

    async def claim_ids(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        """Claim the ready rows `ids` (params as `stmt_claim`'s, with `ids`)."""
        result = await conn.execute(self.db.sql.claims.stmt_claim_rows(), params)
        return [TaskRow.from_row(r) for r in result.mappings().all()]
