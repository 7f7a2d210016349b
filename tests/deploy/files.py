"""The deployment files under test, loaded, and the `txtasks` commands they run.

- docker-compose.yml (repository root): each service's command, with the image's entrypoint
  (`txtasks`) unless the service names another one.
- deploy/kubernetes/*.yaml: each container's `command` + `args`, with the image's entrypoint
  when `command` is not given.
- deploy/Dockerfile: ENTRYPOINT + CMD, the command of the image run without arguments.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
KUBERNETES = DEPLOY / "kubernetes"
#: The entrypoint of the image built by deploy/Dockerfile.
ENTRYPOINT = ["txtasks"]


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict), "docker-compose.yml is not a mapping"
    return loaded


def manifest_files() -> list[Path]:
    return sorted(KUBERNETES.glob("*.yaml")) + sorted(KUBERNETES.glob("*.yml"))


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object of every manifest file, with its file."""
    found = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                found.append((path, document))
    return found


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template's spec of a workload object, or None for other kinds."""
    kind = obj["kind"]
    if kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        spec: dict[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    if kind == "CronJob":
        spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    if kind == "Pod":
        spec = obj["spec"]
        return spec
    return None


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


@dataclass(frozen=True)
class Command:
    where: str
    argv: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {' '.join(self.argv)}"


def _argv(value: Any, where: str) -> list[str]:
    assert isinstance(value, list), f"{where}: give commands as lists (exec form), not {value!r}"
    assert all(isinstance(a, str) for a in value), f"{where}: non-string arguments in {value!r}"
    return list(value)


def compose_commands() -> list[Command]:
    found = []
    for name, service in compose()["services"].items():
        if "command" not in service:
            continue
        where = f"docker-compose.yml services.{name}"
        entrypoint = _argv(service.get("entrypoint", ENTRYPOINT), where)
        found.append(Command(where, entrypoint + _argv(service["command"], where)))
    return found


def manifest_commands() -> list[Command]:
    found = []
    for path, obj in manifests():
        spec = pod_spec(obj)
        if spec is None:
            continue
        for container in containers(spec):
            where = f"{path.name} {obj['kind']}/{obj['metadata']['name']} {container['name']}"
            command = _argv(container.get("command", ENTRYPOINT), where)
            found.append(Command(where, command + _argv(container.get("args", []), where)))
    return found


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def dockerfile_command() -> Command:
    """ENTRYPOINT + CMD of the final stage (each in exec form, inherited from `base`)."""
    entrypoint = cmd = None
    for instruction, rest in dockerfile_instructions():
        if instruction == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif instruction == "CMD":
            cmd = json.loads(rest)
    assert entrypoint is not None and cmd is not None, "the Dockerfile sets no ENTRYPOINT or CMD"
    return Command("deploy/Dockerfile", [*entrypoint, *cmd])


def all_commands() -> list[Command]:
    return [*compose_commands(), *manifest_commands(), dockerfile_command()]


def txtasks_commands() -> list[Command]:
    return [c for c in all_commands() if c.argv[0] == "txtasks"]
