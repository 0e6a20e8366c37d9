"""On vLLM an adapter is as recent as its requests' last step, in the replay too.

Each step vLLM's worker touches every adapter its batch runs on in both LRU caches
(``LRUCacheWorkerLoRAManager.add_adapter``), so after a long request on ``a`` with a short
one on ``b`` inside it, the next activation pushes off ``b``, not ``a``. The emulated pod
does this (``PodResidency.last_step``); these hold the replay to it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from placement.residency import EngineModel
from placement.settings import Settings
from placement.sim.engine import CPU_HIT, GPU_HIT
from placement.sim.pods import PodSpec, SimPod
from placement.sim.replay import run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests import factories

MB = 1_000_000


def test_after_a_long_request_inside_which_a_short_one_ran_a_load_evicts_the_short_ones() -> None:
    # Two GPU slots: "a" runs 2,000 steps (about a minute) from 0 s, "b" 5 steps from 1 s;
    # "c" at 100 s evicts the least recently used: "b" (its last step came first).
    arrivals = [(0.0, "a", 2000), (1.0, "b", 5), (100.0, "c", 5), (110.0, "a", 5), (120.0, "b", 5)]
    load = SimWorkload(
        start=datetime(2026, 3, 10, tzinfo=UTC),
        arrival_s=[moment for moment, _, _ in arrivals],
        adapters=[adapter for _, adapter, _ in arrivals],
        prompt_tokens=[100] * len(arrivals),
        output_tokens=[steps for _, _, steps in arrivals],
        size_bytes=dict.fromkeys("abc", 50 * MB),
    )
    fleet = factories.replay_fleet(1, max_loras=2, max_cpu_loras=8)
    settings = Settings()
    catalog = factories.replay_catalog(load.size_bytes)
    planning = replay_planning(catalog, fleet, settings=settings, planner="greedy")
    result = run_policy("epp", load, fleet, settings=settings, planning=planning)
    assert result.log.end_s[0] > result.log.end_s[1] + 10.0  # "a" ran on long after "b"
    assert result.log.outcome[3:] == [GPU_HIT, CPU_HIT]  # "a" kept its slot, "b" lost it


def pod_running(engine: EngineModel) -> SimPod:
    """A pod holding "a" then "b" on its two slots ("a" least recently used)."""
    pod = SimPod(PodSpec(pod_id="p", max_loras=2, max_cpu_loras=2, engine=engine))
    for adapter in ("a", "b"):
        pod.fetch(adapter, now_s=0.0, busy=())
        pod.land(adapter, 0.0)
    return pod


def test_a_last_step_on_vllm_makes_the_adapter_the_most_recently_used() -> None:
    pod = pod_running(EngineModel.VLLM)
    pod.last_step("a")
    assert list(pod.gpu_adapters) == ["b", "a"]
    assert pod.model.on_gpu() == ("b", "a")
    assert pod.agrees()


def test_a_last_step_on_sglang_or_off_the_gpu_moves_nothing() -> None:
    pod = pod_running(EngineModel.SGLANG)
    pod.last_step("a")
    assert list(pod.gpu_adapters) == ["a", "b"]
    vllm = pod_running(EngineModel.VLLM)
    vllm.last_step("gone")
    assert list(vllm.gpu_adapters) == ["a", "b"]
