"""txtasks in a Django project: enqueue in `transaction.atomic()` on Django's own connection.

Add `"txtasks.contrib.django"` to INSTALLED_APPS and name the application in the settings::

    TXTASKS_APP = "shop.tasks:app"   # the txtasks App with your tasks ("module:attribute")
    TXTASKS_DATABASE = "default"     # the Django database its tables live in (the default)

`enqueue(task, payload)` writes the task in the current transaction of that database's
connection; its wake-up goes out through `transaction.on_commit`, so a rollback (of the
transaction or of the savepoint it was enqueued in) leaves neither task nor wake-up.
`manage.py txtasks_worker`, `txtasks_cleaner` and `txtasks_migrate` run the `txtasks`
commands on the same database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL

from txtasks.dbapi import DbapiTx, driver_of
from txtasks.errors import ConfigurationError

if TYPE_CHECKING:
    from txtasks.app import App, Task
    from txtasks.types import NewTask

#: Django's database vendors (`connection.vendor`: its postgresql, mysql and sqlite3 backends
#: and those built on them, such as PostGIS) -> txtasks' backend names.
BACKENDS = {"postgresql": "postgresql", "mysql": "mysql", "sqlite": "sqlite"}


def database_alias() -> str:
    """The Django database the txtasks tables live in (`TXTASKS_DATABASE`, else "default")."""
    from django.conf import settings

    return str(getattr(settings, "TXTASKS_DATABASE", "default"))


def database_url(using: str | None = None) -> str:
    """The txtasks database URL of a Django database (for workers, cleaners and migrate)."""
    from django.db import connections

    alias = using or database_alias()
    conf = connections[alias].settings_dict
    backend = BACKENDS.get(connections[alias].vendor)
    if backend is None:
        raise ConfigurationError(
            f"TXTASKS_DATABASE: database {alias!r} uses {conf['ENGINE']}; txtasks supports "
            "Django's postgresql, mysql and sqlite3 backends"
        )
    if backend == "sqlite":
        return f"sqlite:///{conf['NAME']}"
    url = URL.create(
        backend,
        username=conf.get("USER") or None,
        password=conf.get("PASSWORD") or None,
        host=conf.get("HOST") or None,
        port=int(conf["PORT"]) if conf.get("PORT") else None,
        database=conf.get("NAME") or None,
    )
    return url.render_as_string(hide_password=False)


def get_app() -> App:
    """The App `TXTASKS_APP` names, imported once."""
    from django.conf import settings

    from txtasks.cli.common import load_app

    path = getattr(settings, "TXTASKS_APP", None)
    if not path:
        raise ConfigurationError(
            'TXTASKS_APP: not set; add TXTASKS_APP = "yourmodule:app" to the Django settings'
        )
    return load_app(str(path))


def dbapi_tx(using: str | None = None) -> DbapiTx:
    """The current transaction of a Django database's connection, for `enqueue_tx` and its
    relatives; wake-ups are sent by `transaction.on_commit` (dropped with a rollback)."""
    from django.db import connections, transaction

    alias = using or database_alias()
    connection = connections[alias]
    connection.ensure_connection()

    def on_commit(publish: Any) -> None:
        transaction.on_commit(publish, using=alias)

    raw = connection.connection
    try:
        driver_of(raw)
    except ConfigurationError:
        raise ConfigurationError(
            f"TXTASKS_DATABASE: database {alias!r} is on a {type(raw).__module__} connection; "
            "use psycopg (3) or psycopg2 for PostgreSQL, mysqlclient or PyMySQL "
            "(pymysql.install_as_MySQLdb()) for MariaDB/MySQL, or sqlite3"
        ) from None
    return DbapiTx(raw, on_commit=on_commit)


def enqueue(
    task: Task | str, payload: Any = None, *, using: str | None = None, **options: Any
) -> int:
    """Enqueue one task in the current transaction of the Django database; its id."""
    app = get_app()
    return app.enqueue_tx(dbapi_tx(using), task, payload, **options)


def enqueue_many(rows: Iterable[NewTask], *, using: str | None = None) -> list[int]:
    """Enqueue tasks (`app.new_task(...)`) in the current transaction; their ids in order."""
    return get_app().enqueue_many_tx(dbapi_tx(using), rows)


__all__ = ["database_url", "dbapi_tx", "enqueue", "enqueue_many", "get_app"]
