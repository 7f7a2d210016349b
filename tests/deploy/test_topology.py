"""The compose topology, run as local processes: `txtasks migrate`, two workers, a cleaner with
its health endpoint and the example web shop under uvicorn, on one database (a SQLite file,
and PostgreSQL when a server is available). Orders posted over HTTP are shipped by the
workers; then every process stops on SIGTERM with status 0.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, select

from tests import pace
from tests.acceptance.apps import (
    REPO,
    Proc,
    Processes,
    archived_rows,
    cli,
    cli_env,
    db_engine,
    live_rows,
    wait_until,
)
from tests.conftest import server_url
from tests.deploy.files import compose

pytestmark = pytest.mark.acceptance

APP = "deploy.example.shop:app"
WEBAPP = "deploy.example.webapp:api"
ORDERS = 8
EXIT_TIMEOUT = pace.seconds(30.0)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgresql),
        pytest.param(
            "postgresql+rabbitmq",
            id="postgresql-rabbitmq",
            marks=[pytest.mark.postgresql, pytest.mark.rabbitmq],
        ),
    ]
)
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database without the txtasks tables or the shop's: `txtasks migrate` creates them."""
    url = server_url(request, request.param.split("+")[0], tmp_path)
    engine = db_engine(url)
    try:
        with engine.begin() as conn:
            existing = MetaData()
            existing.reflect(
                conn, only=lambda name, _m: name.startswith("txtasks_") or name == "shop_orders"
            )
            existing.drop_all(conn)
    finally:
        engine.dispose()
    yield url


@pytest.fixture
def broker(request: pytest.FixtureRequest, empty_database: str) -> str | None:
    """The RabbitMQ URL of the `+rabbitmq` variant (wake-ups, as in compose), else None."""
    if "rabbitmq" in request.node.callspec.id:
        return str(request.getfixturevalue("amqp_url"))
    return None


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
def db(empty_database: str) -> Iterator[Engine]:
    engine = db_engine(empty_database)
    yield engine
    engine.dispose()


def start_uvicorn(procs: Processes, url: str, broker: str | None) -> tuple[Proc, str]:
    """uvicorn serving the example web app on a socket bound here (no port race)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    env = cli_env(url)
    if broker is not None:
        env["TXTASKS_BROKER_URL"] = broker
    n = len(procs.started)
    out, err = procs.directory / f"proc{n}.out", procs.directory / f"proc{n}.err"
    try:
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", WEBAPP, "--fd", str(listener.fileno())],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(listener.fileno(),),
                start_new_session=True,
            )
    finally:
        listener.close()  # uvicorn holds its own copy
    proc = Proc(popen, out, err)
    procs.started.append(proc)
    return proc, f"http://127.0.0.1:{port}"


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=pace.seconds(10)) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def command_of(service: str) -> list[str]:
    """The service's txtasks arguments in docker-compose.yml."""
    argv: list[str] = compose()["services"][service]["command"]
    return list(argv)


def local(argv: list[str], **replace: str) -> list[str]:
    """Compose arguments adapted to a test: some option values replaced."""
    argv = list(argv)
    for name, value in replace.items():
        flag = "--" + name.replace("_", "-")
        argv[argv.index(flag) + 1] = value
    return argv


def health_address(proc: Proc, everyone: list[Proc]) -> str:
    """The base URL of the health endpoint a process logged."""
    pattern = re.compile(r"health checks on http://([\d.]+):(\d+)/livez")
    found = wait_until(lambda: pattern.search(proc.stderr), "a health address", watch=everyone)
    return f"http://{found[1]}:{found[2]}"


def answers(url: str) -> bool:
    return http("GET", url)[0] == 200


def test_compose_topology_ships_every_order(
    empty_database: str, broker: str | None, db: Engine, procs: Processes
) -> None:
    url = empty_database
    wakeups = ["--broker-url", broker] if broker else []
    migrated = cli(*command_of("migrate"), url=url)
    assert migrated.returncode == 0, migrated.stderr

    # Without wake-ups the workers poll; quickly, so the test does not wait for them.
    polling = ["--poll-interval", "5" if broker else "0.05"]
    workers = [
        procs.start(
            *local(command_of(name), shutdown_grace="5", health_port="0"),
            "--health-host",
            "127.0.0.1",
            *polling,
            *wakeups,
            url=url,
        )
        for name in ("worker-1", "worker-2")
    ]
    cleaner_args = local(command_of("cleaner"), health_port="0")
    cleaner = procs.start(*cleaner_args, "--health-host", "127.0.0.1", *wakeups, url=url)
    webapp, base = start_uvicorn(procs, url, broker)
    everyone = [*workers, cleaner, webapp]

    address = re.compile(r"health checks on http://([\d.]+):(\d+)/livez")
    found = wait_until(
        lambda: address.search(cleaner.stderr), "the cleaner's health address", watch=everyone
    )
    assert found is not None
    health = f"http://{found[1]}:{found[2]}"
    wait_until(lambda: http("GET", f"{health}/readyz")[0] == 200, "/readyz", watch=everyone)
    for worker in workers:  # each worker's own endpoint: live, and ready (the database answers)
        probe = health_address(worker, everyone)
        wait_until(partial(answers, f"{probe}/readyz"), "a worker's /readyz", watch=everyone)
        assert answers(f"{probe}/livez")
    wait_until(lambda: http("GET", f"{base}/healthz")[0] == 200, "the web app", watch=everyone)

    assert http("POST", f"{base}/orders", {"item": "", "quantity": 0})[0] == 422
    created = []
    for n in range(ORDERS):
        status, body = http("POST", f"{base}/orders", {"item": f"book-{n}", "quantity": n + 1})
        assert status == 201, body
        assert body["status"] == "new"
        created.append(body)
    assert len({o["id"] for o in created}) == ORDERS

    def shipped() -> list[dict[str, Any]] | None:
        orders = [http("GET", f"{base}/orders/{o['id']}")[1] for o in created]
        done = all(o is not None and o["status"] == "shipped" for o in orders)
        return orders if done else None

    orders = wait_until(shipped, "every order shipped", timeout=60, watch=everyone)
    assert orders is not None
    for order, made in zip(orders, created, strict=True):
        assert order["task_id"] == made["task_id"]
        assert order["shipped_at"] is not None and order["shipped_by"]

    def completed() -> dict[int, Any] | None:
        rows = archived_rows(db)
        ids = {o["task_id"] for o in created}
        done = ids <= {i for i, r in rows.items() if r.state == "completed"}
        return rows if done else None

    # The outcome is written after the handler's commit, so it can lag the order's status.
    archived = wait_until(completed, "every task completed", timeout=30, watch=everyone)
    assert archived is not None
    assert {archived[o["task_id"]].attempt for o in created} == {1}
    assert live_rows(db) == {}

    with db.connect() as conn:  # the rejected request wrote nothing
        table = MetaData()
        table.reflect(conn, only=["shop_orders"])
        count = len(conn.execute(select(table.tables["shop_orders"].c.id)).all())
    assert count == ORDERS

    for proc in everyone:
        proc.signal(signal.SIGTERM)
    for proc in [*workers, cleaner]:
        assert proc.wait(timeout=EXIT_TIMEOUT) == 0, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
    # uvicorn shuts down gracefully, then re-raises the signal it caught (uvicorn >= 0.29).
    assert webapp.wait(timeout=EXIT_TIMEOUT) in (0, -signal.SIGTERM), webapp.stderr
    assert "Application shutdown complete." in webapp.stderr
    assert "Traceback" not in webapp.stderr, webapp.stderr
