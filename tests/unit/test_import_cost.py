"""`import txtasks` loads what an application enqueueing tasks needs, and nothing else: no
database dialect, no ORM or asyncio extension of SQLAlchemy, no scheduler, metrics or tracing
library. Measured by the modules imported, not by time."""

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
