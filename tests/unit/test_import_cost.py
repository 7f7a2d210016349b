"""`import txtasks` loads what an application enqueueing tasks needs, and nothing else: no
database dialect, no ORM or asyncio extension of SQLAlchemy, no scheduler, metrics or tracing
library; `txtasks --help` loads no SQLAlchemy at all. Measured by the modules imported, not by
time."""

from __future__ import annotations

import json
import subprocess
import sys

#: Module prefixes that `import txtasks` must not load; each is imported where it is used.
HEAVY = (
    "sqlalchemy.orm",
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.mysql",
    "sqlalchemy.dialects.sqlite",
    "txtasks.driver.postgresql",
    "txtasks.driver.mysql",
    "txtasks.driver.sqlite",
    "txtasks.driver.sql",
    "asyncpg",
    "aiomysql",
    "pymysql",
    "psycopg",
    "aiosqlite",
    "apscheduler",
    "prometheus_client",
    "opentelemetry",
    "aio_pika",
    "cleaner",
    "click",
)


def loaded_after(code: str) -> set[str]:
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(HEAVY))


def test_import_txtasks_loads_no_dialect_orm_scheduler_metrics_or_tracing() -> None:
    assert heavy(loaded_after("import txtasks")) == []


def test_a_driver_is_loaded_when_a_url_asks_for_it() -> None:
    code = "import txtasks.driver as d; d.driver_for_url('sqlite:///x.sqlite3')"
    modules = loaded_after(code)
    assert "txtasks.driver.sqlite" in modules
    assert "txtasks.driver.postgresql" not in modules and "asyncpg" not in modules


def test_the_library_cli_imports_the_cleaner_sidecar_only_to_run_or_list_it() -> None:
    assert not any(m.startswith("cleaner") for m in loaded_after("import txtasks.cli.main"))


#: What `txtasks --help` and each command's `--help` must not load: each command imports what it
#: runs when it runs (the worker's help reads its defaults from txtasks.worker, the cleaner's
#: help imports the cleaner package).
CLI_HEAVY = (
    "sqlalchemy",
    "rich",
    "prometheus_client",
    "apscheduler",
    "aio_pika",
    "opentelemetry",
    "txtasks.app",
    "txtasks.driver",
    "txtasks.worker",
    "txtasks.metrics",
    "txtasks.schema",
    "txtasks.cli.demo_run",
    "txtasks.cli.demo_app",
    "cleaner",
)


def loaded_by_help(*args: str) -> set[str]:
    """The modules loaded in a fresh interpreter by `txtasks ARGS... --help`."""
    code = (
        "from click.testing import CliRunner\n"
        "from txtasks.cli.main import main\n"
        f"result = CliRunner().invoke(main, [*{list(args)!r}, '--help'])\n"
        "assert result.exit_code == 0, result.output"
    )
    return loaded_after(code)


def cli_heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(CLI_HEAVY))


def test_the_cli_help_loads_no_sqlalchemy_rich_scheduler_metrics_worker_or_demo() -> None:
    assert cli_heavy(loaded_by_help()) == []


def test_the_help_of_a_command_loads_only_what_its_options_need() -> None:
    for command in (["migrate"], ["status"], ["dlq"], ["dlq", "list"], ["enqueue"], ["demo"]):
        assert cli_heavy(loaded_by_help(*command)) == [], command
    worker = cli_heavy(loaded_by_help("worker"))  # its defaults are WorkerConfig's
    assert "txtasks.worker" in worker
    assert not any(
        m.startswith(("rich", "prometheus_client", "aio_pika", "sqlalchemy.orm")) for m in worker
    )


def test_python_dash_m_txtasks_help_loads_no_sqlalchemy() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "txtasks", "--help"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "txtasks.cli.main" in imported
    assert cli_heavy(imported) == []


def test_the_help_the_cli_shows_without_importing_a_command_is_its_own() -> None:
    import click

    from txtasks.cli import common

    for name, lazy in common.Commands.lazy.items():
        command = common.Commands().get_command(click.Context(click.Group()), name)
        assert command is not None and command.help is not None
        first_paragraph = command.help.strip().split("\n\n")[0]
        assert " ".join(first_paragraph.split()) == lazy.help_text, name


def test_the_cleaner_help_loads_no_scheduler_or_metrics() -> None:
    cleaner = loaded_by_help("cleaner")
    assert "cleaner.cli" in cleaner
    assert not any(m.startswith(("apscheduler", "prometheus_client", "rich")) for m in cleaner)
