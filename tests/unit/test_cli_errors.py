"""Errors of the CLI are one line naming what was wrong: the extra to install, the port."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from txtasks.cli.main import main

APP = "tests.acceptance.apps:app"
PG = "postgresql://app:secret@127.0.0.1:1/appdb"
MY = "mysql://app:secret@127.0.0.1:1/appdb"


def one_line_error(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize(
    ("module", "args", "extra"),
    [
        ("asyncpg", ["status", "--database-url", PG], "postgres"),
        ("asyncpg", ["worker", APP, "--database-url", PG], "postgres"),
        ("psycopg", ["enqueue", APP, "acc.record", "--database-url", PG], "postgres"),
        ("aiomysql", ["dlq", "list", "--database-url", MY], "mysql"),
        ("pymysql", ["enqueue", APP, "acc.record", "--database-url", MY], "mysql"),
    ],
)
def test_a_missing_extra_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, module: str, args: list[str], extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    for name in [m for m in sys.modules if m.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    line = one_line_error(*args)
    assert line == f'Error: {module} is not installed: pip install "txtasks[{extra}]"'


def not_installed(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make `module` look uninstalled (and every module that imported it re-import)."""
    monkeypatch.setitem(sys.modules, module, None)
    for name in [m for m in sys.modules if m.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m.startswith("txtasks.web")]:
        monkeypatch.delitem(sys.modules, name)


#: Every command that reaches a database, with the arguments it needs to get there.
DATABASE_COMMANDS = [
    ["migrate"],
    ["worker", APP, "--burst"],
    ["cleaner", APP, "--once"],
    ["enqueue", APP, "acc.record"],
    ["status"],
    ["dlq", "list"],
    ["dlq", "requeue", "1"],
    ["dlq", "purge", "1", "--yes"],
    ["keys", "set", "k", "--concurrency", "1"],
    ["keys", "clear", "k"],
    ["keys", "list"],
    ["keys", "queue-rate", "q"],
    ["publish", APP, "orders.created"],
    ["subscribe", APP],
    ["unsubscribe", "orders.created", "billing"],
    ["topics"],
    ["cancel", "1"],
    ["pause", "q"],
    ["resume", "q"],
    ["inspect", "1"],
    ["tasks"],
]


@pytest.mark.parametrize("args", DATABASE_COMMANDS, ids=" ".join)
def test_every_command_names_the_extra_of_a_missing_driver(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    not_installed(monkeypatch, "asyncpg")
    not_installed(monkeypatch, "psycopg")
    line = one_line_error(*args, "--database-url", PG)
    assert line.endswith('is not installed: pip install "txtasks[postgres]"'), line


@pytest.mark.parametrize("module", ["jinja2", "starlette", "uvicorn"])
def test_the_dashboard_names_the_web_extra(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    not_installed(monkeypatch, module)
    line = one_line_error("dashboard", APP, "--database-url", "sqlite:///unused.sqlite3")
    assert line == f'Error: {module} is not installed: pip install "txtasks[web]"'


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("flag", ["--metrics-port", "--health-port"])
def test_a_port_in_use_names_the_port_and_the_flag(
    taken_port: int, flag: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert CliRunner().invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    line = one_line_error("worker", APP, "--burst", "--database-url", url, flag, str(taken_port))
    what = "metrics" if flag == "--metrics-port" else "health checks"
    assert line == (
        f"Error: {flag} {taken_port}: cannot serve {what} on 0.0.0.0:{taken_port}: "
        "Address already in use"
    )


@pytest.mark.parametrize(
    ("flag", "value", "setting"),
    [
        ("--lease", "nan", "lease"),
        ("--lease", "inf", "lease"),
        ("--poll-interval", "nan", "poll_interval"),
        ("--burst-horizon", "nan", "burst_horizon"),
        ("--shutdown-grace", "inf", "shutdown_grace"),
    ],
)
def test_nan_and_infinite_worker_settings_are_refused_at_start(
    flag: str, value: str, setting: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    line = one_line_error("worker", APP, "--burst", "--database-url", url, flag, value)
    assert line.startswith(f"Error: {setting} must be a finite number") and line.endswith(value)


@pytest.mark.parametrize("flag", ["--rollback", "--flaky", "--poison"])
def test_demo_shares_refuse_nan(flag: str) -> None:
    result = CliRunner().invoke(main, ["demo", flag, "nan"])
    assert result.exit_code == 2
    name = flag.removeprefix("--")
    assert f"Invalid value for '{flag}': {name} must be a finite number" in result.output


@pytest.mark.parametrize("module", ["asyncpg", "psycopg"])
async def test_the_python_api_names_the_extra_of_a_missing_driver(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    from txtasks import App, MissingExtraError, create_async_engine, create_engine

    not_installed(monkeypatch, module)
    app = App(database_url=PG)
    app.task(name="t")(lambda payload: None)
    expected = f'{module} is not installed: pip install "txtasks[postgres]"'
    with pytest.raises(MissingExtraError) as info:
        if module == "psycopg":
            await asyncio.to_thread(app.enqueue, "t", 1)
        else:
            await app.aenqueue("t", 1)
    assert str(info.value) == expected
    with pytest.raises(MissingExtraError, match="txtasks\\[postgres\\]"):
        (create_engine if module == "psycopg" else create_async_engine)(PG)
    await app.aclose()


def test_importing_the_dashboard_names_the_web_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from txtasks import MissingExtraError

    not_installed(monkeypatch, "jinja2")
    with pytest.raises(
        MissingExtraError, match=re.escape('jinja2 is not installed: pip install "txtasks[web]"')
    ):
        import txtasks.web  # noqa: F401


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["dlq", "list"],
        ["dlq", "requeue", "1"],
        ["keys", "list"],
        ["topics"],
        ["inspect", "1"],
        ["tasks"],
        ["cancel", "1"],
        ["pause", "q"],
        ["dashboard", APP],
        ["worker", APP, "--burst"],
        ["cleaner", APP, "--once"],
        ["enqueue", APP, "acc.record"],
        ["publish", APP, "orders.created"],
        ["subscribe", APP],
    ],
    ids=" ".join,
)
def test_a_mistyped_sqlite_path_is_refused_and_nothing_created(
    tmp_path: Path, args: list[str]
) -> None:
    typo = tmp_path / "shop.sqlit3"
    url = f"sqlite:///{typo}"
    line = one_line_error(*args, "--database-url", url)
    assert line == (
        f"Error: database_url: no SQLite database at {typo} ({url}); check the path, "
        f"or create it with: txtasks migrate --database-url {url}"
    )
    assert list(tmp_path.iterdir()) == []
