"""The deployment files parse and validate: docker-compose.yml against the Compose
Specification's JSON schema (the copy check-jsonschema ships), every Kubernetes manifest
against the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail), and
the cross-references between them hold.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.files import (
    COMPOSE,
    DEPLOY,
    ROOT,
    compose,
    containers,
    dockerfile_instructions,
    manifest_files,
    manifests,
    pod_spec,
)

#: The oldest Kubernetes version the manifests support (ContainerResource metrics are GA).
KUBERNETES_VERSION = "1.30.0"


# -- docker-compose.yml --------------------------------------------------------------------


@cache
def compose_schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text())
    return schema


def compose_errors(document: Any) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def test_compose_validates_against_the_compose_spec() -> None:
    assert compose_errors(compose()) == []


def test_the_compose_schema_check_catches_mistakes() -> None:
    broken = compose()
    broken["services"]["cleaner"]["healthchek"] = broken["services"]["cleaner"].pop("healthcheck")
    assert compose_errors(broken)


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def test_compose_runs_the_whole_topology() -> None:
    found = services()
    assert {"postgres", "rabbitmq", "migrate", "cleaner", "webapp"} <= set(found)
    workers = [s for s in found.values() if s.get("command", [None])[0] == "worker"]
    assert len(workers) == 2
    for name, service in found.items():
        assert "image" in service or "build" in service, f"{name}: neither image nor build"
        if "build" in service:
            build = service["build"]
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
            assert build.get("target") in build_targets(), f"{name}: no stage {build['target']}"


def test_compose_dependencies_start_in_order() -> None:
    found = services()
    for name, service in found.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in found, f"{name} depends on a missing service {dependency}"
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in found[dependency], f"{dependency} has no healthcheck"
            else:
                assert condition == "service_completed_successfully", f"{name}: {condition}"
                assert found[dependency].get("restart") == "no", f"{dependency} is not one-shot"
    assert found["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in found.items():
        argv = service.get("command") or []
        if name != "migrate" and "TXTASKS_DATABASE_URL" in (service.get("environment") or {}):
            assert service["depends_on"]["migrate"]["condition"] == (
                "service_completed_successfully"
            ), f"{name} may start before the schema exists"
        if argv[:1] in (["worker"], ["cleaner"]) or name == "webapp":
            assert service["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name


def test_compose_has_no_dependency_cycle() -> None:
    found = services()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on cycle: {' -> '.join((*path, name))}"
        if name not in done:
            for dependency in found[name].get("depends_on") or {}:
                visit(dependency, (*path, name))
            done.add(name)

    for name in found:
        visit(name, ())


#: The txtasks processes that serve a health endpoint.
WATCHED = ("worker", "cleaner")


def option(argv: list[str], name: str) -> str:
    assert name in argv, f"{argv}: no {name}"
    return argv[argv.index(name) + 1]


def test_compose_healthchecks_probe_the_right_ports() -> None:
    found = services()
    probed = [name for name in found if found[name].get("command", [None])[0] in WATCHED]
    assert probed == ["worker-1", "worker-2", "cleaner"]
    for name in probed:
        port = option(found[name]["command"], "--health-port")
        assert f"127.0.0.1:{port}/readyz" in " ".join(found[name]["healthcheck"]["test"]), name
    webapp = found["webapp"]
    port = option(webapp["command"], "--port")
    assert f"127.0.0.1:{port}/healthz" in " ".join(webapp["healthcheck"]["test"])
    assert any(p.endswith(f":{port}") for p in webapp["ports"])


def test_compose_workers_stop_within_their_grace() -> None:
    for name, service in services().items():
        if service.get("command", [None])[0] == "worker":
            grace = float(option(service["command"], "--shutdown-grace"))
            stop = service["stop_grace_period"]
            assert re.fullmatch(r"\d+s", stop), f"{name}: write stop_grace_period in seconds"
            assert int(stop[:-1]) > grace, f"{name}: Docker would kill it during its grace"


def test_compose_urls_point_at_the_compose_servers() -> None:
    found = services()
    env = found["worker-1"]["environment"]
    postgres = found["postgres"]["environment"]
    user, password, db = (
        postgres[k] for k in ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB")
    )
    assert env["TXTASKS_DATABASE_URL"] == f"postgresql://{user}:{password}@postgres:5432/{db}"
    rabbit = found["rabbitmq"]["environment"]
    user, password = rabbit["RABBITMQ_DEFAULT_USER"], rabbit["RABBITMQ_DEFAULT_PASS"]
    assert env["TXTASKS_BROKER_URL"] == f"amqp://{user}:{password}@rabbitmq:5672/"


# -- deploy/Dockerfile ---------------------------------------------------------------------


def build_targets() -> set[str]:
    return {
        m[1]
        for instruction, rest in dockerfile_instructions()
        if instruction == "FROM" and (m := re.search(r"\bAS (\S+)$", rest, re.I))
    }


def test_dockerfile_builds_a_wheel_and_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    froms = [rest for instruction, rest in instructions if instruction == "FROM"]
    assert len(froms) >= 2, "not a multi-stage build"
    args = dict(
        rest.split("=", 1)
        for instruction, rest in instructions
        if instruction == "ARG" and "=" in rest
    )
    assert args["PYTHON_IMAGE"] == "python:3.12-slim"
    runs = " ".join(rest for instruction, rest in instructions if instruction == "RUN")
    assert 'pip wheel --wheel-dir /wheels ".[postgres,rabbitmq]"' in runs
    assert '--no-index --find-links /wheels "txtasks[postgres,rabbitmq]"' in runs
    users = [rest for instruction, rest in instructions if instruction == "USER"]
    assert users[-1] != "root" and not users[-1].startswith("0")
    assert {"build", "base", "example", "runtime"} <= build_targets()
    # The last stage is the default target: txtasks without the example.
    assert froms[-1] == "base AS runtime"
    for instruction, rest in instructions:
        if instruction == "COPY" and "--from" not in rest:
            for source in rest.split()[:-1]:
                if not source.startswith("--"):
                    assert (ROOT / source).exists(), f"COPY of a missing path {source}"


def test_dockerignore_keeps_what_the_build_copies() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ("pyproject.toml", "README.md", "txtasks", "cleaner", "deploy"):
        assert needed not in ignored


# -- deploy/kubernetes ---------------------------------------------------------------------


def test_there_are_manifests() -> None:
    kinds = {obj["kind"] for _, obj in manifests()}
    assert {"ConfigMap", "Secret", "Deployment", "HorizontalPodAutoscaler", "Job"} <= kinds


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        assert isinstance(document, dict), f"{path.name}: a document is not an object"
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_schema_check_catches_mistakes() -> None:
    [(_, deployment)] = [(p, o) for p, o in manifests() if o["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][1]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for _, o in manifests() if o["kind"] == kind}


def by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in containers(spec)}


def test_worker_pod_probes_the_worker_and_its_cleaner_sidecar() -> None:
    [deployment] = objects("Deployment").values()
    spec = deployment["spec"]["template"]["spec"]
    found = by_name(spec)
    worker, cleaner = found["worker"], found["cleaner"]
    assert worker["args"][0] == "worker" and cleaner["args"][0] == "cleaner"
    assert worker["args"][1] == cleaner["args"][1], "the cleaner loads another app"
    assert "startupProbe" not in worker and "startupProbe" not in cleaner
    for container, health, metrics in (
        (worker, "worker-health", "metrics"),
        (cleaner, "health", "cleaner-metrics"),
    ):
        port = int(option(container["args"], "--health-port"))
        declared = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert declared == {health: port, metrics: int(option(container["args"], "--metrics-port"))}
        for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
            get = container[probe]["httpGet"]
            assert get["path"] == path
            assert get["port"] in (port, health)
    # one network namespace: the two containers' ports must differ
    assert len({p["containerPort"] for c in (worker, cleaner) for p in c["ports"]}) == 4


def test_worker_pod_outlives_the_shutdown_grace() -> None:
    [deployment] = objects("Deployment").values()
    spec = deployment["spec"]["template"]["spec"]
    worker = by_name(spec)["worker"]
    grace = float(option(worker["args"], "--shutdown-grace"))
    assert spec["terminationGracePeriodSeconds"] > grace


def test_every_container_has_resources_and_runs_as_non_root() -> None:
    for _, obj in manifests():
        spec = pod_spec(obj)
        if spec is None:
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in containers(spec):
            where = f"{obj['metadata']['name']}/{container['name']}"
            resources_ = container["resources"]
            assert {"cpu", "memory"} <= set(resources_["requests"]), where
            assert "memory" in resources_["limits"], where
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where


def test_references_between_manifests_resolve() -> None:
    config_maps, secrets = objects("ConfigMap"), objects("Secret")
    for _, obj in manifests():
        spec = pod_spec(obj)
        if spec is None:
            continue
        for container in containers(spec):
            sources = container.get("envFrom", [])
            assert any("secretRef" in s for s in sources), "the URLs come from the Secret"
            for source in sources:
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets
    [secret] = secrets.values()
    assert "TXTASKS_DATABASE_URL" in secret["stringData"]
    for config_map in config_maps.values():
        assert not any("URL" in key for key in config_map["data"]), "URLs belong in the Secret"

    deployments = objects("Deployment")
    for hpa in objects("HorizontalPodAutoscaler").values():
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        spec = deployments[target["name"]]["spec"]["template"]["spec"]
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "ContainerResource":
                resource = metric["containerResource"]
                container = by_name(spec)[resource["container"]]
                assert resource["name"] in container["resources"]["requests"]
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]

    for deployment in deployments.values():
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()


def test_the_migrate_job_runs_once() -> None:
    [job] = objects("Job").values()
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    [container] = spec["containers"]
    assert container["args"] == ["migrate"]


def test_the_readmes_exist() -> None:
    assert "docker compose up" in (DEPLOY / "README.md").read_text()
    text = (DEPLOY / "kubernetes" / "README.md").read_text()
    for path in manifest_files():
        assert path.name in text, f"deploy/kubernetes/README.md does not explain {path.name}"
    assert COMPOSE.name in (DEPLOY / "README.md").read_text()


# -- deploy/kubernetes/keda ----------------------------------------------------------------

KEDA_DIR = DEPLOY / "kubernetes" / "keda"

#: The part of KEDA's ScaledObject schema (keda.sh/v1alpha1) the example uses, strict: a field
#: misspelt or misplaced fails, as the API server would refuse it. Kubernetes' own schemas do
#: not include KEDA's resources; the autoscaler behavior is checked against them below.
SCALED_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                **{
                    field: {"type": "integer", "minimum": 0}
                    for field in (
                        "pollingInterval",
                        "cooldownPeriod",
                        "initialCooldownPeriod",
                        "idleReplicaCount",
                        "minReplicaCount",
                        "maxReplicaCount",
                    )
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}, "behavior": {}},
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {"type": "object", "required": ["name"]},
                            # KEDA reads trigger metadata as strings only
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}
#: What KEDA's PostgreSQL scaler reads from its metadata.
POSTGRESQL_METADATA = {
    "connectionFromEnv",
    "query",
    "targetQueryValue",
    "activationTargetQueryValue",
}


def scaled_objects() -> list[dict[str, Any]]:
    found = []
    for path in sorted(KEDA_DIR.glob("*.yaml")):
        found.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return found


def scaled_object_errors(document: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCALED_OBJECT)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def test_the_keda_scaled_object_has_the_shape_keda_reads() -> None:
    [scaled] = scaled_objects()
    assert scaled_object_errors(scaled) == []
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert set(trigger["metadata"]) == POSTGRESQL_METADATA
    assert float(trigger["metadata"]["targetQueryValue"]) > 0
    assert float(trigger["metadata"]["activationTargetQueryValue"]) >= 0


def test_the_keda_structure_check_catches_mistakes() -> None:
    [scaled] = scaled_objects()
    scaled["spec"]["minReplicas"] = scaled["spec"].pop("minReplicaCount")
    assert scaled_object_errors(scaled)
    [scaled] = scaled_objects()
    scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue"] = 200
    assert scaled_object_errors(scaled)


def test_the_keda_scaled_object_scales_the_worker_deployment_within_sane_bounds() -> None:
    [scaled] = scaled_objects()
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert (target.get("kind", "Deployment"), target.get("apiVersion", "apps/v1")) == (
        "Deployment",
        "apps/v1",
    )
    deployment = objects("Deployment")[target["name"]]
    pod = deployment["spec"]["template"]["spec"]
    # the pods run the cleaner: scaling them to zero would stop rescues, retries and periodics
    assert any(c["args"][0] == "cleaner" for c in containers(pod))
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    # the autoscaler behavior is Kubernetes' own: validate it in an HPA of the same target
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": scaled["metadata"]["name"]},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": target["name"],
            },
            "minReplicas": spec["minReplicaCount"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
        },
    }
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


def test_the_keda_query_reads_the_workers_database_and_queue() -> None:
    """The scaler connects with the URL in the target's first container's environment (the
    worker's), counts the queue that the example app's tasks use, and reads txtasks tables."""
    [scaled] = scaled_objects()
    metadata = scaled["spec"]["triggers"][0]["metadata"]
    deployment = objects("Deployment")[scaled["spec"]["scaleTargetRef"]["name"]]
    worker = containers(deployment["spec"]["template"]["spec"])[0]
    assert worker["args"][0] == "worker"
    secrets = objects("Secret")
    env = {
        name
        for source in worker["envFrom"]
        if "secretRef" in source
        for name in secrets[source["secretRef"]["name"]]["stringData"]
    }
    assert metadata["connectionFromEnv"] in env
    assert secrets["shop-txtasks-urls"]["stringData"][metadata["connectionFromEnv"]].startswith(
        "postgresql://"
    )
    shop = (ROOT / "deploy" / "example" / "shop.py").read_text()
    [queue] = re.findall(r'^QUEUE = "([^"]+)"', shop, re.M)
    query = metadata["query"]
    assert query.count(f"queue = '{queue}'") == 3  # both parts and the paused check
    assert set(re.findall(r"\btxtasks_\w+", query)) == {"txtasks_tasks", "txtasks_paused_queues"}


def test_the_keda_example_is_not_applied_with_the_other_manifests() -> None:
    """`kubectl apply -f deploy/kubernetes/` must not need KEDA: its manifest is apart."""
    assert not [o for _, o in manifests() if o["apiVersion"].startswith("keda.sh/")]
    text = (DEPLOY / "kubernetes" / "README.md").read_text()
    assert "keda/worker-scaledobject.yaml" in text
