"""A database and a RabbitMQ virtual host of its own for each pytest process of a test run.

Under pytest-xdist every worker process (gw0, gw1, ...) runs tests at the same time as the
others, on the same servers. Each gets databases named ``txt_<run>_<worker>`` (PostgreSQL and
MariaDB) and a virtual host of that name (RabbitMQ), so that one test's schema reset, rows or
wake-ups never reach another's. ``<run>`` is a token of the test run (``TXTASKS_TEST_RUN``, set
once by the controlling process and inherited by its workers), so two runs on one set of
servers never meet either.

- PostgreSQL: the first worker migrates ``txt_<run>_template``, every worker copies it with
  ``CREATE DATABASE ... TEMPLATE`` (under an advisory lock: a template must have no other
  session while it is copied). The test user needs ``CREATEDB`` (tests/services.sh gives it).
- MariaDB: ``CREATE DATABASE`` and the migrations (there are no templates). The test user needs
  the privileges on ``txt\\_%`` (tests/services.sh grants them).
- RabbitMQ: ``tests/services.sh vhost BASE NAME`` (rabbitmqctl on the node it started). A broker
  the suite did not start is used as given, on its own virtual host.

Each worker drops its own databases when its session ends; the controlling process drops
whatever is left of the run (a template, the databases of a worker that crashed).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from txtasks.driver.urls import url_sync

RUN_VAR = "TXTASKS_TEST_RUN"
#: Names of the databases of test runs begin so (the MariaDB grant of tests/services.sh).
PREFIX = "txt_"
#: Seconds a worker waits for another one that is creating the template.
LOCK_TIMEOUT = 120


def run_token() -> str:
    """The test run's token: set here once (by the process that comes first), inherited by the
    pytest-xdist workers it starts."""
    token = os.environ.get(RUN_VAR)
    if not token:
        token = os.environ[RUN_VAR] = secrets.token_hex(3)
    if not re.fullmatch(r"[a-z0-9]{1,16}", token):
        raise ValueError(f"{RUN_VAR}={token!r}: want 1-16 lowercase letters and digits")
    return token


def worker_name() -> str:
    """gw0, gw1, ... under pytest-xdist; ``main`` without it."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def own_name() -> str:
    """The database and virtual host name of this process in this run."""
    return f"{PREFIX}{run_token()}_{worker_name()}"


def with_database(url: str, name: str) -> str:
    """`url` naming database `name` instead of its own."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def with_vhost(url: str, vhost: str) -> str:
    """An AMQP `url` on virtual host `vhost`."""
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(vhost, safe="")))


@contextlib.contextmanager
def _admin(url: str) -> Iterator[Connection]:
    """An autocommit connection to `url`'s database (CREATE/DROP DATABASE run outside a
    transaction)."""
    engine = create_engine(url_sync(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _migrated(url: str) -> None:
    from txtasks.schema.migrate import migrate

    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            migrate(conn)
    finally:
        engine.dispose()


def _lock_key(name: str) -> int:
    return zlib.crc32(name.encode())


def create_postgres(base_url: str, name: str) -> str:
    """A migrated database `name` beside `base_url`'s, copied from the run's template."""
    template = f"{PREFIX}{run_token()}_template"
    with _admin(base_url) as conn:
        conn.exec_driver_sql(f"SET lock_timeout = '{LOCK_TIMEOUT}s'")
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _lock_key(template)})
        try:
            found = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname IN (:t, :n)"),
                {"t": template, "n": name},
            ).scalars()
            have = set(found)
            if template not in have:
                conn.exec_driver_sql(f'CREATE DATABASE "{template}"')
                _migrated(with_database(base_url, template))
            if name in have:  # left by an earlier session of this run (pytest --lf, reruns)
                conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _lock_key(template)})
    return with_database(base_url, name)


def create_mysql(base_url: str, name: str) -> str:
    """A migrated database `name` beside `base_url`'s."""
    with _admin(base_url) as conn:
        conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {LOCK_TIMEOUT}")
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    url = with_database(base_url, name)
    _migrated(url)
    return url


def drop_databases(kind: str, base_url: str, pattern: str) -> list[str]:
    """Drop the databases whose name matches the SQL LIKE `pattern`; their names."""
    with _admin(base_url) as conn:
        if kind == "postgresql":
            sql = "SELECT datname FROM pg_database WHERE datname LIKE :p"
            names = list(conn.execute(text(sql), {"p": pattern}).scalars())
            for name in names:  # FORCE: a process a test left behind may still be connected
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {LOCK_TIMEOUT}")
            sql = "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE :p"
            names = list(conn.execute(text(sql), {"p": pattern}).scalars())
            for name in names:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    return names


def like_literal(name: str) -> str:
    """`name` as a LIKE pattern that matches itself only (its underscores escaped)."""
    return name.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")


def create_database(kind: str, base_url: str, name: str) -> str:
    """The URL of a new, migrated database `name` on the server of `base_url`."""
    try:
        if kind == "postgresql":
            return create_postgres(base_url, name)
        return create_mysql(base_url, name)
    except Exception as e:
        raise RuntimeError(
            f"could not create the test database {name} beside {make_url(base_url)!r}: {e}\n"
            "The test user must be allowed to create databases (PostgreSQL CREATEDB; MariaDB "
            f"all privileges on {PREFIX}%): tests/services.sh grants both."
        ) from e


def vhost_command(services_sh: Path, base: Path, command: str, name: str) -> None:
    """`services.sh vhost|vhost-drop BASE NAME` on a RabbitMQ node that script started."""
    result = subprocess.run(
        ["bash", str(services_sh), command, str(base), name],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{services_sh} {command} {base} {name}: {result.stderr.strip()}")
