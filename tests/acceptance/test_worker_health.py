"""`txtasks worker --health-port`: /livez and /readyz of a real worker process, its database
reached through a TCP proxy that the test cuts off and restores."""

from __future__ import annotations

import re
import signal

import pytest
from sqlalchemy import Engine

from tests import pace
from tests.acceptance.apps import (
    APP_SPEC,
    Processes,
    archived_rows,
    enqueue,
    http_get,
    wait_until,
)
from tests.conftest import backends
from tests.tcp_proxy import ProxyThread

ADDRESS = re.compile(r"health checks on http://([\d.]+):(\d+)/livez")
EXIT_TIMEOUT = pace.seconds(30)


@pytest.mark.parametrize("database_url", backends("postgresql", "mysql"), indirect=True)
def test_worker_health_follows_the_database(
    database_url: str, db: Engine, procs: Processes
) -> None:
    with ProxyThread.for_url(database_url) as proxy:
        options = ("--health-port", "0", "--health-host", "127.0.0.1", "--poll-interval", "0.1")
        worker = procs.start("worker", APP_SPEC, *options, url=proxy.url_for(database_url))
        found = wait_until(
            lambda: ADDRESS.search(worker.stderr), "the health endpoint's address", watch=[worker]
        )
        base = f"http://{found[1]}:{found[2]}"

        def answers(path: str, status: int) -> bool:
            return http_get(f"{base}{path}")[0] == status

        wait_until(lambda: answers("/readyz", 200), "/readyz 200", watch=[worker])
        status, live = http_get(f"{base}/livez")
        assert status == 200 and live["live"] is True, live
        [task] = enqueue(db, "acc.record", [{"n": 1}])
        wait_until(lambda: task in archived_rows(db), "the task to run", watch=[worker])

        proxy.refuse()  # the database cannot be reached: not ready, but alive
        wait_until(lambda: answers("/readyz", 503), "/readyz 503", watch=[worker])
        status, body = http_get(f"{base}/readyz")
        assert body["ready"] is False and body["database"] != "ok", body
        assert answers("/livez", 200)

        proxy.accept()  # back: ready again, and tasks run again
        wait_until(lambda: answers("/readyz", 200), "/readyz 200 again", watch=[worker])
        [again] = enqueue(db, "acc.record", [{"n": 2}])
        wait_until(lambda: again in archived_rows(db), "a task to run again", watch=[worker])

        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=EXIT_TIMEOUT) == 0, worker.stderr
