"""`txtasks dashboard` as a user runs it: a process serving the pages until SIGTERM."""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.apps import Processes, wait_until
from tests.conftest import reset_schema

LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.close()


def test_the_command_serves_the_dashboard_until_stopped(
    processes: Processes, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'dashboard.sqlite3'}"
    reset_schema(url)
    proc = processes.start(
        "dashboard", "txtasks.cli.demo_app:app", "--port", "0", "--read-only", url=url
    )
    found = wait_until(
        lambda: LISTENING.search(proc.stderr), "the dashboard listening", watch=[proc]
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/dead", timeout=10) as page:
        body = page.read().decode()
    assert page.status == 200 and "Dead letters" in body and "read-only" in body
    proc.signal(signal.SIGTERM)
    # uvicorn shuts down (closing the App's connections), then dies of the signal it caught
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in proc.stderr
