"""Fixtures of the dashboard tests: an App with a few tasks in every state a page shows, and
an HTTP client on its dashboard, in the test's own event loop."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from txtasks import App
from txtasks.testing import run_until_empty
from txtasks.web import create_app

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
#: While set, task `broken` fails (a test clears it to see a re-driven dead letter complete).
BROKEN = {"disk": True}


@dataclass
class Seeded:
    """What `seeded` made: the ids of a waiting task, a dead one and a failed-once one."""

    waiting: int
    dead: int
    retrying: int


def declare(app: App) -> None:
    """The tasks the dashboard tests run."""

    @app.task(name="send", queue="mail")
    async def send(payload: Any) -> Any:
        return {"sent": payload}

    @app.task(name="broken", queue="reports", max_attempts=1)
    async def broken(payload: Any) -> None:
        if BROKEN["disk"]:
            try:
                write_report(payload)
            except OSError as exc:
                raise RuntimeError(f"report {payload} failed: disk full") from exc

    @app.task(name="flaky", queue="reports", max_attempts=5, retry=3600)
    async def flaky(payload: Any) -> None:
        raise RuntimeError("flaky: try again later")

    app.periodic("send", name="nightly", every=86400, payload={"to": "ops"})


def write_report(payload: Any) -> None:
    raise OSError(28, "No space left on device")


async def seed(app: App) -> Seeded:
    """One dead letter (and its traceback), a completed task, a retrying one and a waiting one
    with a key."""
    dead = await app.aenqueue("broken", 7)
    done = await app.aenqueue("send", {"to": "a@example.com"})
    retrying = await app.aenqueue("flaky", 1)
    await run_until_empty(app, queues=["mail", "reports"])
    assert (await app.control.ainspect(done)).state.value == "completed"  # type: ignore[union-attr]
    waiting = await app.aenqueue("send", {"to": "b@example.com"}, key="tenant-1")
    return Seeded(waiting=waiting, dead=dead, retrying=retrying)


@pytest.fixture
async def dashboard_app(app: App) -> App:
    BROKEN["disk"] = True
    declare(app)
    return app


@pytest.fixture
async def seeded(dashboard_app: App) -> Seeded:
    return await seed(dashboard_app)


def client_for(asgi: Any, **options: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, client=("127.0.0.1", 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", **options)


@pytest.fixture
async def client(dashboard_app: App) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_app(dashboard_app, refresh=0)) as http:
        yield http


async def csrf_of(http: httpx.AsyncClient, path: str = "/") -> str:
    """The CSRF token a page hands out (and sets as a cookie)."""
    page = await http.get(path)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found, "no CSRF token in the page"
    return found.group(1)


async def act(http: httpx.AsyncClient, action: str, **fields: Any) -> httpx.Response:
    """Post an action and confirm it, as a user clicking twice does."""
    token = await csrf_of(http)
    data = {"csrf": token, "action": action, "back": "/", **fields}
    asked = await http.post("/action", data=data)
    assert asked.status_code == 200, asked.text
    assert 'id="confirm"' in asked.text
    return await http.post("/action", data={**data, "confirmed": "yes"})
