"""Statements as data: one table of statement builders per feature, shared by every dialect.

A table is a class of builders that return statements (or plans of them) and never touch a
connection: `enqueue` (the insert plan), `claims`, `keys` (the keys' lane and key hints),
`outcomes` (fenced writes of attempts, leases), `topics`, `control`, `dashboard` (the
dashboard's reads), `history` (the queues' counts per minute, kept a week). `SqlDialect` holds one of each (`sql.keys.stmt_keys_arm()`); a database's
dialect overrides the entries its SQL does differently by naming a subclass of that table (see
mysql.py). Each table is bound to its dialect
(`Statements.sql`), through which a builder reaches the dialect's settings and other tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from txtasks.driver.dialect import SqlDialect


class Statements:
    """A table of one feature's statement builders, bound to one dialect (`sql`)."""

    #: The dialect this table is bound to (see `txtasks.driver.dialect.bind_tables`).
    sql: ClassVar[type[SqlDialect]]
