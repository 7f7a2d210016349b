"""Which database and broker a command uses: its flag, then the app's own setting, then the
environment; one line says so when the app and the environment disagree."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from txtasks.cli.main import main

APP_CODE = """
from txtasks import App

app = App("precedence", database_url={url!r})


@app.task(name="record")
def record(payload):
    pass
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable app whose code names one SQLite file; both files migrated."""
    in_code = tmp_path / "code.sqlite3"
    (tmp_path / "precedence_app.py").write_text(APP_CODE.format(url=f"sqlite:///{in_code}"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for path in (in_code, tmp_path / "env.sqlite3", tmp_path / "flag.sqlite3"):
        result = CliRunner().invoke(main, ["migrate", "--database-url", f"sqlite:///{path}"])
        assert result.exit_code == 0, result.output
    yield "precedence_app:app", tmp_path
    sys.modules.pop("precedence_app", None)


def tasks_in(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM txtasks_tasks").fetchone()[0])


def test_the_app_database_beats_the_environment_and_says_so(
    app_module: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec, where = app_module
    monkeypatch.setenv("TXTASKS_DATABASE_URL", f"sqlite:///{where / 'env.sqlite3'}")
    result = CliRunner().invoke(main, ["enqueue", spec, "record"])
    assert result.exit_code == 0, result.output
    assert (tasks_in(where / "code.sqlite3"), tasks_in(where / "env.sqlite3")) == (1, 0)
    told = [r.getMessage() for r in caplog.records if "given in code is used" in r.getMessage()]
    assert len(told) == 1 and "TXTASKS_DATABASE_URL=" in told[0], told
    flag = f"sqlite:///{where / 'flag.sqlite3'}"
    result = CliRunner().invoke(main, ["enqueue", spec, "record", "--database-url", flag])
    assert result.exit_code == 0, result.output
    assert tasks_in(where / "flag.sqlite3") == 1  # the flag beats both
