"""Errors of the CLI are one line naming what was wrong: the extra to install, the port."""

from __future__ import annotations

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
