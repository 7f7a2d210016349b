"""The worker's health endpoint: /livez while its loops turn, /readyz while the database answers."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from tests.unit.health_http import http_get
from tests.waiting import until
from txtasks import App, MemoryDriver, Worker, WorkerConfig
from txtasks.driver.memory import MemoryClaims
from txtasks.errors import ConfigurationError
from txtasks.health import HealthServer

FAST = {"poll_interval": 0.01, "flush_interval": 0.001, "health_host": "127.0.0.1"}


class Switchable(MemoryDriver):
    """A driver whose database can go away (pings and claims fail) or hang (claims never end)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.hang = asyncio.Event()
        self.claim_calls = 0
        self.claims = SwitchableClaims(self)

    async def ping(self) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")


class SwitchableClaims(MemoryClaims):
    """The claims of a `Switchable` driver: they fail while it is down, never end while it
    hangs."""

    def __init__(self, driver: Switchable) -> None:
        super().__init__(driver.store)
        self.driver = driver

    async def task_claim_many(self, *args: Any, **kwargs: Any) -> Any:
        self.driver.claim_calls += 1
        if self.driver.hang.is_set():
            await asyncio.Event().wait()  # a database call that never returns
        if self.driver.down:
            raise ConnectionRefusedError("connection refused")
        return await super().task_claim_many(*args, **kwargs)


def new_worker(driver: MemoryDriver, **config: Any) -> Worker:
    app = App(driver=driver)
    app.task(name="t")(lambda payload: None)
    return Worker(app, WorkerConfig(**{**FAST, **config}))


async def test_livez_and_readyz_answer_while_the_worker_runs_and_the_database_answers() -> None:
    driver = Switchable()
    worker = new_worker(driver, health_port=0)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.idle.wait(), 5)
        port = worker.health_server.port  # type: ignore[union-attr]
        for path in ("/livez", "/readyz", "/healthz"):
            status, body = await http_get(port, path)
            assert status == 200, (path, body)
        report = json.loads(body)
        assert set(report["seconds_since_turned"]) == {"claimer", "heartbeat", "outcomes"}

        driver.down = True  # the database goes away: not ready, still live (restarting would
        status, body = await http_get(port, "/readyz")  # not bring it back)
        assert status == 503 and json.loads(body)["database"] == "connection refused"
        assert (await http_get(port, "/livez"))[0] == 200

        driver.down = False
        assert (await http_get(port, "/readyz"))[0] == 200
    finally:
        worker.stop()
        await asyncio.wait_for(running, 5)
    assert worker.health_server._server is None  # type: ignore[union-attr]


async def test_a_claim_stuck_in_the_database_fails_livez_within_its_bound() -> None:
    driver = Switchable()
    worker = new_worker(driver, stall_after=0.2)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.idle.wait(), 5)
        assert worker.liveness()["live"] is True
        driver.hang.set()
        claims = driver.claim_calls

        await until(
            lambda: driver.claim_calls > claims and not worker.liveness()["live"],
            "a failed claim to make the worker not live",
        )
        assert worker.liveness()["stuck"] == ["claimer"]
        assert (await worker.health("ready"))["ready"] is False
    finally:
        worker.stop(now=True)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


class StuckWrites(SwitchableClaims):
    """Outcome writes that hang until `released` (a frozen connection); lease extensions go on."""

    def __init__(self, driver: Switchable) -> None:
        super().__init__(driver)
        self.released = asyncio.Event()
        self.extended: list[int] = []

    async def outcome_write_many(self, *args: Any, **kwargs: Any) -> Any:
        await self.released.wait()
        return await super().outcome_write_many(*args, **kwargs)

    async def lease_extend_many(self, keys: Any, **kwargs: Any) -> int:
        self.extended.append(len(keys))
        return await super().lease_extend_many(keys, **kwargs)


async def test_a_stuck_outcome_write_neither_stops_the_heartbeat_nor_passes_livez() -> None:
    driver = Switchable()
    driver.claims = stuck = StuckWrites(driver)
    app = App(driver=driver)
    app.task(name="t")(lambda payload: None)
    await app.tasks["t"].aenqueue(None)
    worker = Worker(app, WorkerConfig(heartbeat=0.02, stall_after=0.2, **FAST))
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.stats.started == 1, "the task to start")
        beats = len(stuck.extended)
        # the heartbeat goes on extending the lease of the task whose outcome waits
        await until(lambda: len(stuck.extended) >= beats + 3, "three more heartbeats")
        assert stuck.extended[-1] == 1
        await until(lambda: not worker.liveness()["live"], "the worker to be not live")
        assert worker.liveness()["stuck"] == ["outcomes"]
    finally:
        stuck.released.set()
        worker.stop()
        stats = await asyncio.wait_for(running, 5)
    assert stats.outcomes == {"completed": 1}


async def test_a_worker_whose_slots_are_all_busy_stays_live() -> None:
    driver = Switchable()
    app = App(driver=driver)
    release = asyncio.Event()

    @app.task(name="long")
    async def long(payload: None) -> None:
        await release.wait()

    await long.aenqueue()
    worker = Worker(app, WorkerConfig(concurrency=1, stall_after=0.05, **FAST))
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.stats.started == 1, "the task to start")
        await asyncio.sleep(0.3)  # six times the bound: a loop waiting for a slot still turns
        assert worker.liveness()["live"] is True
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(running, 5)


async def test_a_health_port_in_use_is_an_error_naming_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HealthServer(lambda probe: {"live": True}, "127.0.0.1", port)
        with pytest.raises(ConfigurationError) as info:
            await server.start()
    assert str(info.value) == (
        f"--health-port {port}: cannot serve health checks on 127.0.0.1:{port}: "
        "Address already in use"
    )


@pytest.mark.parametrize("port", [-1, 65536, float("nan")])
def test_a_bad_health_port_is_refused(port: float) -> None:
    with pytest.raises(ConfigurationError, match="health_port"):
        WorkerConfig(health_port=port)  # type: ignore[arg-type]


def test_a_worker_still_starting_is_live() -> None:
    """Between reaching the database and starting its loops (it stores its subscriptions
    then), a worker is live: /livez answered 503 there, though /readyz had said ready."""
    report = new_worker(MemoryDriver()).liveness()
    assert report["live"] is True and report["starting"] is True, report
