"""deploy/gateway: the router as an InferencePool's endpoint picker, checked offline.

The Kubernetes objects (Service, NetworkPolicy, the patched router Deployment) are
validated against the Kubernetes schemas, as deploy/base's are. The InferencePool and
the HTTPRoute are custom resources, whose CRDs are not vendored here: each is checked
against a JSON schema written for this test from the CRDs' published types (the
Inference Extension's ``api/v1`` InferencePool: ``selector.matchLabels``,
``targetPorts`` 1 to 8 unique numbers, ``endpointPickerRef`` with ``name``, a
``port.number`` required for a Service (the CRD's CEL rule), ``failureMode``
FailOpen|FailClose; Gateway API v1 HTTPRoute's ``parentRefs`` and ``backendRefs``), with
no unknown field allowed, so a misspelt field fails as the API server would refuse it.
Then the references between them: the pool names the picker Service and its port, the
Service reaches the router's ext_proc port, the router is started with that port, and
the pool selects the pods the router routes to on the port the router reaches them at.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs: types-jsonschema is not installed
import kubernetes_validate
import pytest
import yaml

from placement.adapters.kube import KubeTarget

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "deploy" / "gateway"
BASE = REPO / "deploy" / "base"
KUBE_VERSION = "1.30.0"

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {
    "type": "object",
    "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
    "required": ["number"],
    "additionalProperties": False,
}
_METADATA = {
    "type": "object",
    "properties": {"name": _NAME, "namespace": _NAME, "labels": {"type": "object"}},
    "required": ["name"],
}
INFERENCE_POOL = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string", "maxLength": 63},
                        }
                    },
                    "required": ["matchLabels"],
                    "additionalProperties": False,
                },
                "targetPorts": {"type": "array", "items": _PORT, "minItems": 1, "maxItems": 8},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": {
                    "type": "object",
                    "properties": {
                        "group": {"type": "string"},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                        "name": _NAME,
                        "port": _PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "required": ["selector", "targetPorts"],
            "additionalProperties": False,
        },
    },
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
}
_BACKEND_REF = {
    "type": "object",
    "properties": {
        "group": {"type": "string"},
        "kind": {"type": "string"},
        "name": _NAME,
        "namespace": _NAME,
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "weight": {"type": "integer", "minimum": 0},
    },
    "required": ["name"],
    "additionalProperties": False,
}
HTTP_ROUTE = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "properties": {
                "parentRefs": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                "hostnames": {"type": "array", "items": {"type": "string"}},
                "rules": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "matches": {"type": "array", "items": {"type": "object"}},
                            "backendRefs": {"type": "array", "items": _BACKEND_REF},
                            "timeouts": {
                                "type": "object",
                                "properties": {
                                    "request": {"type": "string"},
                                    "backendRequest": {"type": "string"},
                                },
                                "additionalProperties": False,
                            },
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["parentRefs"],
            "additionalProperties": False,
        },
    },
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
}


def kustomization() -> dict[str, Any]:
    loaded = yaml.safe_load((GATEWAY / "kustomization.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def documents() -> Iterator[dict[str, Any]]:
    for name in kustomization()["resources"]:
        if not name.startswith(".."):
            yield from (doc for doc in yaml.safe_load_all((GATEWAY / name).read_text()) if doc)


DOCS = {f"{doc['kind']}/{doc['metadata']['name']}": doc for doc in documents()}


def the(kind: str) -> dict[str, Any]:
    [doc] = [doc for doc in DOCS.values() if doc["kind"] == kind]
    return doc


def pool_problems(pool: dict[str, Any]) -> list[str]:
    """The schema's findings, and the CRD's CEL rules."""
    problems = [
        error.message for error in jsonschema.Draft7Validator(INFERENCE_POOL).iter_errors(pool)
    ]
    spec = pool.get("spec", {})
    picker = spec.get("endpointPickerRef", {})
    if picker.get("kind", "Service") == "Service" and "port" not in picker:
        problems.append("port is required when kind is 'Service' or unspecified")
    numbers = [port.get("number") for port in spec.get("targetPorts", [])]
    if len(numbers) != len(set(numbers)):
        problems.append("port number must be unique")
    return problems


def patched_router() -> dict[str, Any]:
    """deploy/base's router Deployment with the JSON patch of the kustomization applied
    (its ``add`` operations, which are all it uses)."""
    deployment = copy.deepcopy(yaml.safe_load((BASE / "router-deployment.yaml").read_text()))
    assert isinstance(deployment, dict)
    [patch] = kustomization()["patches"]
    assert patch["target"]["name"] == deployment["metadata"]["name"]
    for operation in yaml.safe_load((GATEWAY / patch["path"]).read_text()):
        assert operation["op"] == "add"
        *parents, last = operation["path"].strip("/").split("/")
        node: Any = deployment
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if last == "-":
            node.append(operation["value"])
        else:
            node[last] = operation["value"]
    return deployment


def test_the_kustomization_lists_every_manifest_and_the_base() -> None:
    listed = set(kustomization()["resources"]) | {p["path"] for p in kustomization()["patches"]}
    present = {p.name for p in GATEWAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present | {"../base"}


#: Custom resources: checked against their CRDs' schemas below.
CUSTOM = frozenset({"InferencePool", "HTTPRoute"})


@pytest.mark.parametrize("name", sorted(n for n, d in DOCS.items() if d["kind"] not in CUSTOM))
def test_the_kubernetes_objects_are_valid(name: str) -> None:
    kubernetes_validate.validate(DOCS[name], KUBE_VERSION, strict=True)


def test_the_patched_router_deployment_is_valid() -> None:
    kubernetes_validate.validate(patched_router(), KUBE_VERSION, strict=True)


def test_the_inference_pool_matches_its_crd() -> None:
    assert pool_problems(the("InferencePool")) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s["endpointPickerRef"].pop("port"), "port is required"),
        (lambda s: s["endpointPickerRef"].update(portNumber=9002), "portNumber"),
        (lambda s: s.update(targetPorts=[]), "[] should be non-empty"),
        (lambda s: s["endpointPickerRef"].update(failureMode="Open"), "'Open' is not one of"),
        (lambda s: s.update(selector={"app": "x"}), "'matchLabels' is a required property"),
    ],
    ids=["no-port", "old-field", "no-target-port", "bad-failure-mode", "selector-shape"],
)
def test_a_broken_inference_pool_is_caught(change: Any, problem: str) -> None:
    pool = copy.deepcopy(the("InferencePool"))
    change(pool["spec"])
    assert any(problem in found for found in pool_problems(pool)), pool_problems(pool)


def test_the_http_route_matches_its_crd_and_sends_to_the_pool() -> None:
    route = the("HTTPRoute")
    jsonschema.validate(route, HTTP_ROUTE)
    pool = the("InferencePool")
    [rule] = route["spec"]["rules"]
    [backend] = rule["backendRefs"]
    assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io", "InferencePool")
    assert backend["name"] == pool["metadata"]["name"]


def test_the_pool_points_at_the_routers_picker_port() -> None:
    picker = the("InferencePool")["spec"]["endpointPickerRef"]
    service = DOCS[f"Service/{picker['name']}"]
    [port] = [p for p in service["spec"]["ports"] if p["port"] == picker["port"]["number"]]
    router = patched_router()
    template = router["spec"]["template"]
    assert service["spec"]["selector"] == template["metadata"]["labels"]
    [container] = template["spec"]["containers"]
    [target] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    args = container["args"]
    address = args[args.index("--endpoint-picker") + 1]
    assert address.rpartition(":")[2] == str(target["containerPort"])


def test_the_pool_is_the_pods_the_router_routes_to_on_their_port() -> None:
    """The picker answers ``podIP:port`` of the pods its --selector finds; the gateway
    accepts only the pool's endpoints."""
    spec = the("InferencePool")["spec"]
    args = patched_router()["spec"]["template"]["spec"]["containers"][0]["args"]
    selector = args[args.index("--selector") + 1]
    key, _, value = selector.partition("=")
    assert spec["selector"]["matchLabels"] == {key: value}
    assert spec["targetPorts"] == [{"number": KubeTarget(namespace="x").default_port}]


def test_the_gateway_namespace_may_reach_the_picker_port_only() -> None:
    policy = the("NetworkPolicy")
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == ["ext-proc"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"lorafleet.io/gateway": "true"}}}
    ]
