"""How many connections a process opens, and whether a pooler stands before the database.

Two settings, read by every SQL driver:

- **The connection budget** (`connections`): the most connections one driver (so one worker,
  cleaner or application process) holds at once. `App(db_connections=N)` or a driver's
  `connections=N`, overridden by the environment variable ``TXTASKS_DB_CONNECTIONS`` (which
  the ``--db-connections`` flag of ``txtasks worker`` and ``txtasks cleaner`` sets). Unset:
  each pool its own default size (docs/connections.md has the table). Each database splits
  the budget among its pools (`SqlDatabase.engine_connections`, PostgreSQL's own asyncpg
  pools, and the sync engine's in a worker with sync handlers: `SqlDatabase.share_with_sync`),
  and a handler's own transaction never takes the last connection of the worker's loops
  (`SqlDatabase.attempt_slot`).
- **The pooler** (`pooler`): the URL parameter ``pooler=transaction`` says that the URL
  reaches PostgreSQL through a pooler in transaction mode (PgBouncer's
  ``pool_mode = transaction``), which may hand each transaction of a client connection to
  another server connection. Then nothing txtasks does relies on the state of a server
  session across transactions: no prepared statements kept by name (asyncpg's and
  SQLAlchemy's statement caches, psycopg's automatic preparation), no settings sent when
  connecting (PgBouncer refuses them), settings of a statement made `SET LOCAL` in its own
  transaction instead. ``pooler=session`` and ``pooler=none`` (a session pooler, or none)
  change nothing. The parameter is taken out of the URL before it reaches the database
  driver.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import URL

from txtasks._checks import check_number
from txtasks.errors import ConfigurationError

log = logging.getLogger("txtasks.driver")

#: The URL query parameter naming the pooler in front of the database.
POOLER_PARAM = "pooler"
#: A pooler that may give each transaction another server connection (PgBouncer's
#: ``pool_mode = transaction``).
TRANSACTION = "transaction"
#: The values `POOLER_PARAM` takes: only `TRANSACTION` changes anything.
POOLERS = (TRANSACTION, "session", "none")
#: The environment variable of the connection budget (``--db-connections`` sets it).
ENV_CONNECTIONS = "TXTASKS_DB_CONNECTIONS"
#: The most connections a budget may name (a typo guard: PostgreSQL's default
#: max_connections is 100).
MAX_CONNECTIONS = 10_000

#: The connect arguments of the DB-API drivers behind a transaction pooler: no statement is
#: prepared under a name that another client of the same server connection may meet
#: (asyncpg's statement cache, and SQLAlchemy's of prepared statements above it, unnamed
#: statements re-sent with each execution: asyncpg's own provision for PgBouncer; psycopg's
#: automatic preparation of a query run five times).
POOLED_CONNECT_ARGS: dict[str, dict[str, Any]] = {
    "asyncpg": {"statement_cache_size": 0, "prepared_statement_cache_size": 0},
    "psycopg": {"prepare_threshold": None},
}


def pooler_of(url: URL) -> tuple[str | None, URL]:
    """The pooler the URL names (`TRANSACTION`, or None: none that matters), and the URL
    without the parameter."""
    value = url.query.get(POOLER_PARAM)
    if value is None:
        return None, url
    if not isinstance(value, str):
        raise ConfigurationError(f"{POOLER_PARAM}: given more than once in the database URL")
    name = value.strip().lower()
    if name not in POOLERS:
        raise ConfigurationError(
            f"{POOLER_PARAM}: expected {', '.join(POOLERS)} (a URL parameter, e.g. "
            f"postgresql://app:pw@pgbouncer:6432/app?{POOLER_PARAM}={TRANSACTION}), got {value!r}"
        )
    return (TRANSACTION if name == TRANSACTION else None), url.difference_update_query(
        [POOLER_PARAM]
    )


def connections_check(value: Any, setting: str = "db_connections") -> int:
    """A connection budget: an integer from 1 to `MAX_CONNECTIONS`."""
    check_number(setting, value, minimum=1, maximum=MAX_CONNECTIONS, integer=True)
    return int(value)


def connections_parse(text: str, setting: str = ENV_CONNECTIONS) -> int:
    """A connection budget given as text (the environment, a flag)."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{setting}: expected a number of connections, got {text!r}"
        ) from None
    return connections_check(value, setting)


def connections_resolve(
    given: int | None, env: Mapping[str, str] | None = None, *, minimum: int = 1
) -> int | None:
    """The budget: the environment's (``TXTASKS_DB_CONNECTIONS``) over `given` (one line
    logged when both are set and differ), None when neither is. At least `minimum`, the
    fewest the database's pools work with."""
    env = os.environ if env is None else env
    text = env.get(ENV_CONNECTIONS, "").strip()
    budget = None if given is None else connections_check(given)
    if text:
        from_env = connections_parse(text)
        if budget is not None and budget != from_env:
            log.info(
                "db_connections: %s=%d used, over the %d given in code", ENV_CONNECTIONS,
                from_env, budget,
            )  # fmt: skip
        budget = from_env
    if budget is not None and budget < minimum:
        raise ConfigurationError(
            f"db_connections: at least {minimum} on this database (its pools need as many), "
            f"got {budget}"
        )
    return budget
