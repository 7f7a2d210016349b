"""Who may reach the dashboard: loopback only without a login, and a login when one is set."""

from __future__ import annotations

import base64

import pytest
from click.testing import CliRunner

from tests.web.conftest import client_for
from txtasks import App
from txtasks.cli.main import main
from txtasks.errors import ConfigurationError
from txtasks.web import Auth, create_app
from txtasks.web.security import LOOPBACK_HOSTS, check_bind


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.org"])
def test_a_bind_beyond_loopback_needs_auth(host: str) -> None:
    with pytest.raises(ConfigurationError, match="TXTASKS_DASHBOARD_TOKEN"):
        check_bind(host, None)
    check_bind(host, Auth(token="s3cret"))  # allowed with a login
    for loopback in ("127.0.0.1", "::1", "localhost"):
        check_bind(loopback, None)


def test_the_command_refuses_to_start_on_a_public_bind_without_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TXTASKS_DASHBOARD_TOKEN", "TXTASKS_DASHBOARD_USER", "TXTASKS_DASHBOARD_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(
        main,
        ["dashboard", "txtasks.cli.demo_app:app", "--host", "0.0.0.0"],
    )
    assert result.exit_code != 0
    assert "reachable from other machines" in result.output


def test_auth_from_the_environment() -> None:
    assert Auth.from_env({}) is None
    assert Auth.from_env({"TXTASKS_DASHBOARD_TOKEN": "t"}) == Auth(token="t")
    with pytest.raises(ConfigurationError, match="TXTASKS_DASHBOARD_PASSWORD"):
        Auth.from_env({"TXTASKS_DASHBOARD_USER": "ops"})


async def test_unauthenticated_requests_are_refused(app: App) -> None:
    auth = Auth(user="ops", password="pw", token="tok")
    async with client_for(create_app(app, auth=auth, refresh=0)) as http:
        for path in ("/", "/tasks", "/dead", "/static/dashboard.js"):
            refused = await http.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"].startswith("Basic")
        assert (await http.post("/action", data={"action": "pause"})).status_code == 401
        assert (await http.get("/", headers=basic("ops", "wrong"))).status_code == 401
        assert (await http.get("/", headers={"Authorization": "Bearer nope"})).status_code == 401
        page = await http.get("/", headers=basic("ops", "pw"))
        assert page.status_code == 200 and "ops" in page.text
        assert (await http.get("/", headers={"Authorization": "Bearer tok"})).status_code == 200
        assert (await http.get("/", headers=basic("anyone", "tok"))).status_code == 200


async def test_only_the_hosts_given_are_answered(app: App) -> None:
    asgi = create_app(app, refresh=0, hosts=LOOPBACK_HOSTS)
    async with client_for(asgi) as http:
        for host in ("127.0.0.1:8080", "localhost", "[::1]:8080"):
            assert (await http.get("/", headers={"Host": host})).status_code == 200, host
        rebound = await http.get("/", headers={"Host": "attacker.example:8080"})
        assert rebound.status_code == 400
