"""The statements of a claim of tasks without a key: the ready rows, taken and leased in one
statement.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Executable,
    Integer,
    bindparam,
    select,
    update,
)

from txtasks.driver.statements import Statements
from txtasks.driver.statements.control import ControlStatements
from txtasks.schema.tables import (
    IS_READY,
    PROCESSING,
    Timestamp,
    tasks,
)


class ClaimStatements(Statements):
    """Claiming ready tasks without a key."""

    @staticmethod
    @functools.cache
    def stmt_ready() -> Any:
        """Ready task ids of `queues` (those not paused), in claim order, up to `limit`,
        locked, skipping locked."""
        return (
            select(tasks.c.id)
            .where(
                tasks.c.queue.in_(bindparam("queues", expanding=True)),
                tasks.c.queue.not_in(ControlStatements.paused_queue_names()),
                tasks.c.partition_key.is_(None),
                IS_READY,
                tasks.c.run_at <= bindparam("now", type_=Timestamp),
            )
            .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
            .limit(bindparam("limit", type_=Integer))
            .with_for_update(skip_locked=True)
        )

    @classmethod
    @functools.cache
    def stmt_ready_named(cls) -> Any:
        """Of the tasks `ids`, those `stmt_ready` would take (found by their primary key), in
        claim order, up to `limit`, locked, skipping locked."""
        return cls.stmt_ready().where(tasks.c.id.in_(bindparam("ids", expanding=True)))

    @staticmethod
    def claim_values() -> dict[str, Any]:
        """What a claim writes: processing, one more attempt, leased to the worker."""
        return {
            "state": PROCESSING,
            "attempt": tasks.c.attempt + 1,
            "lease_expires_at": bindparam("lease_until", type_=Timestamp),
            "worker_id": bindparam("worker_id"),
            "started_at": bindparam("now", type_=Timestamp),
        }

    @classmethod
    @functools.cache
    def stmt_claim(cls) -> Executable:
        """Claim a batch in one statement: UPDATE ... WHERE id IN (ready) RETURNING *."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(cls.stmt_ready().scalar_subquery()))
            .values(**cls.claim_values())
            .returning(*tasks.c)
        )

    @classmethod
    @functools.cache
    def stmt_claim_named(cls) -> Executable:
        """Claim the tasks `ids` a claim of `queues` would take (`stmt_ready_named`)."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(cls.stmt_ready_named().scalar_subquery()))
            .values(**cls.claim_values())
            .returning(*tasks.c)
        )

    @classmethod
    @functools.cache
    def stmt_claim_rows(cls) -> Executable:
        """Claim the ready rows `ids`: UPDATE ... RETURNING them."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)), IS_READY)
            .values(**cls.claim_values())
            .returning(*tasks.c)
        )
