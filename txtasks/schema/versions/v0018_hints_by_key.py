"""An index of the key hints of each key: the intake of hints that arms a key takes every hint
of that key, not only those among the first it read. A key enqueued to in many transactions
left a hint per transaction, and each hint taken after the key had started armed it again, for
a claim that locked it only to find its slots full."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 18
NAME = "hints_by_key"


def upgrade(op: Operations) -> None:
    op.create_index("ix_txtasks_key_hints_key", "txtasks_key_hints", ["queue", "partition_key"])
