"""`txtasks demo`: enqueue thousands of tasks in transactions, run workers, check the guarantees.

This module holds the command alone: what the demo runs (rich, SQLAlchemy, the demo's app) is
imported from `txtasks.cli.demo_run` when it runs, not when `--help` is printed."""

from __future__ import annotations

import click

from txtasks.cli.common import Share, broker_url_option


@click.command()
@click.option("--database-url", help="Run on this database instead of a temporary SQLite file.")
@click.option("--tasks", "count", type=click.IntRange(min=1), default=3000, show_default=True)
@click.option(
    "--workers", type=click.IntRange(min=1), default=3, show_default=True, help="Worker processes."
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Tasks at once per worker.",
)
@click.option(
    "--rollback",
    type=Share(),
    default=0.1,
    show_default=True,
    help="Share of transactions rolled back.",
)
@click.option(
    "--flaky",
    type=Share(),
    default=0.05,
    show_default=True,
    help="Share of tasks failing once.",
)
@click.option(
    "--poison",
    type=Share(),
    default=0.01,
    show_default=True,
    help="Share of tasks always failing.",
)
@click.option("--seed", type=int, default=7, show_default=True)
@broker_url_option
def demo(
    database_url: str | None,
    count: int,
    workers: int,
    concurrency: int,
    rollback: float,
    flaky: float,
    poison: float,
    seed: int,
    broker_url: str | None,
) -> None:
    """Enqueue tasks in transactions, run workers, and check every guarantee from the database."""
    from txtasks.cli.demo_run import run

    run(database_url, count, workers, concurrency, rollback, flaky, poison, seed, broker_url)
