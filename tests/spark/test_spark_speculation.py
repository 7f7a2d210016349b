"""A write on a Spark standalone cluster where Spark speculates: exactly once all the same.

Spark starts a speculative copy of a slow task only on another host than the one running it,
so `local[N]` never does: these tests start a standalone cluster of two one-core workers on
two loopback addresses (`tests.spark.cluster`) and run the write in an application of its own
(`tests.spark.speculation_app`), started once for the module and ready (its executors up,
a first write done) before the first test begins. The last partition's first attempt waits until a second
attempt of it runs; both then wait until the test has looked at the database (the rows of the
partitions done staged, nothing claimable); then they race. Spark's own records (its status store)
must show a speculative attempt of that partition, and the database every row once (with the
option `dedup` too, whose commit inserts in key order). On SQLite too: the slow attempt holds
no transaction (hence not SQLite's one write lock) while it waits, as staging begins one per
batch of rows, once the batch is computed.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import pace
from tests.conftest import backends
from tests.spark.conftest import IN_CI
from tests.spark.speculation_app import PARTITIONS, ROWS
from tests.spark.test_spark_write import live_rows, staged_count, state_counts
from tests.waiting import until_sync

#: One pytest process runs them all (pytest-xdist `--dist loadgroup`): one cluster and one
#: application for the module, not one per process.
pytestmark = [
    pytest.mark.xdist_group("spark-cluster"),
    # each test may wait WRITE_TIMEOUT for the second attempt, then as long for the answer;
    # the cluster and the application start (minutes on a busy machine) under deadlines of
    # their own, in the first test's setup, which this limit leaves out
    pytest.mark.timeout(300, func_only=True),
]

#: Seconds a write gets (the application is running: its executors run Python).
WRITE_TIMEOUT = 90.0
#: Seconds the application gets to start: its JVM, then its executor on each worker.
START_TIMEOUT = 180.0
#: Seconds the application gets to stop once its stdin is closed.
STOP_TIMEOUT = pace.seconds(30.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("PySpark is not installed (pip install -e '.[dev]')")
        pytest.skip("PySpark is not installed")
    from tests.spark.cluster import missing, standalone_cluster

    lacking = missing()
    if lacking is not None:
        if IN_CI:
            pytest.fail(f"no Spark standalone cluster here: {lacking}")
        pytest.skip(f"no Spark standalone cluster here: {lacking}")
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as running:
        yield running


class Application:
    """`tests.spark.speculation_app` on the cluster: one write per request, answers read by a
    thread (so that waiting for one is bounded)."""

    def __init__(self, master_url: str, log: Path) -> None:
        self.log = log
        command = [sys.executable, "-m", "tests.spark.speculation_app", master_url]
        with log.open("wb") as err:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,  # its JVM in its process group
            )
        self.answers: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def wait_ready(self) -> None:
        """Wait (bounded) for the application's ready line: its executors run Python."""
        limit = pace.seconds(START_TIMEOUT)
        ready = self.next_line(time.monotonic() + limit, f"{limit:g}s to start")
        assert ready.get("ready") == 2, f"not two executors: {ready} ({self.log})"

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put("")  # the application ended

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the application ended ({self.process.returncode}): {self.log}")
        return True

    def write(self, database_url: str, markers: Path, **options: str) -> None:
        """Start a write (options of the txtasks source, besides url, task and payload)."""
        assert self.process.stdin is not None
        pairs = "".join(f" {name}={value}" for name, value in options.items())
        self.process.stdin.write(f"{database_url} {markers}{pairs}\n")
        self.process.stdin.flush()

    def answer(self, markers: Path) -> dict[str, Any]:
        """The answer to the write of `markers` (skipping those of earlier writes whose test
        failed before reading them)."""
        deadline = time.monotonic() + pace.seconds(WRITE_TIMEOUT)
        while True:
            answer = self.next_line(deadline, f"{pace.seconds(WRITE_TIMEOUT):g}s to answer")
            if answer["markers"] == str(markers):
                assert "error" not in answer, f"{answer['error']} ({self.log})"
                return answer

    def next_line(self, deadline: float, what: str) -> dict[str, Any]:
        """The application's next line of JSON, by `deadline` (of `time.monotonic`)."""
        try:
            line = self.answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"the application took more than {what}: {self.log}") from None
        assert line, f"the application ended: {self.log}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.reader.join(STOP_TIMEOUT)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture(scope="module")
def application(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Application]:
    running = Application(cluster.master_url, tmp_path_factory.mktemp("spark-app") / "app.log")
    try:
        running.wait_ready()
    except BaseException:
        running.stop()
        raise
    yield running
    running.stop()


@pytest.mark.parametrize("database_url", backends("postgresql", "mysql", "sqlite"), indirect=True)
@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
def test_a_speculative_attempt_enqueues_nothing_twice(
    application: Application, database_url: str, tmp_path: Path, dedup: bool
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        application.write(database_url, markers, **({"dedup": "order_id"} if dedup else {}))

        def second_attempt() -> bool:
            return application.alive() and any(markers.glob("attempt-[1-9]*"))

        until_sync(second_attempt, "a second attempt of the slow task", timeout=WRITE_TIMEOUT)
        before_commit = (state_counts(database_url), staged_count(database_url))
    finally:
        (markers / "go").touch()
    tasks = application.answer(markers)["tasks"]

    slow_partition = PARTITIONS - 1
    attempts = {t["attempt"]: t for t in tasks if t["index"] == slow_partition}
    assert sorted(attempts) == [0, 1], tasks
    assert attempts[1]["speculative"] and not attempts[0]["speculative"], tasks
    assert attempts[0]["host"] != attempts[1]["host"], tasks  # one on each worker
    assert (markers / "attempt-0").read_text() == str(slow_partition)

    # nothing claimable while the rows of the partitions done (half of them at least: the
    # speculation quantile) were staged, each partition's in one piece
    claimable, staged = before_commit
    assert claimable == Counter()
    assert ROWS // 2 <= staged < ROWS and staged % (ROWS // PARTITIONS) == 0, staged
    rows = live_rows(database_url)
    assert Counter(json.loads(r["payload"])["order_id"] for r in rows) == Counter(range(ROWS))
    assert {r["state"] for r in rows} == {"pending"}
    keys = sorted(str(n) for n in range(ROWS)) if dedup else [None] * ROWS
    assert sorted((r["dedup_key"] for r in rows), key=str) == keys
    assert staged_count(database_url) == 0
