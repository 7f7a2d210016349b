"""Rows from the database become the same TaskRow by name and by position; a new task gives
the same column values by name (`task_values`) and by position (PostgreSQL's bulk records)."""

from __future__ import annotations

from datetime import datetime, timedelta

from txtasks.schema.tables import TASK_COLUMNS
from txtasks.types import CLAIMED_COLUMNS, TaskRow, TaskState


def test_a_row_by_position_equals_the_row_by_name() -> None:
    t0 = datetime(2026, 1, 2, 3, 4, 5, 6)
    values = {
        "id": 7,
        "queue": "q",
        "task_name": "send",
        "payload": memoryview(b'{"a":1}'),
        "content_type": "application/json",
        "state": "processing",
        "priority": 3,
        "run_at": t0,
        "attempt": 2,
        "max_attempts": 5,
        "created_at": t0 - timedelta(seconds=1),
        "dedup_key": "k",
        "headers": '{"h":"v"}',
        "checkpoint": "[1]",
        "last_error": "boom",
        "worker_id": "w",
        "lease_expires_at": t0 + timedelta(seconds=2),
        "started_at": t0 + timedelta(seconds=3),
        "expires_at": t0 + timedelta(seconds=4),
        "stage_id": "s",
        "partition_key": "customer:42",
        "progress": None,  # not read by a claim: a handler reports its own
        "cancel_requested_at": None,  # a claim takes only waiting rows: never cancel-requested
    }
    assert set(values) == set(TASK_COLUMNS)
    claimed = tuple(values[c] for c in CLAIMED_COLUMNS)
    by_position = TaskRow.from_claim(claimed, "w", values["lease_expires_at"], values["started_at"])
    assert by_position == TaskRow.from_row(values)
    assert set(TASK_COLUMNS) - set(CLAIMED_COLUMNS) == {
        "state", "worker_id", "lease_expires_at", "started_at",  # what the claim writes
        "progress",  # not read by a claim: a handler reports its own
        "cancel_requested_at",  # NULL on every waiting row: a cancel archives those at once
    }  # fmt: skip
    assert by_position.state is TaskState.PROCESSING
    assert by_position.payload == b'{"a":1}' and type(by_position.payload) is bytes


def test_a_bulk_record_holds_the_task_values_in_bulk_column_order() -> None:
    from txtasks.driver.insert_plan import task_values
    from txtasks.driver.postgresql import BULK_COLUMNS, _bulk_record
    from txtasks.types import NewTask

    t0 = datetime(2026, 1, 2, 3, 4, 5, 6)
    row = NewTask(
        queue="q", task_name="send", payload=b"{}", content_type="application/json",
        priority=3, run_at=t0, max_attempts=5, created_at=t0 - timedelta(seconds=1),
        dedup_key="k", headers='{"h":"v"}', expires_at=t0 + timedelta(seconds=4),
        state=TaskState.STAGED, stage_id="s",
    )  # fmt: skip
    values = task_values(row)
    assert ("id", *values) == BULK_COLUMNS
    assert _bulk_record(7, row) == (7, *values.values())


def test_the_task_columns_are_the_task_values_in_order() -> None:
    """MariaDB's and SQLite's bulk statements list `TASK_COLUMNS`; their records follow
    `task_values`' order."""
    from txtasks.driver.insert_plan import TASK_COLUMNS, task_values
    from txtasks.types import NewTask

    t0 = datetime(2026, 1, 2, 3, 4, 5, 6)
    row = NewTask(
        queue="q", task_name="send", payload=b"{}", content_type="application/json",
        priority=0, run_at=t0, max_attempts=3, created_at=t0,
    )  # fmt: skip
    assert tuple(task_values(row)) == TASK_COLUMNS
