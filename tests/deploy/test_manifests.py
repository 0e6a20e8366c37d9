"""deploy/base: every manifest valid against the Kubernetes schemas, least privilege, and
a Dockerfile that runs as a non-root user from a pinned base image."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from placement.adapters.kube import (
    KubeHotSets,
    KubeLeaseStore,
    KubePlanStore,
    KubePods,
    KubeStateStore,
    KubeTarget,
    connect,
)
from placement.controller.config import load_controller_config
from placement.controller.leader import LeaderElector
from placement.domain import AdapterId, PodId
from placement.inputs import load_catalog, load_fleet, load_pipelines
from placement.ports import StoredState
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.factories import FakeClock, make_plan

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "base"
KUBE_VERSION = "1.30.0"


def kustomization() -> dict[str, Any]:
    loaded = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            if doc:
                yield f"{name}:{doc['kind']}/{doc['metadata']['name']}", doc


DOCS = dict(documents())


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in DOCS.values() if doc["kind"] == kind}


def test_the_kustomization_lists_every_manifest_in_the_directory() -> None:
    listed = set(kustomization()["resources"])
    present = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_manifest_is_valid_against_the_kubernetes_schema(name: str) -> None:
    kubernetes_validate.validate(DOCS[name], KUBE_VERSION, strict=True)


def test_an_invalid_manifest_is_caught() -> None:
    broken = yaml.safe_load((BASE / "controller-service.yaml").read_text())
    broken["spec"]["ports"][0]["port"] = "eighty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in DOCS.items():
        if doc["kind"] == "Deployment":
            yield name, doc["spec"]["template"]["spec"]
        elif doc["kind"] == "CronJob":
            yield name, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


@pytest.mark.parametrize(("name", "spec"), list(pod_specs()), ids=[n for n, _ in pod_specs()])
def test_workloads_run_non_root_read_only_with_resources(name: str, spec: dict[str, Any]) -> None:
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for container in spec["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert {"requests", "limits"} <= set(container["resources"])


def test_long_running_workloads_have_probes() -> None:
    for name, doc in by_kind("Deployment").items():
        for container in doc["spec"]["template"]["spec"]["containers"]:
            assert "livenessProbe" in container and "readinessProbe" in container, name


def test_the_controller_config_and_inputs_in_the_configmap_parse(tmp_path: Path) -> None:
    files = by_kind("ConfigMap")["lorafleet-inputs"]["data"]
    for file_name, text in files.items():
        (tmp_path / file_name).write_text(text)
    config = load_controller_config(tmp_path / "controller.yaml")
    fleet = load_fleet(config.fleet)
    assert config.catalog is not None
    catalog = load_catalog(config.catalog, fleet=fleet)
    assert config.pipelines is not None
    load_pipelines(config.pipelines, catalog=catalog)
    assert config.kubernetes is not None
    deployment = by_kind("Deployment")["lorafleet-controller"]
    mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    secret_dir = next(m["mountPath"] for m in mounts if m["name"] == "webhook-secret")
    assert str(config.webhook.secret_file).startswith(secret_dir)


# --- least privilege: the Roles grant exactly what the code asks the API for ------------


def granted(role: str) -> set[tuple[str, str, str | None]]:
    """(resource, verb, name or None for any) the Role allows."""
    out = set()
    for rule in by_kind("Role")[role]["rules"]:
        for resource in rule["resources"]:
            for verb in rule["verbs"]:
                for name in rule.get("resourceNames", [None]):
                    out.add((resource, verb, name))
    return out


_PATH = re.compile(r"/namespaces/[^/]+/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?$")
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def used(requests: list[tuple[str, str]]) -> set[tuple[str, str, str | None]]:
    out = set()
    for method, path in requests:
        match = _PATH.search(path)
        assert match is not None, path
        resource, name = match["resource"], match["name"]
        verb = _VERBS.get(method) or ("get" if name else "list")
        out.add((resource, verb, None if verb in {"create", "list"} else name))
    return out


def allowed(request: tuple[str, str, str | None], rules: set[tuple[str, str, str | None]]) -> bool:
    resource, verb, name = request
    return (resource, verb, None) in rules or (name is not None and request in rules)


def test_the_controller_role_grants_exactly_what_the_controller_uses() -> None:
    fake = FakeApiServer().start()
    api = connect(host=fake.url)
    try:
        pod = make_pod("pod-0")
        pod["metadata"]["namespace"] = "lorafleet"
        fake.put("pods", pod)
        target = KubeTarget(namespace="lorafleet")
        clock = FakeClock()
        elector = LeaderElector(
            KubeLeaseStore(api, target=target),
            identity="c",
            duration_s=15,
            renew_deadline_s=10,
            clock=clock,
            wall=clock.wall,
        )
        elector.tick()
        clock.advance(5)
        elector.tick()
        KubePods(api, target=target).list_pods()
        for plan_id in ("p1", "p2"):
            KubeHotSets(api, target=target).publish_hot_sets(
                {PodId("pod-0"): (AdapterId("a"),)}, plan_id=plan_id
            )
        plans, state = KubePlanStore(api, target=target), KubeStateStore(api, target=target)
        for plan_id in ("p1", "p2"):
            plans.publish(make_plan(plan_id=plan_id))
            state.save(StoredState(plan_json="{}", ledger_json="{}"))
        state.load()
        plans.rollback()
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
        fake.stop()
    rules = granted("lorafleet-controller")
    requests = used(fake.requests)
    assert all(allowed(r, rules) for r in requests), requests
    assert {(r, v) for r, v, _ in rules} == {(r, v) for r, v, _ in requests}


def test_the_router_role_grants_exactly_what_the_router_uses() -> None:
    fake = FakeApiServer().start()
    api = connect(host=fake.url)
    try:
        target = KubeTarget(namespace="lorafleet", plan_configmap="lorafleet-plan")
        KubePods(api, target=target).list_pods()
        KubePlanStore(api, target=target).current()
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
        fake.stop()
    rules = granted("lorafleet-router")
    requests = used(fake.requests)
    assert all(allowed(r, rules) for r in requests), requests
    assert {(r, v) for r, v, _ in rules} == {(r, v) for r, v, _ in requests}


def test_the_controller_patches_no_pod() -> None:
    rules = granted("lorafleet-controller")
    assert {(r, v) for r, v, _ in rules if r == "pods"} == {("pods", "list")}


# --- the network, disruptions and readiness -------------------------------------------


def _policy(name: str) -> dict[str, Any]:
    spec = by_kind("NetworkPolicy")[name]["spec"]
    assert isinstance(spec, dict)
    return spec


def _allowed_namespaces(name: str) -> list[dict[str, str]]:
    (rule,) = _policy(name)["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    return [peer["namespaceSelector"]["matchLabels"] for peer in rule["from"]]


PROMETHEUS = {"kubernetes.io/metadata.name": "monitoring"}


def test_network_policies_let_in_only_clients_senders_and_prometheus() -> None:
    deny = _policy("lorafleet-default-deny")
    assert deny["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "lorafleet"}
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    assert _allowed_namespaces("lorafleet-router") == [
        {"lorafleet.io/router-client": "true"},
        PROMETHEUS,
    ]
    assert _allowed_namespaces("lorafleet-controller") == [
        {"lorafleet.io/webhook-sender": "true"},
        PROMETHEUS,
    ]
    for name, component in (("lorafleet-router", "router"), ("lorafleet-controller", "controller")):
        labels = by_kind("Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        selector = _policy(name)["podSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == component
        assert selector.items() <= labels.items()


def test_the_router_survives_a_drain_on_two_nodes() -> None:
    router = by_kind("Deployment")["lorafleet-router"]["spec"]
    labels = router["template"]["metadata"]["labels"]
    budget = by_kind("PodDisruptionBudget")["lorafleet-router"]["spec"]
    assert budget["minAvailable"] == 1 and budget["minAvailable"] < router["replicas"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    (term,) = router["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()


def test_the_controller_is_ready_only_as_leader_and_recreated_on_updates() -> None:
    deployment = by_kind("Deployment")["lorafleet-controller"]["spec"]
    (container,) = deployment["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # a standby is never ready: a rolling update would wait for it forever
    assert deployment["strategy"] == {"type": "Recreate"}


def test_the_shipped_placeholder_secret_is_refused(tmp_path: Path) -> None:
    from placement.controller.config import WebhookConfig, read_secret
    from placement.errors import InputError

    shipped = by_kind("Secret")["lorafleet-webhook"]["stringData"]["webhook-secret"]
    (tmp_path / "webhook-secret").write_text(shipped)
    with pytest.raises(InputError, match="placeholder"):
        read_secret(WebhookConfig(secret_file=tmp_path / "webhook-secret"), {})


# --- the image ---------------------------------------------------------------------------


def test_the_dockerfile_is_pinned_non_root_and_runs_the_console_script() -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    bases = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert bases and all(re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", b) for b in bases)
    user = next(line for line in lines if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in {"0", "root"}
    assert 'ENTRYPOINT ["lorafleet"]' in lines
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"lorafleet": "placement.cli:main"}
