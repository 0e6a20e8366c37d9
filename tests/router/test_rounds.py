"""The router's rounds called directly, on the HTTP client and the clock a test gives it.

``scrape_all`` and ``refresh_plan`` are what the background loops run each interval;
here no loop runs, the pods are reached through the emulator's in-process transport
(or, where a request is proxied, real sockets), and time moves only when the test
advances a ``FakeClock``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.adapters.kube_memory import MemoryPlanStore
from placement.emulator import EmulatedFleet
from placement.errors import KubeError
from placement.router import FleetPodSource, MemoryRequestLog, Router, build_router
from placement.router.kube_sources import StorePlanSource
from placement.router.sources import PlanSource
from tests.factories import FakeClock

from .conftest import MANUAL, catalog_of, emulated, plan_of

pytestmark = pytest.mark.anyio


def _router(
    fleet: EmulatedFleet,
    engine_http: httpx.AsyncClient,
    *,
    plan_source: PlanSource | None = None,
    registry: CollectorRegistry | None = None,
) -> Router:
    return Router(
        plan_source=plan_source or StorePlanSource(MemoryPlanStore()),
        pod_source=FleetPodSource(fleet.domain()),
        engine_http=engine_http,
        clock=FakeClock(),
        settings=MANUAL.router,
        registry=registry,
    )


def _healthy(router: Router) -> Iterator[str]:
    return (pod for pod, state in sorted(router.topology.pods.items()) if state.healthy)


async def test_a_scrape_round_takes_a_dead_pod_out_and_brings_it_back_revived() -> None:
    pod_clock = FakeClock()
    fleet = EmulatedFleet.start(2, clock=pod_clock)  # reached in-process: no socket opened
    registry = CollectorRegistry()
    async with httpx.AsyncClient(transport=fleet.transport()) as engine_http:
        router = _router(fleet, engine_http, registry=registry)
        await router.refresh_pods()
        await router.scrape_all()
        assert list(_healthy(router)) == ["pod-0", "pod-1"]
        fleet.pod("pod-1").kill(60.0)
        await router.scrape_all()
        assert list(_healthy(router)) == ["pod-0"]
        assert registry.get_sample_value("lorafleet_pod_healthy", {"pod": "pod-1"}) == 0.0
        pod_clock.advance(60.0)  # the down window ends: the pod is back, empty
        await router.scrape_all()
        assert list(_healthy(router)) == ["pod-0", "pod-1"]
        assert registry.get_sample_value("lorafleet_pod_healthy", {"pod": "pod-1"}) == 1.0


async def test_a_plan_round_swaps_a_new_plan_and_keeps_it_when_the_source_fails() -> None:
    fleet = EmulatedFleet.start(2)
    store = MemoryPlanStore()
    registry = CollectorRegistry()
    async with httpx.AsyncClient(transport=fleet.transport()) as engine_http:
        router = _router(fleet, engine_http, plan_source=StorePlanSource(store), registry=registry)
        await router.refresh_pods()
        await router.refresh_plan()
        assert router.topology.plan is None and router.plan_error is not None
        assert registry.get_sample_value("lorafleet_router_plan_loaded") == 0.0
        store.publish(plan_of({"alpha": ["pod-1"]}, plan_id="one"))
        await router.refresh_plan()
        assert router.topology.plan is not None and router.topology.plan.id == "one"
        assert dict(router.topology.weights["alpha"]) == {"pod-1": 1.0}
        store.faults.queued.append(KubeError("503 from the API server"))
        await router.refresh_plan()
        assert router.topology.plan.id == "one"
        assert "503" in (router.plan_error or "")
        assert registry.get_sample_value("lorafleet_router_plan_loaded") == 1.0


async def test_the_request_log_and_residencies_follow_the_injected_clock() -> None:
    clock = FakeClock()
    start_s = clock()
    log = MemoryRequestLog()
    registry = CollectorRegistry()
    # One GPU slot: beta's request takes alpha's slot, thirty clock seconds later.
    with emulated(1, max_loras=1) as pods:
        async with httpx.AsyncClient() as engine_http:
            app = build_router(
                fleet=pods.domain,
                catalog=catalog_of(["alpha", "beta"]),
                settings=MANUAL,
                registry=registry,
                request_log=log,
                engine_http=engine_http,
                clock=clock,
            )
            await app.router.start()
            try:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://router"
                ) as client:
                    for adapter in ("alpha", "beta"):
                        body = {"model": adapter, "prompt": "p", "max_tokens": 1}
                        answer = await client.post("/v1/completions", json=body)
                        assert answer.status_code == 200, answer.text
                        await app.router.scrape_all()
                        clock.advance(30.0)
            finally:
                await app.router.stop()
    assert [(row.adapter, row.ts_s) for row in log.rows] == [
        ("alpha", start_s),
        ("beta", start_s + 30.0),
    ]
    labels = {"pod": "pod-0"}
    assert registry.get_sample_value("lorafleet_adapter_residency_seconds_count", labels) == 1.0
    assert registry.get_sample_value("lorafleet_adapter_residency_seconds_sum", labels) == 30.0
