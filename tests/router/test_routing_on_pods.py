"""Routing as the emulated pods see it: their own counters of loads, activations, evictions."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
import urllib.request
from dataclasses import replace

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from placement.domain import Catalog, Fleet, PodId
from placement.emulator import Latency
from placement.ports import PodMetrics
from placement.router import RouterApp
from tests.factories import FakeClock

from .conftest import MANUAL, Pods, catalog_of, emulated, plan_of, router_for

ADAPTERS = [f"lora-{i}" for i in range(8)]
ROUNDS = 4


def _traffic() -> list[str]:
    """The same requests for both routers: every adapter each round, in a shuffled order."""
    rng = random.Random(7)
    order: list[str] = []
    for _ in range(ROUNDS):
        order += rng.sample(ADAPTERS, len(ADAPTERS))
    return order


def _load_everywhere(pods: Pods) -> None:
    for handle, name in itertools.product(pods.fleet.handles, ADAPTERS):
        body = json.dumps({"lora_name": name, "lora_path": f"s3://adapters/{name}"}).encode()
        request = urllib.request.Request(
            f"{handle.url}/v1/load_lora_adapter",
            data=body,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5):
            pass


def test_plan_aware_routing_keeps_activations_within_slots_where_round_robin_thrashes() -> None:
    # Four pods with two GPU slots each and eight adapters: exactly enough slots.
    plan = plan_of({name: [f"pod-{i // 2}"] for i, name in enumerate(ADAPTERS)})
    with emulated(4, max_loras=2, max_cpu_loras=8) as pods:
        with router_for(pods.domain, plan=plan, catalog=catalog_of(ADAPTERS)) as router:
            client = router.client()
            for name in _traffic():
                client.completions.create(model=name, prompt="p", max_tokens=1)
        planned_evictions = pods.counter("gpu_evictions")
        planned_activations = [int(h.pod.counters["gpu_activations"]) for h in pods.fleet.handles]
        assert pods.counter("loads") == len(ADAPTERS)  # each adapter loaded once, by the router

    with emulated(4, max_loras=2, max_cpu_loras=8) as pods:
        _load_everywhere(pods)
        clients = [OpenAI(base_url=f"{h.url}/v1", api_key="x") for h in pods.fleet.handles]
        spray = itertools.cycle(clients)
        for name in _traffic():
            next(spray).completions.create(model=name, prompt="p", max_tokens=1)
        for made in clients:
            made.close()
        spray_evictions = pods.counter("gpu_evictions")

    assert planned_evictions == 0
    assert all(count <= 2 for count in planned_activations)
    assert spray_evictions >= len(ADAPTERS)


async def _burst(url: str, model: str, n: int) -> list[str]:
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        answers = await asyncio.gather(
            *(client.completions.create(model=model, prompt="p", max_tokens=1) for _ in range(n))
        )
    return [answer.choices[0].text for answer in answers]


@pytest.mark.parametrize("plan", [None, "unplanned"], ids=["no-plan", "absent-from-plan"])
def test_a_stampede_of_100_requests_for_a_cold_adapter_causes_one_load(plan: str | None) -> None:
    slow_load = replace(Latency(), load_ms=1500.0)  # every request arrives during the load
    with emulated(3, max_loras=2, latency=slow_load) as pods:
        given = plan_of({"other": ["pod-0"]}) if plan else None
        with router_for(pods.domain, plan=given, catalog=catalog_of(["cold", "other"])) as router:
            answers = asyncio.run(_burst(router.url, "cold", 100))
            assert len(answers) == 100
            assert pods.counter("loads") == 1
            assert pods.counter("gpu_activations") == 1
            unplanned = router.get("/v1/unplanned")["adapters"]
            assert unplanned == {"cold": 100}


def _set_kv(router_app: RouterApp, kv_usage: float) -> None:
    for state in router_app.router.topology.pods.values():
        state.observe(PodMetrics(kv_usage=kv_usage))


SHORT_PRESSURE_WAIT = replace(MANUAL, router=replace(MANUAL.router, pressure_wait_s=0.1))


def test_memory_pressure_stops_loads_then_answers_503_with_retry_after() -> None:
    with emulated(2) as pods:
        plan = plan_of({"hot": ["pod-0"]})
        catalog = catalog_of(["hot", "cold"])
        with router_for(
            pods.domain, plan=plan, catalog=catalog, settings=SHORT_PRESSURE_WAIT
        ) as router:
            client = router.client()
            client.completions.create(model="hot", prompt="p", max_tokens=1)
            _set_kv(router.app, 0.9)  # soft pressure: no new loads
            assert client.completions.create(model="hot", prompt="p", max_tokens=1).choices
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(model="cold", prompt="p", max_tokens=1)
            assert refused.value.status_code == 503
            assert pods.counter("loads") == 1  # only "hot" was ever loaded
            _set_kv(router.app, 0.97)  # critical: everything is refused
            with pytest.raises(openai.APIStatusError) as critical:
                client.completions.create(model="hot", prompt="p", max_tokens=1)
            assert critical.value.status_code == 503
            assert critical.value.response.headers["retry-after"] == "1"


def test_a_503_from_a_dying_pod_is_retried_once_on_the_next_pod() -> None:
    with emulated(2) as pods:
        plan = plan_of({"alpha": ["pod-0"]})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as router:
            client = router.client()
            client.completions.create(model="alpha", prompt="p", max_tokens=1)
            pods.fleet.pod("pod-0").kill(30.0)
            answer = client.completions.create(model="alpha", prompt="p", max_tokens=1)
            assert answer.choices[0].text
            assert "lorafleet_upstream_retries_total 1.0" in router.get("/metrics")
        assert pods.fleet.pod("pod-1").counters["requests"] == 1


def test_a_refused_connection_is_retried_on_the_next_pod() -> None:
    with emulated(1) as pods, socket.socket() as unheard:
        unheard.bind(("127.0.0.1", 0))  # bound and never listening: connections are refused
        pool = pods.domain.pools[0]
        url = f"http://127.0.0.1:{unheard.getsockname()[1]}"
        ghost = replace(pool.pods[0], name=PodId("pod-ghost"), url=url)
        fleet = Fleet(pools=(replace(pool, pods=(ghost, *pool.pods)),))
        plan = plan_of({"alpha": ["pod-ghost"]})
        with router_for(fleet, plan=plan, catalog=catalog_of(["alpha"])) as router:
            # The first scrape took the ghost out; it passes for healthy again, as a pod
            # that died since its last scrape does.
            assert router.get("/healthz")["healthy_pods"] == ["pod-0"]
            for state in router.app.router.topology.pods.values():
                state.healthy = True
            answer = router.client().completions.create(model="alpha", prompt="p", max_tokens=1)
            assert answer.choices[0].text
        assert pods.fleet.pod("pod-0").counters["requests"] == 1


def test_an_unhealthy_pod_leaves_the_rotation_and_returns_when_it_recovers() -> None:
    pod_clock = FakeClock()
    with emulated(2, clock=pod_clock) as pods, router_for(pods.domain) as router:
        assert router.get("/healthz")["healthy_pods"] == ["pod-0", "pod-1"]
        pods.fleet.pod("pod-1").kill(60.0)
        router.scrape()
        assert router.get("/healthz")["healthy_pods"] == ["pod-0"]
        # While it is out, everything goes to pod-0, whatever the hash says.
        for name in ADAPTERS:
            router.client().completions.create(model="base-model", prompt=name, max_tokens=1)
        assert pods.fleet.pod("pod-1").counters["requests"] == 0
        pod_clock.advance(60.0)  # the pod's down window ends
        router.scrape()
        assert router.get("/healthz")["healthy_pods"] == ["pod-0", "pod-1"]


def test_an_adapter_the_pod_cannot_load_is_a_502_naming_it_and_the_pod_stays() -> None:
    broken = catalog_of(["ghost"]).adapters[0]
    catalog = Catalog(adapters=(replace(broken, source="s3://adapters/missing/ghost"),))
    with emulated(1) as pods, router_for(pods.domain, catalog=catalog) as router:
        with pytest.raises(openai.APIStatusError) as failure:
            router.client().completions.create(model="ghost", prompt="p", max_tokens=1)
        assert failure.value.status_code == 502
        assert "ghost" in str(failure.value)
        assert router.get("/healthz")["healthy_pods"] == ["pod-0"]


def _evictions_through_router(policy: str) -> int:
    settings = replace(MANUAL, router=replace(MANUAL.router, policy=policy))
    with emulated(4, max_loras=2, max_cpu_loras=8) as pods:
        with router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=settings) as router:
            client = router.client()
            for name in _traffic():
                client.completions.create(model=name, prompt="p", max_tokens=1)
        return pods.counter("gpu_evictions")


def test_the_reactive_baselines_run_through_the_same_proxy() -> None:
    # The demo compares policies on live pods: round-robin sprays every adapter over
    # every pod and thrashes; the EPP score's affinity keeps most requests where
    # their adapter already is.
    round_robin = _evictions_through_router("round-robin")
    epp = _evictions_through_router("epp")
    assert round_robin >= len(ADAPTERS)
    assert epp < round_robin


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        _evictions_through_router("random")


def test_the_router_exports_residency_and_slot_use_from_its_ledger() -> None:
    # The thrashing signals: round-robin over one slot per pod makes adapters
    # leave their slots, and each stay the router's scrapes see is a residency.
    settings = replace(MANUAL, router=replace(MANUAL.router, policy="round-robin"))
    with (
        emulated(2, max_loras=1, max_cpu_loras=8) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=settings) as router,
    ):
        client = router.client()
        for name in _traffic()[:10]:
            client.completions.create(model=name, prompt="p", max_tokens=1)
            router.scrape()  # a scrape sees each change
        sample = router.registry.get_sample_value
        assert sample("lorafleet_pod_gpu_slots", {"pod": "pod-0"}) == 1.0
        stays = sample("lorafleet_adapter_residency_seconds_count", {"pod": "pod-0"})
        assert stays is not None and stays >= 2


def test_an_adapter_unloaded_behind_the_routers_back_is_loaded_again_not_a_404() -> None:
    # The controller may unload an adapter between two listings; the pod's 404 must not
    # reach the client while the catalog can load it again.
    settings = replace(MANUAL, router=replace(MANUAL.router, listing_every_scrapes=10_000))
    with (
        emulated(1) as pods,
        router_for(pods.domain, catalog=catalog_of(["lora-0"]), settings=settings) as router,
    ):
        client = router.client()
        client.completions.create(model="lora-0", prompt="p", max_tokens=1)
        url = pods.fleet.handles[0].url
        request = urllib.request.Request(
            f"{url}/v1/unload_lora_adapter",
            data=json.dumps({"lora_name": "lora-0"}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5):
            pass
        answer = client.completions.create(model="lora-0", prompt="p", max_tokens=1)
        assert answer.choices
        assert pods.counter("loads") == 2
