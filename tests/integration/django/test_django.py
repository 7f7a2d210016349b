"""txtasks.contrib.django: enqueue in `transaction.atomic()` on Django's own connection (each
backend), wake-ups by `transaction.on_commit`, the management commands and the system checks."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import MetaData

from tests.integration.conformance import table_rows
from tests.integration.django import tasks as project
from txtasks.schema.tables import tasks


def manage(*argv: str) -> None:
    """`python manage.py ARGV...`, in this process."""
    from django.core.management import ManagementUtility

    ManagementUtility(["manage.py", *argv]).execute()


def ids(alias: str) -> list[int]:
    from txtasks.contrib.django import database_url

    return [row.id for row in table_rows(database_url(alias), tasks)]


def test_enqueued_in_atomic_commits_with_it_and_wakes_after(alias: str) -> None:
    from django.db import transaction

    from txtasks.contrib.django import enqueue, enqueue_many, get_app

    app = get_app()
    with transaction.atomic(using=alias):
        first = enqueue("send", {"n": 1})
        more = enqueue_many([app.new_task("send", {"n": n}) for n in (2, 3)])
        assert project.recording.calls == []  # not before the commit
        if alias != "default":  # (SQLite: a second writer would wait for this one)
            assert ids(alias) == []  # another connection sees nothing yet
    assert ids(alias) == [first, *more]
    assert project.recording.calls == [("emails", [first]), ("emails", more)]


def test_a_rolled_back_atomic_leaves_no_task_and_no_wake_up(alias: str) -> None:
    from django.db import transaction

    from txtasks.contrib.django import enqueue

    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        enqueue("send", {"n": 1})
        raise RuntimeError("the view failed")
    assert ids(alias) == []
    assert project.recording.calls == []


def test_a_rolled_back_savepoint_drops_its_tasks_and_wake_ups(alias: str) -> None:
    from django.db import transaction

    from txtasks.contrib.django import enqueue

    with transaction.atomic(using=alias):
        kept = enqueue("send", {"n": 1})
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            enqueue("send", {"n": 2})
            raise RuntimeError("the inner block failed")
    assert ids(alias) == [kept]
    assert project.recording.calls == [("emails", [kept])]


def test_the_worker_command_runs_the_tasks(alias: str) -> None:
    from django.db import transaction

    from txtasks.contrib.django import enqueue

    with transaction.atomic(using=alias):
        enqueue("send", {"n": 1})
    manage("txtasks_worker", "--burst", "--burst-horizon", "0")
    assert project.sent == [{"n": 1}]
    manage("txtasks_cleaner", "--once")


def test_the_schema_check_says_to_migrate_and_the_command_migrates(alias: str) -> None:
    from django.core import checks

    from txtasks.contrib.django import database_url
    from txtasks.driver.urls import url_sync
    from txtasks.engines import create_engine

    assert checks.run_checks(databases=[alias]) == []
    engine = create_engine(url_sync(database_url(alias)))
    with engine.begin() as conn:
        existing = MetaData()
        existing.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
        existing.drop_all(conn)
    engine.dispose()
    [error] = checks.run_checks(databases=[alias])
    assert error.id == "txtasks.E002"
    assert f"database {alias!r} has no txtasks tables" in error.msg
    assert "run `python manage.py txtasks_migrate`" in error.msg
    manage("txtasks_migrate")
    assert checks.run_checks(databases=[alias]) == []


def test_a_missing_app_setting_says_what_to_add(alias: str, settings_override: Any) -> None:
    from django.core import checks

    settings_override(TXTASKS_APP=None)
    [error] = [e for e in checks.run_checks() if e.id.startswith("txtasks")]
    assert error.msg == (
        'TXTASKS_APP: not set; add TXTASKS_APP = "yourmodule:app" to the Django settings'
    )


@pytest.fixture
def settings_override() -> Any:
    from django.conf import settings

    saved: dict[str, Any] = {}

    def override(**values: Any) -> None:
        for name, value in values.items():
            saved[name] = getattr(settings, name)
            setattr(settings, name, value)

    yield override
    for name, value in saved.items():
        setattr(settings, name, value)


def test_a_command_without_the_app_setting_says_what_to_add(
    alias: str, settings_override: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    settings_override(TXTASKS_APP=None)
    with pytest.raises(SystemExit) as exited:
        manage("txtasks_worker", "--burst")
    assert exited.value.code == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith('TXTASKS_APP: not set; add TXTASKS_APP = "yourmodule:app" to the Django settings')
    )


def test_an_unknown_option_is_one_line(alias: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        manage("txtasks_cleaner", "--no-such-option")
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("CommandError: No such option") and "--no-such-option" in err
    assert len(err.splitlines()) == 1
