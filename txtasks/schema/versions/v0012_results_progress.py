"""Results and progress: the archive keeps the return value of a task that asks for it
(`keep_result=True`), and both tables the last progress its handler reported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, Text
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 12
NAME = "results_progress"

_LONG_TEXT = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.add_column("txtasks_tasks", Column("progress", _LONG_TEXT, nullable=True))
    op.add_column("txtasks_archive", Column("progress", _LONG_TEXT, nullable=True))
    op.add_column("txtasks_archive", Column("result", _LONG_TEXT, nullable=True))
