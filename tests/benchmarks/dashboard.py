"""How long the dashboard takes to render each page with a million live tasks.

For each database given, the txtasks tables are dropped and made again, `--live` live tasks
and `--archived` finished ones are loaded (`tests/web/bulk.py`: 20 queues, some scheduled,
retrying, processing, keyed), and each page is rendered `--runs` times in-process (no
network); the report gives the median seconds per page. `--plans FILE` also writes the plan
of every statement the pages ran on the task tables (EXPLAIN ANALYZE on PostgreSQL and
MariaDB, EXPLAIN QUERY PLAN on SQLite) to FILE; `--reuse` keeps the tables when they already
hold the rows asked for (loading ten million finished tasks takes minutes).

    python -m tests.benchmarks.dashboard --postgres-url postgresql://... \\
        --mysql-url mysql://... --sqlite /tmp/dashboard.sqlite3 --runs 3
    python -m tests.benchmarks.dashboard --postgres-url postgresql://... \\
        --live 1000000 --archived 10000000 --runs 3 --plans plans.txt

Not collected by pytest: run it by hand, on databases reserved for it (their txtasks tables
are dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from sqlalchemy import create_engine, event, func, select

from tests.conftest import reset_schema
from tests.web import bulk
from tests.web.conftest import client_for
from txtasks import App
from txtasks.clock import utcnow
from txtasks.driver.urls import url_sync
from txtasks.schema.migrate import migrate
from txtasks.schema.tables import archive, tasks
from txtasks.web import create_app

PAGES = [
    ("queues", "/", {}),
    ("tasks", "/tasks", {}),
    ("tasks of a queue", "/tasks", {"queue": "q3"}),
    ("tasks of a key", "/tasks", {"queue": "q3", "key": "k3"}),
    ("dead letters", "/dead", {}),
    ("workers", "/workers", {}),
    ("a task", "/tasks/1000", {}),
]


TASK_TABLES = ("txtasks_tasks", "txtasks_archive")


async def measure(
    url: str, live: int, archived: int, runs: int, *, reuse: bool = False, plans: Any = None
) -> dict[str, float]:
    """Median seconds per page; the plans of their statements written to `plans` (a file)."""
    if reuse and await _loaded(url, live, archived):
        engine = create_engine(url_sync(url))  # a newer schema's migrations, if any
        with engine.begin() as conn:
            migrate(conn)
        engine.dispose()
    else:
        reset_schema(url)
        await _load(url, live, archived)
    app = App(database_url=url)
    try:
        found: dict[str, float] = {}
        async with client_for(create_app(app, refresh=0, page_size=50)) as http:
            for name, path, params in PAGES:
                times = []
                for _ in range(runs):
                    started = time.perf_counter()
                    page = await http.get(path, params=params)
                    times.append(time.perf_counter() - started)
                    assert page.status_code == 200, (path, page.text[:300])
                found[name] = statistics.median(times)
                if plans is not None:
                    await _explain(app, http, name, path, params, plans)
        return found
    finally:
        await app.aclose()


async def _loaded(url: str, live: int, archived: int) -> bool:
    """Whether the tables hold `live` and `archived` tasks (False when they are missing)."""
    app = App(database_url=url)
    try:
        async with app.driver.db.connect() as conn:  # type: ignore[attr-defined]
            counts = [
                (await conn.execute(select(func.count()).select_from(t))).scalar_one()
                for t in (tasks, archive)
            ]
        return counts == [live, archived]
    except Exception:  # no tables, or an older schema: load again
        return False
    finally:
        await app.aclose()


async def _load(url: str, live: int, archived: int) -> None:
    unbounded = f"{url}{'&' if '?' in url else '?'}command_timeout=0"  # it takes minutes
    app = App(database_url=unbounded)
    try:
        dialect = bulk.dialect_of(app.driver)
        started = time.perf_counter()
        async with app.driver.db.begin() as conn:  # type: ignore[attr-defined]
            await bulk.load(conn, dialect, live, archived, utcnow())
        async with app.driver.db.connect() as conn:  # type: ignore[attr-defined]
            if dialect == "postgresql":
                await conn.execution_options(isolation_level="AUTOCOMMIT")
            await bulk.analyze(conn, dialect)
        print(f"{dialect}: loaded in {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        await app.aclose()


async def _explain(app: App, http: Any, name: str, path: str, params: Any, out: Any) -> None:
    """Render page `name` once more, recording its statements, and write the plan of each."""
    driver: Any = app.driver
    dialect = bulk.dialect_of(driver)
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, bound: Any, *_: Any) -> None:
        if any(t in statement for t in TASK_TABLES):
            statements.append((statement, bound))

    event.listen(driver.db.engine.sync_engine, "before_cursor_execute", record)
    try:
        await http.get(path, params=params)
    finally:
        event.remove(driver.db.engine.sync_engine, "before_cursor_execute", record)
    explain = {
        "postgresql": "EXPLAIN (ANALYZE, BUFFERS)",
        "mysql": "ANALYZE",
        "sqlite": "EXPLAIN QUERY PLAN",
    }[dialect]
    print(f"## {dialect}: {name} ({path} {params or ''})\n", file=out)
    seen = set()
    async with driver.db.connect() as conn:
        for statement, bound in statements:
            if statement in seen:  # one per queue: the plan of the first is enough
                continue
            seen.add(statement)
            result = await conn.exec_driver_sql(f"{explain} {statement}", bound)
            lines = ["\t".join("" if v is None else str(v) for v in r) for r in result.all()]
            print(statement.strip(), f"\n-- {bound}", *lines, "", sep="\n", file=out)


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres-url")
    parser.add_argument("--mysql-url")
    parser.add_argument("--sqlite", metavar="FILE", help="also SQLite, in this file (replaced)")
    parser.add_argument("--live", type=int, default=1_000_000)
    parser.add_argument("--archived", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plans", metavar="FILE", help="write the plan of every statement here")
    parser.add_argument("--reuse", action="store_true", help="keep tables already loaded")
    args = parser.parse_args(argv)
    plans = open(args.plans, "w") if args.plans else None  # noqa: SIM115
    results = {}
    sqlite = f"sqlite:///{args.sqlite}" if args.sqlite else None
    for name, url in (
        ("PostgreSQL", args.postgres_url),
        ("MariaDB", args.mysql_url),
        ("SQLite", sqlite),
    ):
        if url:
            results[name] = asyncio.run(
                measure(url, args.live, args.archived, args.runs, reuse=args.reuse, plans=plans)
            )
    if plans is not None:
        plans.close()
    names = list(results)
    print(f"| page ({args.live:,} live, {args.archived:,} finished) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for page, _, _ in PAGES:
        cells = " | ".join(f"{results[n][page]:.3f} s" for n in names)
        print(f"| {page} | {cells} |")


if __name__ == "__main__":
    main()
