"""A write on a Spark standalone cluster where Spark speculates: exactly once all the same.

Spark starts a speculative copy of a slow task only on another host than the one running it,
so `local[N]` never does: these tests start a standalone cluster of two one-core workers on
two loopback addresses (`tests.spark.cluster`) and run the write in an application of its own
(`tests.spark.speculation_job`). The last partition's first attempt waits until a second
attempt of it runs; both then wait until the test has looked at the database (rows of three
partitions staged, nothing claimable); then they race. Spark's own records (its status store)
must show a speculative attempt of that partition, and the database every row once.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import IN_CI
from tests.spark.speculation_app import PARTITIONS, ROWS
from tests.spark.test_spark_write import live_rows, staged_count, state_counts
from tests.waiting import until_sync

#: Seconds a write gets (the first one: the application's JVM and executors start).
WRITE_TIMEOUT = 90.0
#: Seconds the application gets to stop once its stdin is closed.
STOP_TIMEOUT = 30.0


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
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
        self.answers: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put("")  # the application ended

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the application ended ({self.process.returncode}): {self.log}")
        return True

    def write(self, database_url: str, markers: Path) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{database_url} {markers}\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        try:
            line = self.answers.get(timeout=WRITE_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"no answer in {WRITE_TIMEOUT:g}s: {self.log}") from None
        assert line, f"the application ended: {self.log}"
        answer: dict[str, Any] = json.loads(line)
        assert "error" not in answer, f"{answer['error']} ({self.log})"
        return answer

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(STOP_TIMEOUT)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture(scope="module")
def application(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Application]:
    running = Application(cluster.master_url, tmp_path_factory.mktemp("spark-app") / "app.log")
    yield running
    running.stop()


def test_a_speculative_attempt_enqueues_nothing_twice(
    application: Application, database_url: str, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        application.write(database_url, markers)

        def second_attempt() -> bool:
            return application.alive() and any(markers.glob("attempt-[1-9]*"))

        until_sync(second_attempt, "a second attempt of the slow task", timeout=WRITE_TIMEOUT)
        before_commit = (state_counts(database_url), staged_count(database_url))
    finally:
        (markers / "go").touch()
    tasks = application.answer()["tasks"]

    slow_partition = PARTITIONS - 1
    speculative = [t for t in tasks if t["speculative"]]
    assert [t["index"] for t in speculative] == [slow_partition], tasks
    attempts = [t for t in tasks if t["index"] == slow_partition]
    assert len({t["host"] for t in attempts}) == 2, attempts  # on both workers
    assert sorted(t["attempt"] for t in attempts) == [0, 1]
    assert (markers / "attempt-0").read_text() == str(slow_partition)

    # nothing claimable while the other partitions' rows were staged
    assert before_commit == (Counter(), ROWS * (PARTITIONS - 1) // PARTITIONS)
    rows = live_rows(database_url)
    assert Counter(json.loads(r["payload"])["order_id"] for r in rows) == Counter(range(ROWS))
    assert {r["state"] for r in rows} == {"pending"}
    assert staged_count(database_url) == 0
