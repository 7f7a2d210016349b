"""The documentation's code is real: every snippet is a file in docs/snippets that runs.

- Each ```python block in docs/*.md follows a `<!-- snippet: snippets/NAME.py -->` comment and
  equals that file, and each file in docs/snippets is shown by some page.
- Each `txtasks ...` command line shown in a console block parses against the real CLI.
- Each snippet runs in a subprocess (cwd: a temporary directory) against SQLite; the enqueue
  snippets (and the connections one) also run against PostgreSQL and MariaDB, on tables
  dropped before each run, and some of them through PgBouncer in transaction pooling mode.
- The quickstart runs as a user would: `txtasks migrate`, `python place_order.py`,
  `txtasks worker shop:app --burst`, `txtasks status --json`.
- The testing guide's snippets are pytest modules: they run under pytest.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from sqlalchemy import MetaData, create_engine

from tests import pace
from tests.conftest import reset_schema
from txtasks.cli.main import main as cli_main
from txtasks.driver.urls import url_sync

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
TIMEOUT = pace.seconds(120)

MARKER = re.compile(r"<!-- snippet: (snippets/[\w.-]+\.py) -->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)

#: The quickstart's files: a module and a script run by `test_quickstart`.
QUICKSTART = {"shop.py", "place_order.py"}
#: pytest modules, run by `test_testing_guide`.
PYTEST_MODULES = {"testing_unit.py", "testing_database.py"}
#: Run against every database, not only SQLite.
ON_SERVERS = sorted(
    p.name
    for p in [
        *SNIPPETS.glob("enqueue_*.py"),
        *SNIPPETS.glob("topics_*.py"),
        *SNIPPETS.glob("connections_*.py"),
    ]
)
#: Run through PgBouncer too (`?pooler=transaction`): each SQLAlchemy flavour, COPY, topics.
BEHIND_PGBOUNCER = [
    "connections_budget.py",
    "enqueue_async_connection.py",
    "enqueue_bulk.py",
    "enqueue_session.py",
    "topics_publish.py",
]
STANDALONE = sorted(
    p.name for p in SNIPPETS.glob("*.py") if p.name not in QUICKSTART | PYTEST_MODULES
)


# -- the Markdown shows the files --------------------------------------------------------------


def doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def fenced_blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, body, the text before the block) of every fenced block."""
    return [(m.group(1), m.group(2), text[: m.start()]) for m in FENCE.finditer(text)]


def python_blocks(page: Path) -> list[tuple[str | None, str]]:
    """(snippet path or None, body) of each ```python block of a page."""
    found = []
    for language, body, before in fenced_blocks(page.read_text()):
        if language != "python":
            continue
        last_line = before.rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(last_line.strip())
        found.append((marker.group(1) if marker else None, body))
    return found


def test_docs_exist() -> None:
    names = {p.name for p in doc_pages()}
    expected = {"index.md", "quickstart.md", "enqueue.md", "handlers.md"}
    expected |= {"lifecycle.md", "configuration.md", "testing.md"}
    assert expected <= names
    assert len(STANDALONE) >= 10


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.name)
def test_python_blocks_are_snippet_files(page: Path) -> None:
    for reference, body in python_blocks(page):
        assert reference is not None, f"{page.name}: a python block without a snippet marker"
        source = DOCS / reference
        assert source.is_file(), f"{page.name}: {reference} does not exist"
        assert body == source.read_text(), f"{page.name}: the block differs from {reference}"


def test_every_snippet_is_shown() -> None:
    shown = {ref for page in doc_pages() for ref, _ in python_blocks(page) if ref}
    files = {f"snippets/{p.name}" for p in SNIPPETS.glob("*.py")}
    assert files - shown == set(), "snippet files no page shows"
    assert shown - files == set()


# -- the commands shown exist ------------------------------------------------------------------


#: Environment variables that flags set as they are parsed (for every driver to read).
SET_BY_FLAGS = (
    "TXTASKS_DB_CONNECTIONS",
    "TXTASKS_DB_COMMAND_TIMEOUT",
    "TXTASKS_DB_CONNECT_TIMEOUT",
)


def shown_commands() -> list[str]:
    """The `txtasks ...` lines of the console blocks, without the prompt."""
    lines = []
    for page in doc_pages():
        for language, body, _ in fenced_blocks(page.read_text()):
            if language == "console":
                lines += [ln[2:] for ln in body.splitlines() if ln.startswith("$ txtasks")]
    return lines


def test_commands_are_shown() -> None:
    shown = {line.split()[1] for line in shown_commands()}
    assert {"demo", "migrate", "worker", "status", "dlq"} <= shown


@pytest.mark.parametrize("line", shown_commands())
def test_shown_command_parses(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The subcommand, its options and its arguments are accepted by the real CLI."""
    monkeypatch.delenv("TXTASKS_DATABASE_URL", raising=False)
    monkeypatch.delenv("TXTASKS_CONCURRENCY", raising=False)
    for variable in SET_BY_FLAGS:  # what a flag of the line stores there is undone after
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    args = shlex.split(line)[1:]
    command: click.Command = cli_main
    path = ["txtasks"]
    while isinstance(command, click.Group):
        name = args.pop(0)
        found = command.get_command(click.Context(command), name)  # lazily imported ones too
        assert found is not None, f"{line!r}: no command {name!r}"
        command = found
        path.append(name)
    command.make_context(" ".join(path), args)  # raises on an unknown option or bad value


# -- the snippets run --------------------------------------------------------------------------


def run(args: list[str], cwd: Path, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command with TXTASKS_DATABASE_URL set; fail with its output if it fails."""
    environment = {**os.environ, "TXTASKS_DATABASE_URL": url, **env}
    environment.pop("TXTASKS_CONCURRENCY", None)
    if "TXTASKS_BROKER_URL" not in env:
        environment.pop("TXTASKS_BROKER_URL", None)
    result = subprocess.run(
        args,
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


def run_snippet(name: str, cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-W", "error", str(SNIPPETS / name)], cwd, url)


def snippet_tables(name: str) -> set[str]:
    """The tables a snippet creates for itself (Core tables and ORM models)."""
    source = (SNIPPETS / name).read_text()
    return set(re.findall(r'Table\(\s*"(\w+)"', source)) | set(
        re.findall(r'__tablename__ = "(\w+)"', source)
    )


def reset(url: str, tables: set[str]) -> None:
    """Drop the txtasks tables and the snippet's own tables (reset_schema re-migrates)."""
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            existing = MetaData()
            existing.reflect(conn, only=lambda table, _meta: table in tables)
            existing.drop_all(conn)
    finally:
        engine.dispose()
    reset_schema(url)


@pytest.mark.parametrize("name", STANDALONE)
def test_snippet_runs_on_sqlite(name: str, tmp_path: Path) -> None:
    run_snippet(name, tmp_path, f"sqlite:///{tmp_path / 'x.sqlite3'}")


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("postgres_url", id="postgresql", marks=pytest.mark.postgresql),
        pytest.param("mysql_url", id="mysql", marks=pytest.mark.mysql),
    ],
)
@pytest.mark.parametrize("name", ON_SERVERS)
def test_enqueue_snippet_runs_on_server(
    name: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue(backend))
    tables = snippet_tables(name)
    reset(url, tables)
    try:
        run_snippet(name, tmp_path, url)
    finally:
        reset(url, tables)


@pytest.mark.postgresql
@pytest.mark.parametrize("name", BEHIND_PGBOUNCER)
def test_snippet_runs_behind_pgbouncer(
    name: str, postgres_url: str, pgbouncer_url: str, tmp_path: Path
) -> None:
    tables = snippet_tables(name)
    reset(postgres_url, tables)  # straight to PostgreSQL: the snippet is what goes through
    try:
        run_snippet(name, tmp_path, pgbouncer_url)
    finally:
        reset(postgres_url, tables)


def test_enqueue_flavours_run_on_servers() -> None:
    flavours = {"connection", "session", "async_connection", "async_session"}
    assert {f"enqueue_{f}.py" for f in flavours} <= set(ON_SERVERS)


def test_quickstart(tmp_path: Path) -> None:
    """The quickstart, as a user types it, in a directory holding shop.py and place_order.py."""
    for name in QUICKSTART:
        shutil.copy(SNIPPETS / name, tmp_path / name)
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    txtasks = [sys.executable, "-m", "txtasks"]

    migrated = run([*txtasks, "migrate"], tmp_path, url)
    shown = re.search(r"^\$ txtasks migrate\n(.*)\n", (DOCS / "quickstart.md").read_text(), re.M)
    assert shown is not None and migrated.stdout.strip() == shown.group(1)  # as the page shows
    placed = run([sys.executable, "place_order.py"], tmp_path, url)
    assert placed.stdout.strip() == "placed order 1"
    worker = run([*txtasks, "worker", "shop:app", "--burst", "--burst-horizon", "0"], tmp_path, url)
    assert "order 1: confirmation sent to ada@example.com" in worker.stdout
    status = json.loads(run([*txtasks, "status", "--json"], tmp_path, url).stdout)
    [emails] = status["queues"]
    assert (emails["queue"], emails["counts"], emails["ready"]) == ("emails", {"completed": 1}, 0)
    assert (emails["enqueued"], emails["finished"]) == (1, {"completed": 1})


def test_testing_guide(tmp_path: Path) -> None:
    """The testing guide's modules pass under pytest, with warnings as errors."""
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\nfilterwarnings =\n    error\n"
    )
    modules = [str(SNIPPETS / name) for name in sorted(PYTEST_MODULES)]
    pytest_args = ["-q", "-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", "."]
    result = run(
        [sys.executable, "-m", "pytest", *pytest_args, *modules],
        tmp_path,
        f"sqlite:///{tmp_path / 'unused.sqlite3'}",
    )
    assert re.search(r"\b5 passed\b", result.stdout), result.stdout


@pytest.mark.rabbitmq
def test_wakeups_snippet_is_woken_by_rabbitmq(amqp_url: str, tmp_path: Path) -> None:
    """With a broker the example's worker (30 s poll) is started by the wake-up."""
    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    args = [sys.executable, "-W", "error", str(SNIPPETS / "wakeups_worker.py")]
    result = run(args, tmp_path, url, TXTASKS_BROKER_URL=amqp_url)
    assert result.stdout.strip() == "started by a wake-up"
