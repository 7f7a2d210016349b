"""The tables of `status`, `topics`, `tasks` and `dlq list`: readable at 80 columns, never cut
when piped."""

from __future__ import annotations

import io
import json
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from txtasks.cli.main import main
from txtasks.cli.status import STATES, Snapshot, console_for, snapshot_grids, snapshot_print
from txtasks.types import KeyStats, QueueRates, QueueStats

NOW = datetime(2030, 1, 1, 12, 0, 0)
KEYS = "busiest keys"
QUEUES = [
    "orders.created.billing",
    "orders.created.shipping",
    "mail",
    "reports",
    "analytics.events",
    "webhooks.partner-acme",
    "thumbnails",
    "search.index",
    "exports.csv",
    "notifications.push",
    "billing.invoices",
    "cleanup",
]


def busy_snapshot() -> Snapshot:
    """Twelve queues with tasks in every state, one paused, and busy keys."""
    queues = [
        QueueStats(
            name,
            counts={state: 1000 * (n + 1) + i for i, state in enumerate(STATES)},
            oldest_ready_age=3600.0 * n,
            paused_at=NOW if name == "mail" else None,
            ready=123 * n,
        )
        for n, name in enumerate(QUEUES)
    ]
    rates = {
        name: QueueRates(name, 60.0, enqueued=1234, finished={"completed": 999}) for name in QUEUES
    }
    keys = [KeyStats(QUEUES[n], f"customer-{n:06d}-eu-west", 12, 3, NOW) for n in range(10)]
    return Snapshot(NOW, queues, rates, keys, cleaners_alive=1)


def printed(snapshot: Snapshot, console: Console) -> list[str]:
    snapshot_print(snapshot, console)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_status_at_80_columns_is_tables_not_a_value_per_line() -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    lines = [line.rstrip() for line in printed(busy_snapshot(), console)]
    assert max(map(len, lines)) <= 80
    assert len(lines) < 80, "\n".join(lines)  # a value per line took ~250
    text = "\n".join(lines)
    tables = sum(line.startswith("queue ") for line in lines)
    assert tables == 4  # the queues' columns in three, the keys in one
    for name in QUEUES:  # each queue's name whole, on its row, in each table of queues
        assert sum(line.startswith(f"{name} ") for line in lines[: lines.index(KEYS)]) == 3
    for header in ("ready", "oldest ready", *STATES, "in/min", "done/min", "paused"):
        assert f" {header}" in text, header


def test_status_piped_is_one_table_with_every_value_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    snapshot = busy_snapshot()
    console = console_for(snapshot_grids(snapshot))
    assert not console.is_terminal
    console.file = io.StringIO()
    lines = [line.rstrip() for line in printed(snapshot, console)]
    assert len([line for line in lines if "status at" in line or "busiest keys" in line]) == 2
    assert not any("continued" in line for line in lines)
    assert len(lines) == 2 * 3 + len(QUEUES) + 10  # a line per queue and per key: no fold
    for n, name in enumerate(QUEUES):  # all of a queue's values on its line
        values = [str(1000 * (n + 1) + i) for i in range(len(STATES))]
        row = [name, str(123 * n), *values, "1234", "999"] + (["yes"] if name == "mail" else [])
        assert any(line.split()[:2] + line.split()[3:] == row for line in lines), name
    assert any(" customer-000000-eu-west " in line for line in lines)


def test_topics_piped_shows_every_name_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert CliRunner().invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    values = {
        "topic": "order.created.eu-west-1",
        "group_name": "billing-reconciliation",
        "task_name": "billing.reconcile_order_totals",
        "queue": "billing-reconciliation-eu",
    }
    with sqlite3.connect(tmp_path / "db.sqlite3") as conn:
        conn.execute(
            "INSERT INTO txtasks_subscriptions VALUES (?, ?, ?, ?, 0, 3, ?, ?)",
            [*values.values(), str(NOW), str(NOW)],
        )
    result = CliRunner().invoke(main, ["topics", "--database-url", url])
    assert result.exit_code == 0, result.output
    row = result.output.splitlines()[3].split()
    assert row[:4] == list(values.values()), result.output
    assert "…" not in result.output


def test_status_says_when_no_cleaner_is_alive(tmp_path: Path) -> None:
    quiet = Snapshot(NOW, [QueueStats("mail", {"pending": 1})], {}, [], cleaners_alive=0)
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    lines = [line.rstrip() for line in printed(quiet, console)]
    assert " ".join(lines[-3:]).endswith("start one: txtasks cleaner APP")
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    assert "no cleaner" not in "\n".join(printed(busy_snapshot(), console))
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert CliRunner().invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    result = CliRunner().invoke(main, ["status", "--json", "--database-url", url])
    assert json.loads(result.output)["cleaners_alive"] == 0
    result = CliRunner().invoke(main, ["status", "--database-url", url])
    assert "no cleaner is alive (no heartbeat row)" in result.output
