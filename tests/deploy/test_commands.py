"""Every `txtasks ...` command that the compose file, the Kubernetes manifests and the Dockerfile
run parses against the real CLI: the subcommand exists, every option is known and every value
is valid (with the environment the file gives that command). The applications they name
import, and the web application that uvicorn serves too.
"""

from __future__ import annotations

import importlib
from typing import Any

import click
import pytest
from click.testing import CliRunner

from tests.deploy.files import (
    Command,
    all_commands,
    compose,
    compose_commands,
    dockerfile_command,
    manifest_commands,
    manifests,
    txtasks_commands,
)
from txtasks import App
from txtasks.cli.main import main as cli_main

SUBCOMMANDS = {"cleaner", "demo", "dlq", "enqueue", "migrate", "status", "worker"}


def test_the_files_run_the_expected_commands() -> None:
    shown = {str(c.argv[1]) for c in txtasks_commands() if len(c.argv) > 1}
    assert {"migrate", "worker", "cleaner"} <= shown
    assert len(compose_commands()) >= 5
    assert {c.argv[1] for c in manifest_commands()} >= {"worker", "cleaner", "migrate"}
    assert dockerfile_command().argv == ["txtasks", "--help"]
    others = {c.argv[0] for c in all_commands()} - {"txtasks"}
    assert others == {"uvicorn"}, f"commands of unknown programs: {others}"


def split(command: Command) -> tuple[list[str], click.Command, list[str]]:
    """The path of subcommands, the click command they lead to, and its arguments."""
    args = command.argv[1:]
    cmd: click.Command = cli_main
    path = ["txtasks"]
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        name = args.pop(0)
        found = cmd.get_command(click.Context(cmd), name)  # lazily imported ones too
        assert found is not None, f"{command}: no command {name!r}"
        cmd = found
        path.append(name)
    return path, cmd, args


def environment_of(command: Command) -> dict[str, str]:
    """The TXTASKS_* settings the file gives the command (they are defaults of some options)."""
    env: dict[str, str] = {}
    if command.where.startswith("docker-compose.yml"):
        service = compose()["services"][command.where.split("services.", 1)[1]]
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
    elif not command.where.startswith("deploy/Dockerfile"):
        data: dict[str, dict[str, Any]] = {}
        for _path, obj in manifests():
            if obj["kind"] in {"ConfigMap", "Secret"}:
                data[obj["metadata"]["name"]] = {**obj.get("data", {}), **obj.get("stringData", {})}
        for _path, obj in manifests():
            template = obj.get("spec", {}).get("template", {}).get("spec", {})
            for container in template.get("containers", []):
                if command.where.endswith(f"{obj['metadata']['name']} {container['name']}"):
                    for source in container.get("envFrom", []):
                        ref = source.get("configMapRef") or source.get("secretRef")
                        env |= {k: str(v) for k, v in data[ref["name"]].items()}
                    env |= {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return {k: v for k, v in env.items() if k.startswith("TXTASKS_")}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("TXTASKS_DATABASE_URL", "TXTASKS_BROKER_URL", "TXTASKS_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("TXTASKS_HEALTH_PORT", "TXTASKS_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("command", txtasks_commands(), ids=str)
def test_command_help_exits_0(command: Command, clean_env: pytest.MonkeyPatch) -> None:
    """`<command> --help` through the real CLI: an unknown subcommand or option fails."""
    args = command.argv[1:]
    if args[-1:] != ["--help"]:
        args = [*args, "--help"]
    result = CliRunner().invoke(cli_main, args, env=environment_of(command))
    assert result.exit_code == 0, f"{command}\n{result.output}"
    assert "Usage: " in result.output


@pytest.mark.parametrize(
    "command", [c for c in txtasks_commands() if "--help" not in c.argv], ids=str
)
def test_command_values_are_valid(command: Command, clean_env: pytest.MonkeyPatch) -> None:
    """The options' values (and the TXTASKS_* defaults the file sets) convert without error."""
    path, cmd, args = split(command)
    assert not isinstance(cmd, click.Group), f"{command}: names a group, not a command"
    for name, value in environment_of(command).items():
        clean_env.setenv(name, value)
    cmd.make_context(" ".join(path), args)  # raises on an unknown option or a bad value


def test_unknown_options_fail(clean_env: pytest.MonkeyPatch) -> None:
    """The checks above do catch a mistake."""
    result = CliRunner().invoke(cli_main, ["worker", "x:app", "--helth-port", "1", "--help"])
    assert result.exit_code != 0
    result = CliRunner().invoke(cli_main, ["wrker", "x:app", "--help"])
    assert result.exit_code != 0
    path, cmd, args = split(Command("example", ["txtasks", "worker", "x:app", "-c", "zero"]))
    with pytest.raises(click.BadParameter):
        cmd.make_context(" ".join(path), args)


def app_specs() -> list[str]:
    specs = set()
    for command in txtasks_commands():
        path, cmd, args = split(command)
        if cmd.name in {"worker", "cleaner"}:
            ctx = cmd.make_context(" ".join(path), args, resilient_parsing=True)
            specs.add(ctx.params["app_spec"])
    return sorted(specs)


def test_the_worker_and_cleaner_commands_name_an_app() -> None:
    assert app_specs() == ["deploy.example.shop:app"]


@pytest.mark.parametrize("spec", app_specs())
def test_app_imports(spec: str) -> None:
    module, _, attribute = spec.partition(":")
    app = getattr(importlib.import_module(module), attribute)
    assert isinstance(app, App)
    assert "shop.ship_order" in app.tasks
    assert app.queues == ["orders"]


def test_uvicorn_serves_the_example_web_app() -> None:
    [command] = [c for c in all_commands() if c.argv[0] == "uvicorn"]
    target = command.argv[1]
    module, _, attribute = target.partition(":")
    api = getattr(importlib.import_module(module), attribute)
    assert callable(api)
    assert "--port" in command.argv and "--host" in command.argv
