"""The Kubernetes adapters against odd and malformed API answers, through the official
client over a real socket (``tests.pods.wire_server`` for raw answers, the fake API
server of ``tests.controller`` where state matters).

Whatever the API server (or a proxy in front of it) answers, a call ends in a
``KubeError`` naming the call and what was wrong (retryable for 5xx and transport
failures), never a raw client, JSON or key error; a watch event the client cannot
read is named, and a line that is not JSON ends nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from placement.adapters.kube import (
    KubeConfigMapKey,
    KubeLeaseStore,
    KubePlanStore,
    KubePods,
    KubeTarget,
    connect,
)
from placement.controller.live_ports import ConfigMapCatalog
from placement.errors import InputError, KubeError, PlanError, RetryableKubeError
from placement.settings import InputSettings
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.factories import fleet, pool
from tests.pods.wire_server import Answer, WireServer, text

TARGET = KubeTarget(namespace="lf", request_timeout_s=0.5)
PODS = "GET /api/v1/namespaces/lf/pods"
PLAN = "GET /api/v1/namespaces/lf/configmaps/lorafleet-plan"
LEASE = "GET /apis/coordination.k8s.io/v1/namespaces/lf/leases/lorafleet-controller"
LISTED = "list pods 'app.kubernetes.io/component=lora-server'"
WATCHED = "watch pods 'app.kubernetes.io/component=lora-server'"


def answer_json(status: int, body: object, **kw: object) -> Answer:
    return Answer(status=status, body=json.dumps(body).encode(), **kw)  # type: ignore[arg-type]


def status(code: int, reason: str, message: str) -> Answer:
    body = {"kind": "Status", "status": "Failure", "reason": reason, "message": message}
    return answer_json(code, {**body, "code": code})


def events(*lines: object) -> Answer:
    raw = b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )
    return Answer(body=raw)


def nameless_pod() -> dict[str, object]:
    pod = make_pod("x", ip="10.0.0.9")
    del pod["metadata"]["name"]
    return pod


@pytest.fixture
def wire() -> Iterator[tuple[WireServer, client.ApiClient]]:
    server = WireServer().start()
    api = connect(host=server.url)
    yield server, api
    api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
    server.stop()


def calls(api: client.ApiClient) -> dict[str, Callable[[], object]]:
    return {
        PODS: lambda: KubePods(api, target=TARGET).list_pods(),
        PLAN: lambda: KubePlanStore(api, target=TARGET).current(),
        LEASE: lambda: KubeLeaseStore(api, target=TARGET).read(),
    }


ANSWERS = [
    pytest.param(
        PODS,
        answer_json(200, {"kind": "PodList", "metadata": {}}),
        KubeError,
        f"{LISTED}: malformed answer: ValidationError",
        id="list-without-items",
    ),
    pytest.param(
        PODS,
        text(200, "<html><title>Sign in</title></html>", content_type="text/html"),
        KubeError,
        f"{LISTED}: malformed answer",
        id="list-200-html-page",
    ),
    pytest.param(
        PODS,
        status(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:lf:x" cannot'),
        KubeError,
        f'{LISTED}: HTTP 403: pods is forbidden: User "system:serviceaccount:lf:x" cannot',
        id="list-403",
    ),
    pytest.param(
        PODS,
        text(500, "upstream connect error or disconnect/reset before headers"),
        RetryableKubeError,
        f"{LISTED}: HTTP 500: Internal Server Error: upstream connect error or disconnect",
        id="list-500-plain-text",
    ),
    pytest.param(
        PODS,
        Answer(body=json.dumps({"items": [make_pod("a")] * 20}).encode(), cut_after=30),
        RetryableKubeError,
        f"{LISTED}: ProtocolError",
        id="list-reset-mid-body",
    ),
    pytest.param(
        PODS,
        Answer(body=b'{"items": []}', delay_s=1.0),
        RetryableKubeError,
        f"{LISTED}: ReadTimeoutError",
        id="list-slow",
    ),
    pytest.param(
        PLAN,
        answer_json(200, {"kind": "ConfigMap", "metadata": {"name": "p"}, "data": ["a"]}),
        KubeError,
        "read configmap lorafleet-plan: malformed answer: ValidationError",
        id="configmap-data-not-a-map",
    ),
    pytest.param(
        PLAN,
        status(403, "Forbidden", "configmaps is forbidden"),
        KubeError,
        "read configmap lorafleet-plan: HTTP 403: configmaps is forbidden",
        id="configmap-403",
    ),
    pytest.param(
        LEASE,
        answer_json(200, {"kind": "Lease", "metadata": {}, "spec": {"renewTime": "yesterday"}}),
        KubeError,
        "read lease lorafleet-controller: malformed answer: ValidationError",
        id="lease-bad-time",
    ),
]


@pytest.mark.parametrize(("key", "answer", "kind", "said"), ANSWERS)
def test_an_answer_that_cannot_be_used_is_a_named_kube_error(
    wire: tuple[WireServer, client.ApiClient],
    key: str,
    answer: Answer,
    kind: type[KubeError],
    said: str,
) -> None:
    server, api = wire
    server.answers[key] = answer
    with pytest.raises(KubeError) as raised:
        calls(api)[key]()
    assert type(raised.value) is kind
    assert str(raised.value).startswith(said)


def test_a_listed_pod_without_a_name_is_left_out_said_and_the_rest_kept(
    wire: tuple[WireServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    server, api = wire
    server.answers[PODS] = answer_json(200, {"items": [nameless_pod(), make_pod("pod-b")]})
    assert [pod.name for pod in KubePods(api, target=TARGET).list_pods()] == ["pod-b"]
    assert any("no metadata.name (pod IP 10.0.0.9)" in r.getMessage() for r in caplog.records)


def test_a_plan_that_is_not_json_names_the_configmap_and_key(
    wire: tuple[WireServer, client.ApiClient],
) -> None:
    server, api = wire
    data = {"plan.json": "{not json"}
    server.answers[PLAN] = answer_json(200, {"kind": "ConfigMap", "metadata": {}, "data": data})
    with pytest.raises(PlanError, match=r"^configmap lorafleet-plan/plan.json: not valid JSON"):
        KubePlanStore(api, target=TARGET).current()


# --- watch -------------------------------------------------------------------------------

GONE = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
WATCH_ERRORS = [
    pytest.param(
        status(410, "Expired", "too old resource version: 1 (2)"),
        f"{WATCHED}: HTTP 410: too old resource version",
        id="410-answer",
    ),
    pytest.param(
        events({"type": "ERROR", "object": GONE}),
        f"{WATCHED}: HTTP 410: Expired: too old resource version",
        id="410-error-event",
    ),
    pytest.param(
        events({"type": "ERROR", "object": {"kind": "Status"}}),
        f"{WATCHED}: malformed event: KeyError",
        id="error-event-without-code",
    ),
    pytest.param(
        events({"object": make_pod("a")}), f"{WATCHED}: malformed event: KeyError", id="no-type"
    ),
    pytest.param(
        events({"type": "ADDED"}), f"{WATCHED}: malformed event: KeyError", id="no-object"
    ),
    pytest.param(events([1, 2]), f"{WATCHED}: malformed event: TypeError", id="array-event"),
    pytest.param(
        events({"type": "ADDED", "object": "pod"}),
        f"{WATCHED}: malformed answer: ValidationError",
        id="object-not-a-pod",
    ),
]


@pytest.mark.parametrize(("answer", "said"), WATCH_ERRORS)
def test_a_watch_answer_that_cannot_be_read_is_a_named_kube_error(
    wire: tuple[WireServer, client.ApiClient], answer: Answer, said: str
) -> None:
    server, api = wire
    server.answers[PODS] = answer
    with pytest.raises(KubeError) as raised:
        list(KubePods(api, target=TARGET).watch_pods(timeout_s=1))
    assert str(raised.value).startswith(said)


def test_a_watch_line_that_is_not_json_is_skipped_and_the_watch_goes_on(
    wire: tuple[WireServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    # The client yields None for such a line: read as the end, it hid every later event.
    server, api = wire
    later = [{"type": "ADDED", "object": make_pod(name)} for name in ("pod-a", "pod-b")]
    server.answers[PODS] = events(later[0], b"<html>proxy</html>", later[1])
    seen = list(KubePods(api, target=TARGET).watch_pods(timeout_s=1))
    assert [event.pod.name for event in seen] == ["pod-a", "pod-b"]
    assert any("not JSON was left out" in r.getMessage() for r in caplog.records)


# --- the catalog in a ConfigMap ----------------------------------------------------------

ENTRY = (
    "- name: a0\n  base_model: llama-3.1-8b\n  rank: 8\n  size_bytes: 1000000\n"
    "  source: s3://catalogued/a0\n"
)


@pytest.mark.parametrize(
    "broken",
    ["adapters: [unclosed\n", "adapters:\n  - name: a0\n    rank: 8\n  bad indent\n", "- 1\n- 2\n"],
    ids=["unclosed-flow", "bad-indent", "a-list-not-a-map"],
)
def test_a_catalog_configmap_with_invalid_yaml_is_refused_naming_it(broken: str) -> None:
    server = FakeApiServer().start()
    api = connect(host=server.url)
    try:
        cm = {"metadata": {"name": "inputs"}, "data": {"catalog.yaml": "adapters:\n" + ENTRY}}
        server.put("configmaps", cm)
        key = KubeConfigMapKey(api, target=TARGET, name="inputs", key="catalog.yaml")
        catalog = ConfigMapCatalog(key, fleet=fleet(pool("p", 1)), rules=InputSettings())
        first = catalog.poll()
        assert first is not None and {a.name for a in first.adapters} == {"a0"}
        server.put("configmaps", {**cm, "data": {"catalog.yaml": broken}})
        for _ in range(2):  # refused again until it changes: never taken as "no adapters"
            with pytest.raises(InputError, match=r"configmap lf/inputs key catalog\.yaml"):
                catalog.poll()
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
        server.stop()


@pytest.fixture(autouse=True)
def _adapters_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="placement.adapters.kube")
