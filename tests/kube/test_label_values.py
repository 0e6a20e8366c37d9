"""Labels and annotations that are there but cannot be read get a named answer, never a
default: through the official client against the fake API server of ``tests.controller``
(or, for an answer it would not give, ``tests.pods.wire_server``).

The router's pods from a label selector: a slot-count or served-model label that cannot
be read leaves the pod out, said once (the pod, each bad label, its value and what is
accepted); the rest of the discovery goes on. An empty pool label leaves the pod out of
the discovery. A leader-term annotation that holds no term refuses the write, naming
it; a ConfigMap read without a resourceVersion is named.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest
from kubernetes import client

from placement.adapters.kube import KubeConfigMapKey, KubePlanStore, KubePods, KubeTarget, connect
from placement.errors import KubeError
from placement.plan import plan_to_json
from placement.router.kube_sources import DiscoveryPodSource
from placement.router.state import Upstream
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.factories import fleet, make_plan, pod, pool
from tests.pods.wire_server import Answer, WireServer

TARGET = KubeTarget(namespace="lf", request_timeout_s=2.0)
SLOTS = "lorafleet.io/max-loras"
CACHE = "lorafleet.io/max-cpu-loras"
SERVED = "lorafleet.io/served-model"
WHOLE = "a whole number of at least 1, in decimal digits"
REFUSE = (
    "vLLM refuses a --max-cpu-loras below --max-loras, SGLang a --max-loaded-loras below "
    "--max-loras-per-batch"
)


@pytest.fixture
def fake() -> Iterator[tuple[FakeApiServer, client.ApiClient]]:
    server = FakeApiServer().start()
    api = connect(host=server.url)
    yield server, api
    api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
    server.stop()


def _upstreams(source: DiscoveryPodSource) -> list[tuple[str, str, int, int]]:
    found: tuple[Upstream, ...] = asyncio.run(source.upstreams())
    return [(str(u.pod), u.served_model, u.max_loras, u.max_cpu_loras) for u in found]


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.name == "lorafleet.router"]
    caplog.clear()
    return said


def _not_a_count(label: str, value: str, accepted: str = WHOLE) -> str:
    return f"pod pod-a: label {label}: {value!r} is not a slot count (accepted: {accepted})"


FLOOR_4 = f"a whole number of at least 4, the pod's {SLOTS}, in decimal digits"

BAD = [
    pytest.param({SLOTS: "four"}, [_not_a_count(SLOTS, "four")], id="slots-a-word"),
    pytest.param({SLOTS: "-1"}, [_not_a_count(SLOTS, "-1")], id="slots-negative"),
    pytest.param({SLOTS: "0"}, [_not_a_count(SLOTS, "0")], id="slots-zero"),
    pytest.param({SLOTS: "1e3"}, [_not_a_count(SLOTS, "1e3")], id="slots-exponent"),
    pytest.param({SLOTS: "4.0"}, [_not_a_count(SLOTS, "4.0")], id="slots-a-point"),
    pytest.param({SLOTS: ""}, [_not_a_count(SLOTS, "")], id="slots-empty"),
    pytest.param({SLOTS: "\uff14"}, [_not_a_count(SLOTS, "\uff14")], id="slots-fullwidth-4"),
    pytest.param({CACHE: "0"}, [_not_a_count(CACHE, "0")], id="cache-zero"),
    pytest.param(
        {SLOTS: "4", CACHE: "2"},
        [f"pod pod-a: label {CACHE}: '2' is below {SLOTS}, 4: {REFUSE} (accepted: {FLOOR_4})"],
        id="cache-below-slots",
    ),
    pytest.param(
        {SLOTS: "4", CACHE: "sixteen"},
        [_not_a_count(CACHE, "sixteen", FLOOR_4)],
        id="cache-a-word",
    ),
    pytest.param(
        {SLOTS: "four", CACHE: "-2"},
        [_not_a_count(SLOTS, "four"), _not_a_count(CACHE, "-2")],
        id="both-bad-both-named",
    ),
    pytest.param(
        {SERVED: ""},
        [
            f"pod pod-a: label {SERVED}: '' names no model (accepted: the base model's name "
            "as the pod serves it)"
        ],
        id="served-model-empty",
    ),
    pytest.param(
        {"lorafleet.io/engine": "tgi", SLOTS: "0"},
        [
            "pod pod-a: label lorafleet.io/engine: 'tgi' is not an engine the router speaks "
            "(accepted: vllm, sglang)",
            _not_a_count(SLOTS, "0"),
        ],
        id="engine-and-slots-bad-both-named",
    ),
]

#: Pods whose labels read, discovered with each bad one: what the router takes them for.
GOOD: list[tuple[dict[str, str], tuple[str, int, int]]] = [
    ({}, ("llama", 1, 1)),  # no labels: the defaults
    ({SLOTS: "4"}, ("llama", 4, 4)),  # the host cache defaults to the GPU slots
    ({SLOTS: "4", CACHE: "4"}, ("llama", 4, 4)),
    ({SLOTS: "04", CACHE: "32"}, ("llama", 4, 32)),
    ({SLOTS: "8", CACHE: "16", SERVED: "meta-llama"}, ("meta-llama", 8, 16)),
]


@pytest.mark.parametrize(("labels", "problems"), BAD)
def test_a_pod_with_a_label_that_cannot_be_read_is_left_out_said_once_and_the_rest_kept(
    fake: tuple[FakeApiServer, client.ApiClient],
    caplog: pytest.LogCaptureFixture,
    labels: dict[str, str],
    problems: list[str],
) -> None:
    caplog.set_level(logging.WARNING, logger="lorafleet.router")
    server, api = fake
    server.put("pods", make_pod("pod-a", ip="10.0.0.1", labels=labels))
    for i, (good, _) in enumerate(GOOD, start=2):
        server.put("pods", make_pod(f"pod-{i}", ip=f"10.0.0.{i}", labels=good))
    source = DiscoveryPodSource(KubePods(api, target=TARGET))
    kept = [(f"pod-{i}", *read) for i, (_, read) in enumerate(GOOD, start=2)]
    assert _upstreams(source) == kept
    assert _said(caplog) == [f"selector: {'; '.join(problems)}; left out"]
    assert _upstreams(source) == kept  # the next poll: nothing said again
    assert _said(caplog) == []


def test_a_fixed_label_brings_the_pod_back_and_a_new_bad_value_is_said_again(
    fake: tuple[FakeApiServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lorafleet.router")
    server, api = fake
    source = DiscoveryPodSource(KubePods(api, target=TARGET))
    server.put("pods", make_pod("pod-a", labels={SLOTS: "four"}))
    assert _upstreams(source) == []
    assert _said(caplog) == [f"selector: {_not_a_count(SLOTS, 'four')}; left out"]
    server.put("pods", make_pod("pod-a", labels={SLOTS: "0"}))
    assert _upstreams(source) == []
    assert _said(caplog) == [f"selector: {_not_a_count(SLOTS, '0')}; left out"]
    server.put("pods", make_pod("pod-a", labels={SLOTS: "4"}))
    assert _upstreams(source) == [("pod-a", "llama", 4, 4)]
    assert _said(caplog) == []
    server.put("pods", make_pod("pod-a", labels={SLOTS: "0"}))
    assert _upstreams(source) == []
    assert _said(caplog) == [f"selector: {_not_a_count(SLOTS, '0')}; left out"]


def test_a_pod_the_fleet_file_names_takes_its_own_slot_counts_not_the_first_pods(
    fake: tuple[FakeApiServer, client.ApiClient],
) -> None:
    server, api = fake
    first, own = pod("vllm-0", pool="llama"), pod("vllm-1", pool="llama", max_loras=8)
    llama = replace(
        pool("llama", 0, served_model="meta-llama"), pods=(first, replace(own, max_cpu_loras=24))
    )
    for i, name in enumerate(("vllm-0", "vllm-1", "vllm-7")):
        # Labels a fleet file overrides: read neither as counts nor as problems.
        server.put("pods", make_pod(name, ip=f"10.0.0.{i}", labels={SLOTS: "four"}))
    source = DiscoveryPodSource(KubePods(api, target=TARGET), fleet=fleet(llama))
    assert _upstreams(source) == [
        ("vllm-0", "meta-llama", 4, 8),
        ("vllm-1", "meta-llama", 8, 24),
        ("vllm-7", "meta-llama", 4, 8),  # not in the file: its first pod's
    ]


# --- the pool label (placement.adapters.kube) ---------------------------------------------


def test_a_pod_with_an_empty_pool_label_is_left_out_not_put_in_the_default_pool(
    fake: tuple[FakeApiServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    server, api = fake
    server.put("pods", make_pod("pod-a", ip="10.0.0.1", pool=""))
    server.put("pods", make_pod("pod-b", ip="10.0.0.2", pool=None))
    server.put("pods", make_pod("pod-c", ip="10.0.0.3", pool="mistral"))
    target = replace(TARGET, default_pool="llama")
    found = [(str(p.name), str(p.pool)) for p in KubePods(api, target=target).list_pods()]
    assert found == [("pod-b", "llama"), ("pod-c", "mistral")]
    said = [r.getMessage() for r in caplog.records if r.name == "placement.adapters.kube"]
    assert said == ["pod pod-a: label lorafleet.io/pool is empty: it names no pool; left out"]


# --- the leader-term annotation and a ConfigMap's resourceVersion (kube_configmaps) ------

TERM = "lorafleet.io/leader-term"


def _plan_configmap(term: str) -> dict[str, object]:
    published = plan_to_json(make_plan(plan_id="published"))
    meta = {"name": "lorafleet-plan", "annotations": {TERM: term}}
    return {"metadata": meta, "data": {"plan.json": published}}


@pytest.mark.parametrize(
    "term", ["abc", "", "nan", "inf", "-inf"], ids=["a-word", "empty", "nan", "inf", "minus-inf"]
)
def test_a_leader_term_that_cannot_be_read_is_named_and_nothing_is_overwritten(
    fake: tuple[FakeApiServer, client.ApiClient], term: str
) -> None:
    server, api = fake
    server.put("configmaps", _plan_configmap(term))
    store = KubePlanStore(api, target=TARGET, term=lambda: 1000.0)
    with pytest.raises(KubeError) as raised:
        store.publish(make_plan(plan_id="ours"))
    assert str(raised.value) == (
        f"configmap lorafleet-plan: annotation {TERM}: {term!r} is not a leader term "
        "(accepted: the Unix seconds a leader took the lease at, as it writes them, e.g. "
        "'1764763200.250000'); not overwriting it: correct the annotation or remove it"
    )
    current = store.current()
    assert current is not None and current.id == "published"
    server.put("configmaps", _plan_configmap("999.500000"))  # corrected: an earlier term
    store.publish(make_plan(plan_id="ours"))
    current = store.current()
    assert current is not None and current.id == "ours"


def test_a_configmap_key_read_without_a_resource_version_is_a_named_kube_error() -> None:
    # A reader tells a change by the version: read as "" each time, it would see none.
    server = WireServer().start()
    api = connect(host=server.url)
    try:
        body = {"kind": "ConfigMap", "metadata": {"name": "inputs"}, "data": {"k": "text"}}
        server.answers["GET /api/v1/namespaces/lf/configmaps/inputs"] = Answer(
            body=json.dumps(body).encode()
        )
        key = KubeConfigMapKey(api, target=TARGET, name="inputs", key="k")
        with pytest.raises(KubeError) as raised:
            key.read()
        assert str(raised.value) == (
            "configmap lf/inputs key k: the configmap has no metadata.resourceVersion"
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
        server.stop()
