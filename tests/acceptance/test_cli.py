"""The `txtasks` commands an operator types: migrate, status, dlq, enqueue, demo, and bad input.

Every command runs as `python -m txtasks ...` in a subprocess with TXTASKS_DATABASE_URL set (or
not), from the repository root, with a timeout so that a hang fails the test. Commands that do
not depend on each other run at the same time to keep the suite fast.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest
from sqlalchemy import Engine, inspect

from tests import pace
from tests.acceptance.apps import (
    APP_SPEC,
    POISON_ATTEMPTS,
    QUEUE,
    Live,
    Processes,
    archived_rows,
    cli,
    cli_many,
    create_app_tables,
    enqueue,
    live_rows,
    run_rows,
)
from tests.acceptance.apps import metadata as app_metadata
from txtasks.cli import demo_app
from txtasks.clock import utcnow
from txtasks.driver.urls import backend_name
from txtasks.schema.tables import archive
from txtasks.schema.tables import metadata as txtasks_metadata

pytestmark = pytest.mark.acceptance

Result = subprocess.CompletedProcess[str]
BURST = ("--burst", "--burst-horizon", "1", "--poll-interval", "0.05")
TABLES = set(txtasks_metadata.tables)


def ok(result: Result) -> str:
    """The stdout of a command that must succeed (its output in the failure message)."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def status_of(result: Result) -> dict[str, dict[str, Any]]:
    """`txtasks status --json` output, by queue."""
    return {q["queue"]: q for q in json.loads(ok(result))["queues"]}


def dead_of(result: Result) -> dict[int, dict[str, Any]]:
    """`txtasks dlq list --json` output, by task id."""
    return {row["id"]: row for row in json.loads(ok(result))}


def drop_schema(engine: Engine) -> None:
    """No txtasks tables at all (those of txtasks, of its demo and of the test app)."""
    with engine.begin() as conn:
        for metadata in (app_metadata, demo_app.metadata, txtasks_metadata):
            metadata.drop_all(conn)


def table_names(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {t for t in inspect(conn).get_table_names() if t.startswith("txtasks_")}


# -- migrate ------------------------------------------------------------------------------------


def test_migrate_creates_the_schema_once(database_url: str, db: Engine) -> None:
    drop_schema(db)
    assert table_names(db) == set()

    first = ok(cli("migrate", url=database_url))
    assert "applied" in first
    assert table_names(db) == TABLES

    second, status = cli_many([(["migrate"], database_url), (["status", "--json"], database_url)])
    assert "already" in ok(second)
    assert status_of(status) == {}


def test_concurrent_migrate_runs_apply_the_schema_once(database_url: str, db: Engine) -> None:
    drop_schema(db)

    results = cli_many([(["migrate"], database_url), (["migrate"], database_url)])

    outputs = sorted(ok(r) for r in results)
    assert ["applied" in out for out in outputs] == [True, False], outputs
    assert "already" in outputs[1]
    assert table_names(db) == TABLES


def test_migrate_sql_prints_the_schema_without_a_database() -> None:
    dialects = ["postgresql", "mysql", "sqlite"]

    results = cli_many([(["migrate", "--sql", "--dialect", d], None) for d in dialects])

    for dialect, result in zip(dialects, results, strict=True):
        out = ok(result)
        for table in sorted(TABLES):
            assert f"CREATE TABLE {table}" in out, dialect
        assert "INSERT INTO txtasks_migrations" in out, dialect


def test_migrate_sql_output_builds_a_working_schema(database_url: str, db: Engine) -> None:
    """What `migrate --sql` prints, run by hand (as Flyway would), is the real schema."""
    script = ok(cli("migrate", "--sql", "--dialect", backend_name(database_url), url=None))
    drop_schema(db)
    code = "\n".join(line for line in script.splitlines() if not line.startswith("--"))
    with db.begin() as conn:
        for statement in re.split(r";\s*\n", code):
            if statement.strip():
                conn.exec_driver_sql(statement)
    create_app_tables(db)

    migrate, enqueued = cli_many(
        [(["migrate"], database_url), (["enqueue", APP_SPEC, "acc.record", "[2]"], database_url)]
    )

    assert "already" in ok(migrate)
    task_id = int(ok(enqueued))
    assert live_rows(db) == {task_id: Live("pending", 0, None)}


# -- enqueue and status ---------------------------------------------------------------------------


def test_enqueue_status_and_run(database_url: str, db: Engine, procs: Processes) -> None:
    keyed = ["--queue", "other", "--dedup-key", "acc-k"]
    first, other, later = cli_many(
        [
            (["enqueue", APP_SPEC, "acc.record", '{"x": 1}'], database_url),
            (["enqueue", APP_SPEC, "acc.record", '"hi"', *keyed], database_url),
            (["enqueue", APP_SPEC, "acc.record", "--delay", "3600"], database_url),
        ]
    )
    first_id, other_id, later_id = (int(ok(r)) for r in (first, other, later))

    again, status, table = cli_many(
        [
            (["enqueue", APP_SPEC, "acc.record", '"hi"', "--dedup-key", "acc-k"], database_url),
            (["status", "--json"], database_url),
            (["status"], database_url),
        ]
    )
    assert int(ok(again)) == other_id, "a live dedup key gives the existing task"
    before = status_of(status)
    assert before[QUEUE]["counts"] == {"pending": 2}
    assert before["other"]["counts"] == {"pending": 1}
    assert before[QUEUE]["oldest_ready_age"] >= 0
    assert "txtasks status" in ok(table)
    assert "other" in table.stdout

    worker = procs.start("worker", APP_SPEC, "-q", QUEUE, "-q", "other", *BURST, url=database_url)
    assert worker.wait(timeout=pace.seconds(30)) == 0, worker.stderr

    effects = {r.task_id: json.loads(r.payload) for r in run_rows(db)}
    assert effects == {first_id: {"x": 1}, other_id: "hi"}
    assert live_rows(db) == {later_id: Live("pending", 0, None)}
    after = status_of(cli("status", "--json", url=database_url))
    assert after[QUEUE]["counts"] == {"pending": 1, "completed": 1}
    assert after[QUEUE]["oldest_ready_age"] is None  # the one left is not due for an hour
    assert after["other"]["counts"] == {"completed": 1}


# -- topics -------------------------------------------------------------------------------------


def topics_of(result: Result) -> dict[str, dict[str, Any]]:
    """`txtasks topics --json` output, by topic."""
    return {t["topic"]: t for t in json.loads(ok(result))}


def test_subscribe_publish_topics_run_unsubscribe(
    database_url: str, db: Engine, procs: Processes
) -> None:
    stored = ok(cli("subscribe", APP_SPEC, url=database_url)).splitlines()
    assert [line.split("\t")[:2] for line in stored] == [
        ["acc.order", "acc-a"], ["acc.order", "acc-b"],
    ]  # fmt: skip
    published, dropped, table = cli_many(
        [
            (["publish", APP_SPEC, "acc.order", '{"n": 1}', "--key", "c1"], database_url),
            (["publish", APP_SPEC, "nobody.listens", "{}"], database_url),
            (["topics"], database_url),
        ]
    )
    ids = [int(i) for i in ok(published).split()]
    assert len(ids) == 2
    assert ok(dropped).strip() == "dropped: topic nobody.listens has no subscriber"
    assert "acc-a" in ok(table) and "acc.order_b" in table.stdout
    listed = topics_of(cli("topics", "--json", url=database_url))
    assert [(g["group"], g["queue"], g["tasks"]) for g in listed["acc.order"]["groups"]] == [
        ("acc-a", QUEUE, {"pending": 1}), ("acc-b", "other", {"pending": 1}),
    ]  # fmt: skip
    assert (listed["nobody.listens"]["groups"], listed["nobody.listens"]["dropped"]) == ([], 1)

    worker = procs.start("worker", APP_SPEC, "-q", QUEUE, "-q", "other", *BURST, url=database_url)
    assert worker.wait(timeout=pace.seconds(30)) == 0, worker.stderr
    ran = sorted((r.task_name, r.task_id, json.loads(r.payload)) for r in run_rows(db))
    assert ran == [("acc.order_a", ids[0], {"n": 1}), ("acc.order_b", ids[1], {"n": 1})]

    gone = ok(cli("unsubscribe", "acc.order", "acc-b", url=database_url))
    assert gone.strip() == "acc.order: 1 subscription(s) deleted"
    [only] = ok(cli("publish", APP_SPEC, "acc.order", url=database_url)).split()
    assert live_rows(db) == {int(only): Live("pending", 0, None)}


# -- dead letters -------------------------------------------------------------------------------


def test_dlq_list_requeue_purge_round_trip(database_url: str, db: Engine, procs: Processes) -> None:
    poison = enqueue(db, "acc.poison", [{"n": 1}, {"n": 2}])
    (good,) = enqueue(db, "acc.record", [{"n": 3}])
    worker = procs.start("worker", APP_SPEC, *BURST, url=database_url)
    assert worker.wait(timeout=pace.seconds(30)) == 0, worker.stderr

    listed, table = cli_many(
        [(["dlq", "list", "--json"], database_url), (["dlq", "list"], database_url)]
    )
    dead = dead_of(listed)
    assert set(dead) == set(poison)
    for row in dead.values():
        assert (row["task_name"], row["state"]) == ("acc.poison", "dead")
        assert row["attempt"] == row["max_attempts"] == POISON_ATTEMPTS
        assert "RuntimeError: poison task" in row["last_error"]
    assert "dead letters (2)" in ok(table)
    assert archived_rows(db)[good].state == "completed"

    requeued, kept = poison
    out = ok(cli("dlq", "requeue", str(requeued), url=database_url))
    assert out.strip() == f"requeued 1 task(s): {requeued}"
    # Back to pending with a fresh attempt budget; the other dead letter stays.
    assert {i: (r.state, r.attempt) for i, r in live_rows(db).items()} == {requeued: ("pending", 0)}
    assert {i for i, f in archived_rows(db).items() if f.state == "dead"} == {kept}

    purged = ok(cli("dlq", "purge", "--all", "--yes", url=database_url))
    assert purged.strip() == "purged 1 task(s)"

    listed, status = cli_many(
        [(["dlq", "list", "--json"], database_url), (["status", "--json"], database_url)]
    )
    assert dead_of(listed) == {}
    assert status_of(status)[QUEUE]["counts"] == {"pending": 1, "completed": 1}
    assert set(archived_rows(db)) == {good}


def insert_dead_letter(db: Engine, task_id: int) -> None:
    """A dead letter as a worker leaves it: payload, error, and the worker that ran it last."""
    now = utcnow()
    with db.begin() as conn:
        conn.execute(
            archive.insert().values(
                id=task_id,
                queue=QUEUE,
                task_name="acc.poison",
                payload='{"n":1,"name":"é"}'.encode(),
                content_type="application/json",
                state="dead",
                priority=0,
                run_at=now,
                attempt=2,
                max_attempts=2,
                created_at=now,
                started_at=now,
                finished_at=now,
                worker_id="host:1:abcdef",
                last_error="boom",
            )
        )


def test_dlq_list_json_gives_the_payload_as_json(database_url: str, db: Engine) -> None:
    """`--json` is for programs: the payload must be the task's JSON value, not a Python repr."""
    insert_dead_letter(db, 7)

    row = dead_of(cli("dlq", "list", "--json", url=database_url))[7]

    assert (row["last_error"], row["worker_id"]) == ("boom", "host:1:abcdef")
    assert row["payload"] == {"n": 1, "name": "é"}


def test_dlq_requeue_gives_a_pending_task_no_worker_holds(database_url: str, db: Engine) -> None:
    """Like a retried or handed-back task, a requeued one belongs to no worker."""
    insert_dead_letter(db, 7)

    assert ok(cli("dlq", "requeue", "--all", url=database_url)).strip() == "requeued 1 task(s): 7"

    assert live_rows(db) == {7: Live("pending", 0, None)}


# -- bad input ----------------------------------------------------------------------------------

EMPTY_SQLITE = "an empty SQLite file"
UNREACHABLE = "postgresql://app:app@127.0.0.1:1/appdb"  # nothing listens on port 1

#: name -> (arguments, TXTASKS_DATABASE_URL, what the error message must name)
BAD_INPUT: dict[str, tuple[list[str], str | None, str]] = {
    "unknown module": (["worker", "nosuchmodule:app"], EMPTY_SQLITE, "nosuchmodule"),
    "not an app": (["worker", "tests.acceptance.apps:metadata"], EMPTY_SQLITE, "not a txtasks.App"),
    "bad url": (["worker", APP_SPEC, "--database-url", "foo://x"], EMPTY_SQLITE, "database_url"),
    "zero concurrency": (["worker", APP_SPEC, "--concurrency", "0"], EMPTY_SQLITE, "--concurrency"),
    "bad queue name": (["worker", APP_SPEC, "-q", "no spaces"], EMPTY_SQLITE, "queue"),
    "payload not json": (["enqueue", APP_SPEC, "acc.record", "not json"], EMPTY_SQLITE, "PAYLOAD"),
    "unknown task": (["enqueue", APP_SPEC, "acc.nope", "{}"], EMPTY_SQLITE, "acc.nope"),
    "sql without dialect": (["migrate", "--sql"], None, "--dialect"),
    "unmigrated status": (["status"], EMPTY_SQLITE, "txtasks migrate"),
    "unmigrated worker": (["worker", APP_SPEC, "--burst"], EMPTY_SQLITE, "txtasks migrate"),
    "purge declined": (["dlq", "purge", "--all"], EMPTY_SQLITE, "Aborted"),  # stdin is empty
    "nothing to requeue": (["dlq", "requeue"], EMPTY_SQLITE, "--all"),
    "no url": (["status"], None, "TXTASKS_DATABASE_URL"),
    "unreachable database": (["status"], UNREACHABLE, "127.0.0.1"),
    "nan lease": (["worker", APP_SPEC, "--lease", "nan"], EMPTY_SQLITE, "lease must be a finite"),
    "infinite lease": (["worker", APP_SPEC, "--lease", "inf"], EMPTY_SQLITE, "got inf"),
    "nan burst horizon": (
        ["worker", APP_SPEC, "--burst", "--burst-horizon", "nan"],
        EMPTY_SQLITE,
        "burst_horizon must be a finite number",
    ),
    "deep payload": (
        ["enqueue", APP_SPEC, "acc.record", "[" * 20_000 + "]" * 20_000],
        EMPTY_SQLITE,
        "PAYLOAD",
    ),
    "unmigrated enqueue": (
        ["enqueue", APP_SPEC, "acc.record", "{}"],
        EMPTY_SQLITE,
        "Error: table txtasks_tasks missing: run txtasks migrate",
    ),
    "invalid topic": (
        ["publish", APP_SPEC, "no spaces please", "{}"],
        None,
        "'no spaces please' is not a valid topic name",
    ),
    "unreachable enqueue": (
        ["enqueue", APP_SPEC, "acc.record", "{}"],
        UNREACHABLE,
        "Error: cannot connect to postgresql://app:***@127.0.0.1:1/appdb: ",
    ),
}
#: Cases whose whole output is that one line (the others may add a usage hint).
ONE_LINE = {
    "nan lease",
    "infinite lease",
    "nan burst horizon",
    "unmigrated enqueue",
    "unreachable enqueue",
    "unmigrated status",
    "unreachable database",
}


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every bad command, run at once (each on its own empty SQLite file if it needs one)."""
    directory = tmp_path_factory.mktemp("bad-input")
    for n, (_args, url, _message) in enumerate(BAD_INPUT.values()):
        if url == EMPTY_SQLITE:  # a file with no table (a missing one is refused before)
            (directory / f"{n}.sqlite3").touch()
    commands = [
        (args, f"sqlite:///{directory / f'{n}.sqlite3'}" if url == EMPTY_SQLITE else url)
        for n, (args, url, _) in enumerate(BAD_INPUT.values())
    ]
    return dict(zip(BAD_INPUT, cli_many(commands), strict=True))


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_a_clear_error(bad_input_results: dict[str, Result], case: str) -> None:
    result = bad_input_results[case]
    message = BAD_INPUT[case][2]

    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr, f"a crash, not an error message:\n{result.stderr}"
    if case in ONE_LINE:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- demo ---------------------------------------------------------------------------------------

DEMO_CHECKS = 7  # six guarantees checked from the database, and the workers' exit codes


def test_demo_passes_every_check(database_url: str, db: Engine) -> None:
    """On SQLite it needs no server; on a server it touches only its own tables and queue."""
    if backend_name(database_url) == "sqlite":
        args = ["demo", "--tasks", "300", "--workers", "2"]
    else:
        args = ["demo", "--database-url", database_url, "--tasks", "300"]
    (mine,) = enqueue(db, "acc.record", [{"n": 1}])

    out = ok(cli(*args, url=None, timeout=120))

    assert out.count("PASS") == DEMO_CHECKS, out
    assert "FAIL" not in out
    assert live_rows(db) == {mine: Live("pending", 0, None)}
    assert table_names(db) >= TABLES | {"txtasks_acc_runs"}
