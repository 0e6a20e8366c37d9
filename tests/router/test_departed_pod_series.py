"""A pod that leaves the router's topology leaves ``/metrics``: its gauges (healthy, queue
depth, GPU slots and adapters) no longer read as a live pod's for ever, and in one
process its series are removed from the registry, so a fleet that churns pods (rolling
updates, scale-downs) keeps none of theirs. Where the figures are multiprocess files
(``--workers``), which cannot drop a series, the render leaves them out.

The pods are emulated and reached in-process (``EmulatedFleet.transport``); the pod
source is the test's own, changed between rounds as a Kubernetes watch would change it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.adapters.kube_memory import MemoryPlanStore
from placement.emulator import EmulatedFleet
from placement.router import MemoryRequestLog, Router
from placement.router.kube_sources import StorePlanSource
from placement.router.live_pods import Upstream
from placement.router.metrics import RouterMetrics, WorkersCollector
from placement.router.state import upstreams_from_fleet
from tests.factories import FakeClock

from .conftest import MANUAL

pytestmark = pytest.mark.anyio

#: Families with a ``pod`` label that every scraped pod has.
PER_POD = ("lorafleet_pod_healthy", "lorafleet_pod_queue_depth", "lorafleet_pod_gpu_slots")


class ChangingPods:
    """A pod source whose pods the test sets."""

    description = "the test's pods"

    def __init__(self, upstreams: tuple[Upstream, ...]) -> None:
        self.now = upstreams

    async def upstreams(self) -> tuple[Upstream, ...]:
        return self.now


def _pods_in(text: str, family: str) -> set[str]:
    return {
        line.split('pod="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith(family + "{") and 'pod="' in line
    }


async def _router_over(
    fleet: EmulatedFleet, http: httpx.AsyncClient
) -> tuple[Router, ChangingPods]:
    pods = ChangingPods(upstreams_from_fleet(fleet.domain()))
    router = Router(
        plan_source=StorePlanSource(MemoryPlanStore()),
        pod_source=pods,
        engine_http=http,
        clock=FakeClock(),
        settings=MANUAL.router,
        registry=CollectorRegistry(),
        request_log=MemoryRequestLog(),
    )
    await router.refresh_pods()
    await router.scrape_all()
    return router, pods


async def test_a_pod_that_left_has_no_series_and_one_that_comes_back_has_them_again() -> None:
    fleet = EmulatedFleet.start(3)
    async with httpx.AsyncClient(transport=fleet.transport()) as http:
        router, pods = await _router_over(fleet, http)
        registry = router.metrics.registry
        text = router.metrics.render().decode()
        for family in PER_POD:
            assert _pods_in(text, family) == {"pod-0", "pod-1", "pod-2"}, family
        everyone = pods.now
        pods.now = tuple(u for u in everyone if u.pod != "pod-1")  # scaled down
        await router.refresh_pods()
        await router.scrape_all()
        text = router.metrics.render().decode()
        assert 'pod="pod-1"' not in text  # before: healthy 1 and its last queue, for ever
        for family in PER_POD:
            assert _pods_in(text, family) == {"pod-0", "pod-2"}, family
        # Removed from the registry too (one process), not only left out of the render.
        assert registry.get_sample_value("lorafleet_pod_healthy", {"pod": "pod-1"}) is None
        assert registry.get_sample_value("lorafleet_pod_gpu_slots", {"pod": "pod-1"}) is None
        assert registry.get_sample_value("lorafleet_pod_healthy", {"pod": "pod-0"}) == 1.0
        pods.now = everyone  # the pod is back (the same name: a StatefulSet's)
        await router.refresh_pods()
        await router.scrape_all()
        text = router.metrics.render().decode()
        for family in PER_POD:
            assert _pods_in(text, family) == {"pod-0", "pod-1", "pod-2"}, family


async def test_the_stays_of_a_departed_pods_adapters_end_with_it() -> None:
    fleet = EmulatedFleet.start(2)
    async with httpx.AsyncClient(transport=fleet.transport()) as http:
        router, pods = await _router_over(fleet, http)
        router.fleet_metrics.observe_gpu("pod-1", ["a", "b"], now_s=0.0)
        assert (
            router.metrics.registry.get_sample_value("lorafleet_pod_gpu_adapters", {"pod": "pod-1"})
            == 2.0
        )
        pods.now = tuple(u for u in pods.now if u.pod != "pod-1")
        await router.refresh_pods()
        assert not [key for key in router.fleet_metrics._since_s if key[0] == "pod-1"]
        assert 'pod="pod-1"' not in router.metrics.render().decode()


def test_in_multiprocess_files_a_departed_pods_series_are_left_out_of_the_render(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The figures stay where they are (prometheus_client cannot remove a series from its
    # files, and warns if asked): the render alone leaves them out.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent")
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, max_adapter_labels=16)
    for pod in ("pod-0", "pod-1"):
        metrics.pod_healthy.labels(pod=pod).set(1)
        metrics.activation(pod)
    metrics.plan_ok.set(1)
    metrics.keep_pods(["pod-0", "pod-1"])
    metrics.keep_pods(["pod-0"])
    assert registry.get_sample_value("lorafleet_pod_healthy", {"pod": "pod-1"}) == 1.0
    text = metrics.render().decode()
    assert 'pod="pod-1"' not in text
    assert 'lorafleet_pod_healthy{pod="pod-0"} 1.0' in text
    assert "lorafleet_router_plan_loaded 1.0" in text  # a family without a pod label


def test_before_the_first_topology_every_pods_series_is_rendered() -> None:
    metrics = RouterMetrics(CollectorRegistry(), max_adapter_labels=16)
    metrics.pod_healthy.labels(pod="pod-0").set(1)
    assert 'lorafleet_pod_healthy{pod="pod-0"} 1.0' in metrics.render().decode()


def test_a_request_that_ends_after_its_pod_left_writes_no_series_back() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, max_adapter_labels=16)
    metrics.keep_pods(["pod-0", "pod-1"])
    metrics.activation("pod-1")
    metrics.keep_pods(["pod-0"])
    metrics.activation("pod-1")  # a cpu hit's request, in flight across the swap
    metrics.activation("pod-0")
    loads = "lorafleet_adapter_loads_total"
    assert registry.get_sample_value(loads, {"pod": "pod-1", "reason": "activation"}) is None
    assert registry.get_sample_value(loads, {"pod": "pod-0", "reason": "activation"}) == 1.0


#: One worker's figures in multiprocess files (``record_in`` replaces prometheus_client's
#: value class for the whole process, so it runs in a process of its own): pod-1 holds
#: three adapters, leaves, and comes back under its name holding one.
A_POD_BACK_IN_FILES = """
import sys
from pathlib import Path
from placement.router.metrics import record_in
record_in(Path(sys.argv[1]))
from prometheus_client import CollectorRegistry
from placement.metrics import FleetMetrics
fleet = FleetMetrics(CollectorRegistry())
fleet.observe_gpu("pod-1", {"a", "b", "c"}, now_s=0.0)
fleet.pods_left({"pod-1"})
fleet.observe_gpu("pod-1", {"a"}, now_s=10.0)
fleet.load_queue_depth("pod-2", depth=1)
fleet.pods_left({"pod-2"})
from placement.router.metrics import RouterMetrics
router = RouterMetrics(CollectorRegistry(), max_adapter_labels=16)
router.metrics_missing.labels(pod="pod-1").set(1)
router.keep_pods(["pod-1"])
router.keep_pods([])
router.keep_pods(["pod-1"])  # back, healthy: its fresh state writes the gauge no more
"""


def test_in_files_a_pod_back_under_its_name_counts_its_adapters_from_zero(
    tmp_path: Path,
) -> None:
    # Before, its old count stayed in the file (it cannot be removed there) and the
    # adapters it came back with were counted on top of it: 4. Its metrics_missing and
    # another pod's load queue depth kept their last values (1) the same way.
    subprocess.run(
        [sys.executable, "-c", A_POD_BACK_IN_FILES, str(tmp_path)],
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    workers = CollectorRegistry(auto_describe=False)
    workers.register(WorkersCollector(tmp_path))
    assert workers.get_sample_value("lorafleet_pod_gpu_adapters", {"pod": "pod-1"}) == 1.0
    assert workers.get_sample_value("lorafleet_load_queue_depth", {"pod": "pod-2"}) == 0.0
    missing = "lorafleet_router_pod_metrics_missing"
    assert workers.get_sample_value(missing, {"pod": "pod-1"}) == 0.0
