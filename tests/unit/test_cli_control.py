"""`txtasks cancel`, `pause`, `resume`, `inspect` and `tasks` on a SQLite file: what they print,
and a clear message naming what was wrong for bad input."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from txtasks import App
from txtasks.cli.main import main
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.testing import run_until_empty
from txtasks.types import Outcome, OutcomeKind, Progress


@pytest.fixture
def url(tmp_path: Path) -> str:
    database = f"sqlite:///{tmp_path / 'control.sqlite3'}"
    assert CliRunner().invoke(main, ["migrate", "--database-url", database]).exit_code == 0
    return database


def run(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, [*args, "--database-url", url])
    assert result.exit_code == code, result.output
    return result


def enqueue(url: str, n: int, queue: str = "reports") -> list[int]:
    app = App("cli-control", database_url=url)
    task = app.task(name="cli.report", queue=queue)(lambda payload: None)
    return [task.enqueue({"n": i}, headers={"trace": "t"}) for i in range(n)]


def test_cancel_by_id_says_what_happened_to_each(url: str) -> None:
    ids = enqueue(url, 2)
    out = run(url, "cancel", str(ids[0]))
    assert out.output == f"task {ids[0]}: cancelled (was pending); it will never start\n"
    again = run(url, "cancel", str(ids[0]), "424242", code=1)
    assert again.output.splitlines() == [
        f"task {ids[0]}: already finished (cancelled), nothing to cancel",
        "task 424242: not found",
    ]


def test_cancel_by_queue_counts_and_json(url: str) -> None:
    enqueue(url, 3)
    enqueue(url, 1, queue="mail")
    out = run(url, "cancel", "--queue", "reports", "--json")
    rows = json.loads(out.output)
    assert [r["result"] for r in rows] == ["cancelled"] * 3
    assert run(url, "cancel", "--queue", "reports").output == (
        "no live task matched: nothing cancelled\n"
    )
    assert "cancelled 1 waiting task(s)" in run(url, "cancel", "--task", "cli.report").output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel"], "give task ids, or --queue, --task or --key"),
        (["cancel", "1", "--queue", "q"], "give task ids, or --queue/--task/--key, not both"),
        (["cancel", "--queue", "no spaces"], "'no spaces' is not a valid queue name"),
        (["pause", "bad/name"], "'bad/name' is not a valid queue name"),
        (["tasks", "--state", "sleeping"], "'sleeping' is not one of"),
        (["inspect", "0"], "0 is not in the range x>=1"),
    ],
)
def test_bad_input_is_named(url: str, args: list[str], message: str) -> None:
    result = run(url, *args, code=2)
    assert message in result.output


def test_pause_resume_and_status(url: str) -> None:
    assert run(url, "pause", "reports").output == "queue reports: paused\n"
    assert "already paused since" in run(url, "pause", "reports").output
    [stats] = json.loads(run(url, "status", "--json").output)["queues"]
    assert stats["queue"] == "reports" and stats["paused"] and stats["paused_at"] is not None
    assert run(url, "resume", "reports").output == "queue reports: resumed\n"
    assert run(url, "resume", "reports").output == "queue reports: was not paused\n"
    assert json.loads(run(url, "status", "--json").output)["queues"] == []  # nothing to show


def test_inspect_shows_a_task_and_the_places_of_its_result_and_progress(url: str) -> None:
    [task_id] = enqueue(url, 1)
    text = run(url, "inspect", str(task_id)).output
    assert f"task {task_id}\nstate:        pending\nqueue:        reports\n" in text
    assert 'headers:      {"trace": "t"}' in text and "result:       -" in text
    data = json.loads(run(url, "inspect", str(task_id), "--json").output)
    assert (data["state"], data["payload"], data["result"], data["progress"]) == (
        "pending",
        {"n": 0},
        None,
        None,
    )
    missing = run(url, "inspect", "999", code=1)
    assert missing.output == "Error: task 999: not found (no live or archived task)\n"


def test_inspect_shows_the_progress_reported_and_the_result_kept(url: str) -> None:
    """A running task shows its handler's last progress report; a finished task that keeps
    its result shows the value."""
    [task_id] = enqueue(url, 1)

    async def start(driver: Any) -> Any:
        now = utcnow()
        [row] = await driver.claims.task_claim_many(
            ["reports"], 1, now=now, lease_until=now + timedelta(seconds=30), worker_id="w"
        )
        report = Progress(3, 4, "pages", row.attempt).to_json()
        extended = await driver.claims.lease_extend_many(
            [row.key], lease_until=now + timedelta(seconds=60), progress={row.key: report}
        )
        assert extended == 1
        await driver.close()
        return row.key

    async def finish(driver: Any, key: Any) -> None:
        done = Outcome(key, OutcomeKind.COMPLETE, result='{"pages": 4}')
        await driver.claims.outcome_write_many([done], now=utcnow())
        await driver.close()

    key = asyncio.run(start(driver_for_url(url)))
    running = json.loads(run(url, "inspect", str(task_id), "--json").output)
    assert running["progress"] == {
        "done": 3, "total": 4, "fraction": 0.75, "note": "pages", "attempt": 1
    }  # fmt: skip
    assert shown(run(url, "inspect", str(task_id)).output, "progress") == running["progress"]
    asyncio.run(finish(driver_for_url(url), key))
    finished = json.loads(run(url, "inspect", str(task_id), "--json").output)
    assert (finished["state"], finished["result"]) == ("completed", {"pages": 4})
    text = run(url, "inspect", str(task_id)).output
    assert shown(text, "result") == {"pages": 4}  # JSON, as payload and headers are
    assert shown(text, "payload") == {"n": 0} and shown(text, "headers") == {"trace": "t"}


def shown(text: str, label: str) -> Any:
    """The value `txtasks inspect` prints on the line of `label`, read as JSON."""
    [line] = [line for line in text.splitlines() if line.startswith(f"{label}:")]
    return json.loads(line.split(":", 1)[1])


def _read_config(payload: Any) -> None:
    raise KeyError("retries")


def test_inspect_shows_the_last_error_with_its_traceback(url: str) -> None:
    app = App("cli-control", database_url=url)

    @app.task(name="cli.fails", max_attempts=1)
    def fails(payload: Any) -> None:
        try:
            _read_config(payload)
        except KeyError as exc:
            raise ValueError("no retry setting") from exc

    task_id = fails.enqueue(None)

    async def work() -> None:
        await run_until_empty(app)
        await app.aclose()

    asyncio.run(work())
    text = run(url, "inspect", str(task_id)).output
    error = text.split("last error:")[1].splitlines()
    assert error[1] == "  ValueError: no retry setting"
    cause = error.index("  caused by: KeyError: 'retries'")
    # the worker's frames (it ran the handler in a thread), then the handler's own
    assert error[2].startswith("    at txtasks.worker.runner.")
    assert error[cause - 1].startswith(f"    at {__name__}.fails line ")
    assert error[-2].startswith(f"    at {__name__}._read_config line ")
    assert error[-1] == "  (attempt 1 of 1)"
    data = json.loads(run(url, "inspect", str(task_id), "--json").output)
    assert data["last_error"] == "\n".join(line[2:] for line in error[1:])


def test_tasks_lists_live_and_archived_tasks(url: str) -> None:
    ids = enqueue(url, 3)
    run(url, "cancel", str(ids[1]))
    live = json.loads(run(url, "tasks", "--json").output)
    assert [r["id"] for r in live] == [ids[2], ids[0]]
    both = json.loads(
        run(url, "tasks", "--state", "cancelled", "--state", "pending", "--json").output
    )
    assert [(r["id"], r["state"]) for r in both] == [
        (ids[2], "pending"),
        (ids[0], "pending"),
        (ids[1], "cancelled"),
    ]
    one = json.loads(run(url, "tasks", "--queue", "reports", "--limit", "1", "--json").output)
    assert [r["id"] for r in one] == [ids[2]]
    assert "tasks (0)" in run(url, "tasks", "--task", "other").output
