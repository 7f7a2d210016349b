"""How long the dashboard takes to render each page with a million live tasks.

For each database given, the txtasks tables are dropped and made again, `--live` live tasks
and `--archived` finished ones are loaded (`tests/web/bulk.py`: 20 queues, some scheduled,
retrying, processing, keyed), and each page is rendered `--runs` times in-process (no
network); the report gives the median seconds per page.

    python -m tests.benchmarks.dashboard --postgres-url postgresql://... \\
        --mysql-url mysql://... --sqlite /tmp/dashboard.sqlite3 --runs 3

Not collected by pytest: run it by hand, on databases reserved for it (their txtasks tables
are dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from tests.conftest import reset_schema
from tests.web import bulk
from tests.web.conftest import client_for
from txtasks import App
from txtasks.clock import utcnow
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


async def measure(url: str, live: int, archived: int, runs: int) -> dict[str, float]:
    reset_schema(url)
    app = App(database_url=url)
    try:
        dialect = bulk.dialect_of(app.driver)
        async with app.driver.begin() as conn:  # type: ignore[attr-defined]
            await bulk.load(conn, dialect, live, archived, utcnow())
        async with app.driver.connect() as conn:  # type: ignore[attr-defined]
            if dialect == "postgresql":
                await conn.execution_options(isolation_level="AUTOCOMMIT")
            await bulk.analyze(conn, dialect)
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
        return found
    finally:
        await app.aclose()


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres-url")
    parser.add_argument("--mysql-url")
    parser.add_argument("--sqlite", metavar="FILE", help="also SQLite, in this file (replaced)")
    parser.add_argument("--live", type=int, default=1_000_000)
    parser.add_argument("--archived", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    results = {}
    sqlite = f"sqlite:///{args.sqlite}" if args.sqlite else None
    for name, url in (
        ("PostgreSQL", args.postgres_url),
        ("MariaDB", args.mysql_url),
        ("SQLite", sqlite),
    ):
        if url:
            results[name] = asyncio.run(measure(url, args.live, args.archived, args.runs))
    names = list(results)
    print(f"| page ({args.live:,} live, {args.archived:,} finished) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for page, _, _ in PAGES:
        cells = " | ".join(f"{results[n][page]:.3f} s" for n in names)
        print(f"| {page} | {cells} |")


if __name__ == "__main__":
    main()
