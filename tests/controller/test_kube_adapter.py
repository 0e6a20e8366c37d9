"""The Kubernetes adapter against a fake API server, through the official client."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import pytest
from kubernetes import client

from placement.adapters.kube import (
    KubeHotSets,
    KubeLeaseStore,
    KubePlanStore,
    KubePods,
    KubeStateStore,
    KubeTarget,
    connect,
)
from placement.domain import AdapterId, PodId
from placement.errors import (
    InputError,
    KubeConflictError,
    KubeError,
    PlanError,
    RetryableKubeError,
)
from placement.ports import (
    PLAN_ID_ANNOTATION,
    LeaseRecord,
    PodEvent,
    PodEventKind,
    StoredState,
)
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.factories import T0, make_plan

# --- discovery --------------------------------------------------------------------


def test_list_returns_ready_selected_pods_with_ip_port_and_pool(
    fake_api: FakeApiServer, kube_api: client.ApiClient, target: KubeTarget
) -> None:
    fake_api.put("pods", make_pod("pod-b", ip="10.0.0.2", pool="llama", port=9000))
    fake_api.put("pods", make_pod("pod-a", ip="10.0.0.1", pool="qwen"))
    fake_api.put("pods", make_pod("pod-starting", ready=False))
    fake_api.put("pods", make_pod("pod-no-pool", pool=None))
    other = make_pod("other", labels={"app.kubernetes.io/component": "router"})
    fake_api.put("pods", other)

    pods = KubePods(kube_api, target=target).list_pods()

    assert [(p.name, p.pool, p.url) for p in pods] == [
        ("pod-a", "qwen", "http://10.0.0.1:8000"),
        ("pod-b", "llama", "http://10.0.0.2:9000"),
    ]


def test_default_pool_keeps_pods_without_the_label(
    fake_api: FakeApiServer, kube_api: client.ApiClient
) -> None:
    fake_api.put("pods", make_pod("pod-no-pool", pool=None))
    target = KubeTarget(namespace="lf", default_pool="general")
    assert [p.pool for p in KubePods(kube_api, target=target).list_pods()] == ["general"]


def test_watch_reports_current_pods_then_changes(
    fake_api: FakeApiServer, kube_api: client.ApiClient, target: KubeTarget
) -> None:
    fake_api.put("pods", make_pod("pod-0"))
    fake_api.put("pods", make_pod("pod-1", ip="10.0.0.9"))
    seen: queue.Queue[PodEvent] = queue.Queue()

    def consume() -> None:
        for event in KubePods(kube_api, target=target).watch_pods(timeout_s=30):
            seen.put(event)

    thread = threading.Thread(target=consume)
    thread.start()
    initial = [seen.get(timeout=10) for _ in range(2)]
    fake_api.put("pods", make_pod("pod-0", ready=False))
    fake_api.delete("pods", "pod-1")
    changes = [seen.get(timeout=10) for _ in range(2)]
    fake_api.end_watches()
    thread.join(timeout=10)

    assert [(e.kind, e.pod.name) for e in initial] == [
        (PodEventKind.ADDED, "pod-0"),
        (PodEventKind.ADDED, "pod-1"),
    ]
    assert [(e.kind, e.pod.name, e.pod.ready) for e in changes] == [
        (PodEventKind.MODIFIED, "pod-0", False),
        (PodEventKind.DELETED, "pod-1", True),
    ]


# --- hot sets ----------------------------------------------------------------------


def test_hot_sets_go_to_one_configmap_and_no_pod_is_patched(
    fake_api: FakeApiServer, kube_api: client.ApiClient, target: KubeTarget
) -> None:
    fake_api.put("pods", make_pod("pod-0"))
    board = KubeHotSets(kube_api, target=target)
    names = tuple(AdapterId(f"adapter-with-a-long-name-{i:02d}") for i in range(8))

    board.publish_hot_sets({PodId("pod-0"): names, PodId("pod-1"): ()}, plan_id="p1")
    first = fake_api.get("configmaps", "lorafleet-hot-sets")
    board.publish_hot_sets({PodId("pod-0"): names[:2]}, plan_id="p2")
    second = fake_api.get("configmaps", "lorafleet-hot-sets")

    assert first is not None and second is not None
    count, digest, listed = first["data"]["pod-0"].split(" ")
    assert (count, listed) == ("8", ",".join(names))
    assert first["data"]["pod-1"] == "0 e3b0c44298fc"  # the digest of the empty set
    assert first["metadata"]["annotations"][PLAN_ID_ANNOTATION] == "p1"
    assert set(second["data"]) == {"pod-0"}
    assert second["data"]["pod-0"].split(" ")[1] != digest
    assert second["metadata"]["annotations"][PLAN_ID_ANNOTATION] == "p2"
    assert not [r for r in fake_api.requests if r[0] == "PATCH"]
    assert fake_api.get("pods", "pod-0") == fake_api.objects[("pods", "lf", "pod-0")]


# --- plan and state config maps ---------------------------------------------------


def test_publish_creates_then_replaces_keeping_previous(
    fake_api: FakeApiServer, kube_api: client.ApiClient, target: KubeTarget
) -> None:
    store = KubePlanStore(kube_api, target=target)
    assert store.current() is None
    store.publish(make_plan(plan_id="p1"))
    store.publish(make_plan(plan_id="p2"))

    assert store.current() == make_plan(plan_id="p2")
    assert store.previous() == make_plan(plan_id="p1")
    assert ("POST", "/api/v1/namespaces/lf/configmaps") in fake_api.requests
    assert ("PUT", "/api/v1/namespaces/lf/configmaps/lorafleet-plan") in fake_api.requests


def test_rollback_swaps_current_and_previous(
    kube_api: client.ApiClient, target: KubeTarget
) -> None:
    store = KubePlanStore(kube_api, target=target)
    store.publish(make_plan(plan_id="p1"))
    with pytest.raises(PlanError, match="no previous plan"):
        store.rollback()
    store.publish(make_plan(plan_id="p2"))

    assert store.rollback().id == "p1"
    assert (store.current(), store.previous()) == (make_plan(plan_id="p1"), make_plan(plan_id="p2"))


@pytest.mark.parametrize("previous", ['{"schema_version": 1, "id": ', "[]", "{}"])
def test_a_previous_plan_that_is_no_plan_is_a_bad_input_and_nothing_is_swapped(
    kube_api: client.ApiClient, target: KubeTarget, previous: str
) -> None:
    """As a state directory's previous.json is (exit 2): it was a PlanError, exit 1."""
    store = KubePlanStore(kube_api, target=target)
    store.publish(make_plan(plan_id="p1"))
    core = client.CoreV1Api(kube_api)
    stored = core.read_namespaced_config_map("lorafleet-plan", "lf")
    stored.data = {**(stored.data or {}), "previous.json": previous}
    core.replace_namespaced_config_map("lorafleet-plan", "lf", stored)
    with pytest.raises(InputError) as raised:
        store.rollback()
    assert raised.value.problems[0].source == "configmap lorafleet-plan/previous.json"
    after = core.read_namespaced_config_map("lorafleet-plan", "lf").data or {}
    assert (after.get("previous.json"), store.current()) == (previous, make_plan(plan_id="p1"))


def test_concurrent_replace_of_a_configmap_is_a_conflict(
    fake_api: FakeApiServer, kube_api: client.ApiClient, target: KubeTarget
) -> None:
    store = KubePlanStore(kube_api, target=target)
    store.publish(make_plan(plan_id="p1"))
    core = client.CoreV1Api(kube_api)
    stale = core.read_namespaced_config_map("lorafleet-plan", "lf")
    store.publish(make_plan(plan_id="p2"))
    stale.data = {"plan.json": "{}"}

    with pytest.raises(client.ApiException) as raised:
        core.replace_namespaced_config_map("lorafleet-plan", "lf", stale)
    assert raised.value.status == 409
    assert store.current() == make_plan(plan_id="p2")


def test_state_store_round_trips(kube_api: client.ApiClient, target: KubeTarget) -> None:
    store = KubeStateStore(kube_api, target=target)
    assert store.load() == StoredState(plan_json=None, ledger_json=None)
    store.save(StoredState(plan_json="{}", ledger_json='{"pods": {}}'))
    store.save(StoredState(plan_json='{"id": 2}', ledger_json='{"pods": {}}'))
    assert store.load() == StoredState(plan_json='{"id": 2}', ledger_json='{"pods": {}}')


def test_a_plan_too_large_for_a_configmap_is_refused(
    kube_api: client.ApiClient, target: KubeTarget
) -> None:
    big = make_plan(plan_id="big", hot={f"pod-{i:05d}": ("a",) * 40 for i in range(1500)})
    with pytest.raises(KubeError, match="exceed"):
        KubePlanStore(kube_api, target=target).publish(big)


# --- errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "kind", "status", "error"),
    [
        pytest.param("GET", "pods", 500, RetryableKubeError, id="list-500"),
        pytest.param("GET", "pods", 503, RetryableKubeError, id="list-503"),
        pytest.param("GET", "pods", 403, KubeError, id="list-403"),
        pytest.param("GET", "configmaps", 500, RetryableKubeError, id="read-cm-500"),
        pytest.param("PUT", "configmaps", 409, KubeConflictError, id="replace-cm-409"),
        pytest.param("GET", "leases", 500, RetryableKubeError, id="read-lease-500"),
    ],
)
def test_api_failures_become_kube_errors(
    fake_api: FakeApiServer,
    kube_api: client.ApiClient,
    target: KubeTarget,
    method: str,
    kind: str,
    status: int,
    error: type[KubeError],
) -> None:
    plans = KubePlanStore(kube_api, target=target)
    plans.publish(make_plan(plan_id="p1"))
    fake_api.inject(method, kind, status)
    actions: dict[str, Callable[[], object]] = {
        "pods": lambda: KubePods(kube_api, target=target).list_pods(),
        "configmaps": lambda: plans.publish(make_plan(plan_id="p2")),
        "leases": lambda: KubeLeaseStore(kube_api, target=target).read(),
    }
    with pytest.raises(error) as raised:
        actions[kind]()
    assert type(raised.value) is error
    assert raised.value.status == status
    actions[kind]()  # the fault was one-off: the next call goes through


def test_an_unreachable_server_is_retryable(target: KubeTarget) -> None:
    server = FakeApiServer()
    url = server.url
    server.stop()
    api = connect(host=url)
    try:
        with pytest.raises(RetryableKubeError):
            KubePods(api, target=target).list_pods()
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated


# --- lease ----------------------------------------------------------------------------


def test_lease_create_conflicts_when_it_exists_and_stale_replace_conflicts(
    kube_api: client.ApiClient, target: KubeTarget, clock: object
) -> None:
    store = KubeLeaseStore(kube_api, target=target)
    assert store.read() is None
    record = LeaseRecord(holder="a", duration_s=15, acquired_at=T0, renewed_at=T0)
    created = store.create(record)
    assert created.version is not None
    with pytest.raises(KubeConflictError):
        store.create(record)

    renewed = store.replace(created)
    with pytest.raises(KubeConflictError):
        store.replace(created)  # stale version
    read = store.read()
    assert read is not None
    assert (read.holder, read.duration_s, read.renewed_at) == ("a", 15, T0)
    assert read.version == renewed.version
