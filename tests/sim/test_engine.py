"""The fleet model: load phases, conservation, slot limits, thrashing, coalescing."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import (
    Catalog,
    Fleet,
)
from placement.settings import LoadCostSettings, Settings, SimSettings
from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT, FleetReplay
from placement.sim.pods import SimPod
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.routers import POLICIES, REACTIVE
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy
from tests import factories

MB = 1_000_000
GiB = 1 << 30
START = datetime(2026, 3, 10, tzinfo=UTC)
MODEL = "llama-3.1-8b"


def workload(
    arrivals: list[tuple[float, str]], *, size: int = 50 * MB, prompt: int = 100, output: int = 10
) -> SimWorkload:
    arrivals = sorted(arrivals)
    names = {adapter for _, adapter in arrivals}
    return SimWorkload(
        start=START,
        arrival_s=[moment for moment, _ in arrivals],
        adapters=[adapter for _, adapter in arrivals],
        prompt_tokens=[prompt] * len(arrivals),
        output_tokens=[output] * len(arrivals),
        size_bytes=dict.fromkeys(names, size),
    )


def fleet_of(count: int, *, max_loras: int = 4, max_cpu_loras: int = 8) -> Fleet:
    return factories.replay_fleet(count, max_loras=max_loras, max_cpu_loras=max_cpu_loras)


def catalog_of(load: SimWorkload) -> Catalog:
    return factories.replay_catalog(load.size_bytes)


def replay(
    name: str, load: SimWorkload, fleet: Fleet, *, planner: str = "greedy", **options: Any
) -> ReplayResult:
    settings = Settings()
    planning = replay_planning(catalog_of(load), fleet, settings=settings, planner=planner)
    return run_policy(name, load, fleet, settings=settings, planning=planning, **options)


def test_load_phases_give_85_ms_best_and_about_670_ms_worst() -> None:
    cost = LoadCostSettings()
    assert cost.warm_load_ms(50 * MB) == pytest.approx(85.0, abs=1.0)
    assert cost.cold_load_ms(200 * MB, drain_ms=cost.max_drain_ms) == pytest.approx(634.0, abs=40)


def test_first_request_waits_for_a_cold_load_into_a_free_slot() -> None:
    result = replay("epp", workload([(0.0, "a")]), fleet_of(1))
    sim, cost = SimSettings(), LoadCostSettings()
    expected = cost.cold_load_ms(50 * MB) + 100 * sim.prefill_ms_per_token
    assert result.log.ttft_ms[0] == pytest.approx(expected)
    assert result.log.outcome == [COLD_LOAD]


def test_replacing_an_adapter_drains_the_running_batch() -> None:
    # One slot: "b" must evict "a", whose request runs for 10 x 30 ms; the load waits.
    load = workload([(0.0, "a"), (0.2, "b")], output=10)
    result = replay("epp", load, fleet_of(1, max_loras=1))
    first_end = result.log.end_s[0]
    cost = LoadCostSettings()
    load_ms = cost.cold_load_ms(50 * MB, drain_ms=(first_end - 0.2) * 1000)
    assert result.log.ttft_ms[1] == pytest.approx(load_ms + 5.0, rel=1e-6)


@pytest.mark.parametrize("name", ["epp", "bounded", "hash", "least-loaded", "lorafleet"])
def test_a_single_adapter_trace_has_one_load(name: str) -> None:
    load = workload([(i * 0.5, "solo") for i in range(200)])
    result = replay(name, load, fleet_of(4))
    assert result.metrics["loads"] == 1
    assert result.metrics["gpu_hit_rate"] == pytest.approx(199 / 200)


def many_adapter_trace(adapters: int, requests: int, *, seed: int = 7) -> SimWorkload:
    rng = random.Random(seed)
    names = [f"adapter-{i}" for i in range(adapters)]
    return workload([(i * 0.2, rng.choice(names)) for i in range(requests)])


def test_round_robin_thrashes_where_hashing_does_not() -> None:
    load = many_adapter_trace(8, 3000)
    pods = fleet_of(4, max_loras=6)
    round_robin = replay("round-robin", load, pods).metrics
    hashed = replay("hash", load, pods).metrics
    assert int(round_robin["loads"]) > 10 * int(hashed["loads"])
    assert float(hashed["gpu_hit_rate"]) > 0.99 > 0.9 > float(round_robin["gpu_hit_rate"])


def test_stampede_coalesces_onto_one_loading_pod() -> None:
    burst = workload([(i * 0.001, "cold") for i in range(50)])
    coalesced = replay("bounded", burst, fleet_of(4)).metrics
    assert coalesced["loads"] == 1


def test_cpu_hits_come_from_the_host_cache() -> None:
    # One GPU slot, roomy host cache: a, b, a: the second "a" loads from host RAM.
    load = workload([(0.0, "a"), (5.0, "b"), (10.0, "a")])
    result = replay("epp", load, fleet_of(1, max_loras=1))
    assert result.log.outcome == [COLD_LOAD, COLD_LOAD, CPU_HIT]
    assert result.metrics["cold_loads"] == 2


class CheckedReplay(FleetReplay):
    """Checks the pod invariants after every load completes and every request ends."""

    def _check(self, pod: SimPod) -> None:
        assert pod.agrees(), "the routers' views are not the engine model's"
        assert len(pod.gpu_adapters) + len(pod.loading) <= pod.max_loras
        assert len(pod.registered) <= pod.max_cpu_loras
        assert pod.running <= self.sim.max_num_seqs
        assert pod.queue_depth == sum(1 for r in pod.queue if r >= 0)

    def _load_done(self, p: int, now_s: float) -> None:
        super()._load_done(p, now_s)
        self._check(self.pods[p])

    def _done(self, p: int, r: int, now_s: float) -> None:
        super()._done(p, r, now_s)
        self._check(self.pods[p])


TRACES = st.lists(
    st.tuples(st.floats(min_value=0, max_value=60), st.sampled_from("abcdefghij")),
    min_size=1,
    max_size=120,
)


@settings(max_examples=40, deadline=None)
@given(TRACES, st.sampled_from(POLICIES), st.sampled_from(list(EvictionPolicy)))
def test_invariants_hold_for_every_policy(
    trace: list[tuple[float, str]], name: str, eviction: EvictionPolicy
) -> None:
    load = workload(trace)
    pods = fleet_of(3, max_loras=2, max_cpu_loras=3)
    result = replay(name, load, pods, eviction=eviction, replay_type=CheckedReplay)
    metrics = result.metrics
    assert metrics["requests"] == metrics["served"] + metrics["rejected"] == len(trace)
    assert all(pod >= 0 for pod in result.log.pod)
    for key in ("gpu_hit_rate", "cpu_hit_rate", "load_wait_share"):
        assert 0.0 <= float(metrics[key]) <= 1.0
    hits = sum(outcome == GPU_HIT for outcome in result.log.outcome)
    assert float(metrics["gpu_hit_rate"]) == pytest.approx(hits / len(trace), abs=1e-6)
    assert int(metrics["loads"]) >= len({adapter for _, adapter in trace})
    assert all(ttft >= 0.0 for ttft in result.log.ttft_ms)


def test_every_reactive_policy_is_named() -> None:
    assert set(REACTIVE) <= set(POLICIES)
    assert {"lorafleet", "oracle"} <= set(POLICIES)
