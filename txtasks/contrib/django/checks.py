"""System checks: TXTASKS_APP imports, and the txtasks tables are migrated (database checks,
run by `manage.py migrate` and `manage.py check --database default`)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from txtasks.errors import TxtasksError

MIGRATE_HINT = "run `python manage.py txtasks_migrate`"


def check_app(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """TXTASKS_APP names an App that imports."""
    from txtasks.contrib.django import get_app

    try:
        get_app()
    except TxtasksError as exc:
        return [checks.Error(str(exc), id="txtasks.E001")]
    except Exception as exc:  # an import error of the user's module, shown as one line
        return [
            checks.Error(
                f"TXTASKS_APP: cannot load it: {type(exc).__name__}: {exc}", id="txtasks.E001"
            )
        ]
    return []


def check_schema(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The txtasks tables of TXTASKS_DATABASE are at the package's latest migration."""
    from txtasks.contrib.django import database_alias, dbapi_tx
    from txtasks.schema.migrate import latest_version, schema_version

    alias = database_alias()
    if not databases or alias not in databases:
        return []
    with dbapi_tx(alias).sql_connection() as sql:
        found = schema_version(sql)
    latest = latest_version()
    if found >= latest:
        return []
    state = "has no txtasks tables" if found == 0 else f"is at version {found} of {latest}"
    return [
        checks.Error(
            f"database {alias!r} {state}; {MIGRATE_HINT}", hint=MIGRATE_HINT, id="txtasks.E002"
        )
    ]


def register() -> None:
    checks.register(check_app, "txtasks")
    checks.register(check_schema, checks.Tags.database)
