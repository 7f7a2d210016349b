"""`txtasks status` as an operator runs it: its JSON document on every database, tables that
fit the terminal's width (and are never cut when piped), and `--watch` refreshing until
Ctrl-C, on a pipe and on a terminal.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tests import pace
from tests.acceptance.apps import REPO, cli_env, command
from tests.conftest import reset_schema
from tests.tcp_proxy import TcpProxy
from tests.waiting import until, until_sync
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.types import NewTask, Outcome, OutcomeKind

pytestmark = pytest.mark.acceptance

#: A queue name longer than a terminal of 80 columns.
LONG = "reports." + "x" * 92 + ".end"
QUEUE_FIELDS = {
    "queue",
    "counts",
    "ready",
    "oldest_ready_age",
    "paused",
    "paused_at",
    "enqueued",
    "finished",
    "enqueued_per_second",
    "finished_per_second",
}
KEY_FIELDS = {"queue", "key", "waiting", "processing", "rate_limited", "rate_limited_until"}


DEFERRED_FIELDS = {"rows", "commits", "oldest_commit_age"}


def task(queue: str, key: str | None = None, run_in: float = -1.0) -> NewTask:
    now = utcnow()
    return NewTask(
        queue=queue,
        task_name="status.task",
        payload=b"null",
        content_type="application/json",
        priority=0,
        run_at=now + timedelta(seconds=run_in),
        max_attempts=3,
        created_at=now,
        partition_key=key,
    )


async def fill(url: str) -> None:
    """LONG: 2 ready and 1 delayed; keyed: 3 ready of two keys, paused; done: 1 completed
    and 1 dead."""
    driver = driver_for_url(url)
    try:
        await driver.tasks.task_insert_many([task(LONG), task(LONG), task(LONG, run_in=3600)])
        await driver.tasks.task_insert_many([task("keyed", "k1"), task("keyed", "k1")])
        await driver.tasks.task_insert_many([task("keyed", "k2"), task("done"), task("done")])
        now = utcnow()
        ok, dead = await driver.claims.task_claim_many(
            ["done"], 2, now=now, lease_until=now + timedelta(seconds=30), worker_id="w"
        )
        outcomes = [Outcome(ok.key, OutcomeKind.COMPLETE), Outcome(dead.key, OutcomeKind.DEAD)]
        await driver.claims.outcome_write_many(outcomes, now=utcnow())
        await driver.control.queue_pause("keyed", now=utcnow())
    finally:
        await driver.close()


def run_status(url: str, *args: str, columns: int | None) -> str:
    env = cli_env(url)
    env.pop("COLUMNS")
    if columns is not None:
        env["COLUMNS"] = str(columns)
    done = subprocess.run(
        command("status", *args),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=pace.seconds(60),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_json_document(database_url: str) -> None:
    await fill(database_url)

    document = json.loads(run_status(database_url, "--json", columns=None))

    assert set(document) == {
        "version", "at", "window_seconds", "queues", "keys", "deferred", "cleaners_alive"
    }  # fmt: skip
    assert document["cleaners_alive"] == 0  # none runs: the tables end with a line saying so
    assert document["deferred"] == {"rows": 0, "commits": 0, "oldest_commit_age": None}
    assert (document["version"], document["window_seconds"]) == (1, 60.0)
    assert document["at"].endswith("+00:00")
    queues = {q["queue"]: q for q in document["queues"]}
    assert list(queues) == ["done", "keyed", LONG]  # by name
    assert all(set(q) == QUEUE_FIELDS for q in queues.values())
    long, keyed, done = queues[LONG], queues["keyed"], queues["done"]
    assert (long["counts"], long["ready"], long["paused"]) == ({"pending": 3}, 2, False)
    assert long["oldest_ready_age"] >= 1.0
    assert (keyed["counts"], keyed["ready"], keyed["paused"]) == ({"pending": 3}, 3, True)
    assert keyed["paused_at"].endswith("+00:00")
    assert (done["counts"], done["ready"], done["oldest_ready_age"]) == (
        {"completed": 1, "dead": 1},
        0,
        None,
    )
    assert (done["enqueued"], done["finished"]) == (2, {"completed": 1, "dead": 1})
    assert (done["enqueued_per_second"], done["finished_per_second"]) == (2 / 60, 2 / 60)
    assert (long["enqueued"], long["finished"], long["finished_per_second"]) == (3, {}, 0.0)
    keys = document["keys"]
    assert all(set(k) == KEY_FIELDS for k in keys)
    assert [(k["queue"], k["key"], k["waiting"], k["processing"]) for k in keys] == [
        ("keyed", "k1", 2, 0),
        ("keyed", "k2", 1, 0),
    ]
    assert not any(k["rate_limited"] for k in keys)
    one_key = json.loads(run_status(database_url, "--json", "--keys", "1", columns=None))
    assert [k["key"] for k in one_key["keys"]] == ["k1"]


async def test_the_backlog_of_deferred_spark_writes(database_url: str) -> None:
    """Rows of a Spark write committed in deferred mode that no publisher took yet: counted in
    the JSON document and shown in a table of their own; not those an atomic commit left for
    the cleaner to delete."""
    from tests.integration.test_staging_conformance import TARGET, attempt, staged_rows
    from txtasks.spark.staging import staging_for

    driver = driver_for_url(database_url)
    staging = staging_for(driver)
    committed = utcnow() - timedelta(seconds=30)
    staging.open("atomic", committed)
    staging.stage("atomic", "atomic.a", [attempt([4, 5, 6, 7])])
    staging.commit("c-atomic", "atomic", {"atomic.a": 4}, TARGET, now=committed)
    assert staged_rows(staging, ended=True) == {"atomic.a": 4}  # not purged yet
    staging.open("w", committed)
    staging.stage("w", "w.a", [attempt([1, 2]), attempt([3])])
    staging.commit_deferred("c", "w", {"w.a": 3}, TARGET, now=committed)
    await driver.close()

    document = json.loads(run_status(database_url, "--json", columns=None))
    shown = run_status(database_url, columns=200)

    deferred = document["deferred"]
    assert (deferred["rows"], deferred["commits"]) == (3, 1)
    assert deferred["oldest_commit_age"] >= 30
    assert "deferred Spark writes to publish" in shown, shown


@pytest.fixture
def sqlite_url(tmp_path: Any) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'status.sqlite3'}"
    assert (
        subprocess.run(command("migrate"), env=cli_env(url), timeout=pace.seconds(60)).returncode
        == 0
    )
    yield url


def test_an_empty_database_shows_empty_tables(sqlite_url: str) -> None:
    for columns in (None, 200, 40):
        assert "txtasks status at" in run_status(sqlite_url, columns=columns)
    document = json.loads(run_status(sqlite_url, "--json", columns=None))
    assert (document["queues"], document["keys"]) == ([], [])


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


async def test_tables_use_a_wide_terminal(sqlite_url: str) -> None:
    await fill(sqlite_url)
    out = run_status(sqlite_url, columns=200)
    assert len([line for line in lines_of(out) if LONG in line]) == 1  # the name on one line
    assert "yes" in next(line for line in lines_of(out) if line.startswith("keyed "))  # paused
    for header in ("ready", "oldest ready", "pending", "completed", "dead", "in/min", "done/min"):
        assert header in out
    assert "busiest keys" in out and "k1" in out
    assert max(map(len, lines_of(out))) <= 200


async def test_piped_output_is_as_wide_as_the_tables_need(sqlite_url: str) -> None:
    await fill(sqlite_url)
    out = run_status(sqlite_url, columns=None)
    [row] = [line for line in lines_of(out) if LONG in line]
    assert len(row) > 80


@pytest.mark.parametrize("columns", [100, 40])
async def test_tables_fold_on_a_narrow_terminal(sqlite_url: str, columns: int) -> None:
    """At 100 columns the long name folds inside its column; at 40 the columns are split
    among several tables too. Nothing is cut: the name reads whole when its pieces are
    joined, and the last line (no cleaner is alive) wraps at the width."""
    await fill(sqlite_url)
    out = run_status(sqlite_url, columns=columns)
    lines = lines_of(out)
    assert max(map(len, lines)) <= columns
    assert "…" not in out
    # the name's pieces are the first cells of consecutive lines
    assert LONG in "".join(line.split()[0] for line in lines if line.strip())
    if columns == 40:  # the columns split among tables, each starting with the queue's name
        assert "(continued)" in out
        for header in ("ready", "pending", "completed", "dead", "done/min", "paused"):
            assert header in out
    assert "no cleaner is alive" in out


def watch(url: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    env = cli_env(url)
    return subprocess.Popen(
        command("status", "--watch", "0.2", *args),
        cwd=REPO,
        env=env,
        text=True,
        start_new_session=True,
        **popen,
    )


async def test_watch_json_refreshes_until_interrupted(sqlite_url: str) -> None:
    await fill(sqlite_url)
    proc = watch(sqlite_url, "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert {q["queue"]: q["ready"] for q in first["queues"]}[LONG] == 2
        driver = driver_for_url(sqlite_url)
        await driver.tasks.task_insert_many([task(LONG)])
        await driver.close()

        def seen_three() -> bool:  # a later refresh shows the new task
            return {q["queue"]: q["ready"] for q in json.loads(proc.stdout.readline())["queues"]}[
                LONG
            ] == 3  # type: ignore[union-attr]

        until_sync(seen_three, "a refresh showing the new task", timeout=30)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=pace.seconds(30))
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        proc.kill()
        proc.communicate()


def test_watch_on_a_terminal_redraws_in_place_until_ctrl_c(sqlite_url: str) -> None:
    main, child = pty.openpty()
    proc = watch(sqlite_url, stdin=child, stdout=child, stderr=child)
    os.close(child)
    seen = b""
    try:

        def drawn_twice() -> bool:
            nonlocal seen
            while select.select([main], [], [], 0.05)[0]:
                try:
                    seen += os.read(main, 65536)
                except OSError:  # EIO: the process closed the terminal (it exited)
                    raise AssertionError(f"exited: {seen.decode(errors='replace')}") from None
            return seen.count(b"txtasks status at") >= 2

        until_sync(drawn_twice, "two frames of the status table", timeout=30)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=pace.seconds(30)) == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(main)
    assert b"\x1b[" in seen  # cursor moves: the frame is redrawn, not printed again
    assert b"Traceback" not in seen


def test_the_documented_json_document_has_the_fields_status_prints() -> None:
    """docs/cli.md shows an example document and a table of its fields: both name exactly
    the fields `txtasks status --json` prints."""
    page = (REPO / "docs" / "cli.md").read_text()
    section = page[page.index("### `--json`") :]
    body = section.index("```json\n") + 8
    example = json.loads(section[body : section.index("\n```", body)])
    assert set(example) == {
        "version", "at", "window_seconds", "queues", "keys", "deferred", "cleaners_alive"
    }  # fmt: skip
    assert [set(q) for q in example["queues"]] == [QUEUE_FIELDS]
    assert [set(k) for k in example["keys"]] == [KEY_FIELDS]
    assert set(example["deferred"]) == DEFERRED_FIELDS
    table = section[section.index("| Field |") : section.index("\n\n", section.index("| Field |"))]
    described = set(re.findall(r"`(\w+)(?:\[\])?`", table)) - {"null"}
    fields = QUEUE_FIELDS | KEY_FIELDS | DEFERRED_FIELDS | set(example)
    assert described == fields - {"queue", "key"}


@pytest.mark.postgresql
async def test_watch_outlives_a_database_outage(postgres_url: str) -> None:
    """While the database does not answer, `--watch` says so once on stderr and keeps trying;
    when it answers again, it says so and the snapshots resume."""
    reset_schema(postgres_url)
    proxy = await TcpProxy.for_url(postgres_url)
    url = proxy.url_for(postgres_url)
    proc = await asyncio.create_subprocess_exec(
        *command("status", "--watch", "0.2", "--json"),
        cwd=REPO,
        env=cli_env(url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:

        async def line(stream: asyncio.StreamReader) -> str:
            return (await asyncio.wait_for(stream.readline(), pace.seconds(30))).decode()

        assert json.loads(await line(proc.stdout))["queues"] == []
        await proxy.refuse()
        assert "cannot connect" in await line(proc.stderr)
        await proxy.accept()
        assert "the database answers again" in await line(proc.stderr)
        await driver_insert(postgres_url, [task("after")])

        async def shows_the_new_task() -> bool:
            document = json.loads(await line(proc.stdout))
            return [q["queue"] for q in document["queues"]] == ["after"]

        await until(shows_the_new_task, "a snapshot after the outage", timeout=30)
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), pace.seconds(30)) == 0
        rest = (await proc.stderr.read()).decode()
        assert "Traceback" not in rest and "cannot connect" not in rest  # said once
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proxy.close()


async def driver_insert(url: str, rows: list[NewTask]) -> None:
    driver = driver_for_url(url)
    try:
        await driver.tasks.task_insert_many(rows)
    finally:
        await driver.close()
