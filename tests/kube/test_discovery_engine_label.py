"""The router's pods from a label selector, through the official client against the fake
API server of ``tests.controller``: a pod whose ``lorafleet.io/engine`` label names no
engine the router speaks is left out, said once (the pod, the label, its value and the
accepted values), and the rest of the discovery goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from kubernetes import client

from placement.adapters.kube import KubePods, KubeTarget, connect
from placement.domain import Engine, PodId, PoolId
from placement.errors import InputError
from placement.ports import DiscoveredPod
from placement.router.kube_sources import DiscoveryPodSource, engine_of
from placement.router.state import Upstream
from tests.controller.controller_kubefake import FakeApiServer, make_pod

TARGET = KubeTarget(namespace="lf", request_timeout_s=2.0)
ENGINE = "lorafleet.io/engine"
SAID = (
    "selector: pod pod-a: label lorafleet.io/engine: {!r} is not an engine the router "
    "speaks (accepted: vllm, sglang); left out"
)


@pytest.fixture
def fake() -> Iterator[tuple[FakeApiServer, client.ApiClient]]:
    server = FakeApiServer().start()
    api = connect(host=server.url)
    yield server, api
    api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
    server.stop()


def _upstreams(source: DiscoveryPodSource) -> list[tuple[str, Engine]]:
    found: tuple[Upstream, ...] = asyncio.run(source.upstreams())
    return [(str(upstream.pod), upstream.engine) for upstream in found]


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.name == "lorafleet.router"]
    caplog.clear()
    return said


def test_a_pod_with_an_unknown_engine_is_left_out_said_once_and_the_rest_kept(
    fake: tuple[FakeApiServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lorafleet.router")
    server, api = fake
    server.put("pods", make_pod("pod-a", ip="10.0.0.1", labels={ENGINE: "tgi"}))
    server.put("pods", make_pod("pod-b", ip="10.0.0.2", labels={ENGINE: "sglang"}))
    server.put("pods", make_pod("pod-c", ip="10.0.0.3"))
    source = DiscoveryPodSource(KubePods(api, target=TARGET))
    kept = [("pod-b", Engine.SGLANG), ("pod-c", Engine.VLLM)]
    assert _upstreams(source) == kept
    assert _said(caplog) == [SAID.format("tgi")]
    assert _upstreams(source) == kept  # the next poll: the same pods, nothing said again
    assert _said(caplog) == []
    server.put("pods", make_pod("pod-a", ip="10.0.0.1", labels={ENGINE: "VLLM"}))
    assert _upstreams(source) == kept
    assert _said(caplog) == [SAID.format("VLLM")]  # another value: said again
    server.put("pods", make_pod("pod-a", ip="10.0.0.1", labels={ENGINE: "vllm"}))
    assert _upstreams(source) == [("pod-a", Engine.VLLM), *kept]
    server.put("pods", make_pod("pod-a", ip="10.0.0.1", labels={ENGINE: "tgi"}))
    assert _upstreams(source) == kept
    assert _said(caplog) == [SAID.format("tgi")]  # broken again after it came right


@pytest.mark.parametrize("value", ["", "tgi", "vLLM "], ids=["empty", "unknown", "not-exact"])
def test_an_unknown_engine_label_is_an_input_error_naming_pod_label_and_value(
    value: str,
) -> None:
    pod = DiscoveredPod(
        name=PodId("pod-9"),
        pool=PoolId("llama"),
        ip="10.0.0.9",
        port=8000,
        ready=True,
        labels={ENGINE: value},
    )
    with pytest.raises(InputError) as raised:
        engine_of(pod)
    (problem,) = raised.value.problems
    assert (problem.source, problem.field) == ("pod pod-9", f"label {ENGINE}")
    assert problem.message == (
        f"{value!r} is not an engine the router speaks (accepted: vllm, sglang)"
    )
