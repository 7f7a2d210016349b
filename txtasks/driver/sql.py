"""The SQL driver: one database handle and the roles that run its dialect's statements.

`SqlDriver` holds a `SqlDatabase` (database.py: engines bounded by `Timeouts`, short
transactions, retries of transient failures, the dialect `db.sql`) and one object per role of
the contract, each sharing that handle: `tasks` (sql_tasks.py), `claims` (sql_claims.py),
`topics`, `control`, `admin`, `sweeps`, `processes`, `dashboard` (sql_dashboard.py). A
database's module (postgresql.py, mysql.py, sqlite.py) picks its database class and, where it
pays, a role of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import Engine, literal, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from txtasks.driver.base import Capabilities, moved_to_role
from txtasks.driver.database import SqlDatabase
from txtasks.driver.sql_admin import SqlAdmin
from txtasks.driver.sql_claims import SqlClaims
from txtasks.driver.sql_control import SqlControl
from txtasks.driver.sql_dashboard import SqlDashboard
from txtasks.driver.sql_processes import SqlProcesses
from txtasks.driver.sql_sweeps import SqlSweeps
from txtasks.driver.sql_tasks import SqlTasks
from txtasks.driver.sql_topics import SqlTopics
from txtasks.driver.timeouts import Timeouts
from txtasks.errors import SchemaError
from txtasks.schema import migrate as schema_migrate


class SqlDriver:
    """A task store on a SQL database through SQLAlchemy's asyncio engine."""

    #: The handle of this driver's database (its connection settings and dialect).
    database_class: ClassVar[type[SqlDatabase]]
    #: The claims role: a database with a hot path of its own (PostgreSQL) brings its own.
    claims_class: ClassVar[type[SqlClaims]] = SqlClaims

    def __init__(
        self,
        url: str | URL,
        *,
        engine: AsyncEngine | None = None,
        engine_options: Mapping[str, Any] | None = None,
        timeouts: Timeouts | None = None,
        connections: int | None = None,
    ) -> None:
        self.db = self.database_class(
            url,
            engine=engine,
            engine_options=engine_options,
            timeouts=timeouts,
            connections=connections,
        )
        self.tasks = SqlTasks(self.db)
        self.claims = self.claims_class(self.db)
        self.topics = SqlTopics(self.db)
        self.control = SqlControl(self.db)
        self.admin = SqlAdmin(self.db)
        self.sweeps = SqlSweeps(self.db)
        self.processes = SqlProcesses(self.db)
        self.dashboard = SqlDashboard(self.db)

    @property
    def capabilities(self) -> Capabilities:
        return self.db.sql.capabilities

    @property
    def engine(self) -> AsyncEngine:
        """The database's async engine, for the application's own statements."""
        return self.db.engine

    @property
    def sync_engine(self) -> Engine:
        """The database's sync engine."""
        return self.db.sync_engine

    @property
    def timeouts(self) -> Timeouts:
        """The bounds of every operation on the database (see txtasks.driver.timeouts)."""
        return self.db.timeouts

    @property
    def connections(self) -> int | None:
        """The connection budget of this driver's pools (see txtasks.driver.pooling)."""
        return self.db.connections

    @property
    def url(self) -> URL:
        """The database's URL (with its password: see `txtasks.faults.url_safe` to show it)."""
        return self.db.url

    if not TYPE_CHECKING:  # for type checkers, the old names are gone

        def __getattr__(self, name: str) -> Any:
            """A contract method by its name from before the roles: see `moved_to_role`."""
            return moved_to_role(self, name)

    async def open(self) -> None:
        async with self.db.connect() as conn:
            version = await conn.run_sync(schema_migrate.schema_version)
        latest = schema_migrate.latest_version()
        if version < latest:
            raise SchemaError(
                f"database schema is at version {version}, this txtasks needs {latest}: "
                "run `txtasks migrate`"
            )

    async def close(self) -> None:
        """Release every connection (see `SqlDatabase.close`)."""
        await self.db.close()

    async def migrate(self) -> list[int]:
        migrate = functools.partial(schema_migrate.migrate, lock=self.db.sql.migration_lock)
        async with self.db.begin(bounded=False) as conn:  # DDL on big tables may take a while
            applied = await conn.run_sync(migrate)
        return [m.version for m in applied]

    async def ping(self) -> None:
        """`SELECT 1` on a pooled connection, bounded by the command timeout."""
        async with self.db.connect() as conn:
            await conn.execute(select(literal(1)))
