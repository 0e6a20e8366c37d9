"""An adapter's GPU slot is as recent as its requests' last step, in the replay too.

Each step vLLM's worker touches every adapter its batch runs on in both LRU caches
(``LRUCacheWorkerLoRAManager.add_adapter``); each forward batch SGLang runs marks every
adapter of the batch used in its GPU pool (sgl-project/sglang
python/sglang/srt/lora/mem_pool.py ``LoRAMemoryPool.prepare_lora_batch``:
``eviction_policy.mark_used``, ``LRUEvictionPolicy``), its soft cap's registry moving
on arrival only. So after a long request on ``a`` with a short one on ``b`` inside it,
the next activation pushes off ``b``, not ``a``. The emulated pod and the router's
ledger do this (``PodResidency.last_step``); these hold the replay to it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from placement.domain import Engine, Fleet
from placement.residency import EngineModel, PodResidency
from placement.settings import Settings
from placement.sim.engine import CPU_HIT, GPU_HIT
from placement.sim.pods import PodSpec, SimPod
from placement.sim.replay import run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests import factories

MB = 1_000_000


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_after_a_long_request_inside_which_a_short_one_ran_a_load_evicts_the_short_ones(
    engine: Engine,
) -> None:
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
    fleet = on_engine(factories.replay_fleet(1, max_loras=2, max_cpu_loras=8), engine)
    settings = Settings()
    catalog = factories.replay_catalog(load.size_bytes)
    planning = replay_planning(catalog, fleet, settings=settings, planner="greedy")
    result = run_policy("epp", load, fleet, settings=settings, planning=planning)
    assert result.log.end_s[0] > result.log.end_s[1] + 10.0  # "a" ran on long after "b"
    assert result.log.outcome[3:] == [GPU_HIT, CPU_HIT]  # "a" kept its slot, "b" lost it


def on_engine(fleet: Fleet, engine: Engine) -> Fleet:
    """``fleet`` with every pool and pod on ``engine``."""
    return Fleet(
        pools=tuple(
            replace(
                pool,
                engine=engine,
                pods=tuple(replace(pod, engine=engine) for pod in pool.pods),
            )
            for pool in fleet.pools
        )
    )


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


def test_a_last_step_on_sglang_moves_the_gpu_order_not_the_registrys() -> None:
    """SGLang's pool marks the batch's uids used (``prepare_lora_batch``:
    ``mark_used``); its soft cap's registry (``LoRARegistry``) moves on ``acquire``."""
    pod = pod_running(EngineModel.SGLANG)
    pod.last_step("a")
    assert list(pod.gpu_adapters) == ["b", "a"]
    assert pod.model.on_gpu() == ("b", "a")
    assert pod.model.in_host() == ("a", "b")
    assert pod.agrees()


def test_a_last_step_off_the_gpu_moves_nothing() -> None:
    for engine in (EngineModel.VLLM, EngineModel.SGLANG):
        pod = pod_running(engine)
        pod.last_step("gone")
        assert list(pod.gpu_adapters) == ["a", "b"]
        assert pod.model.on_gpu() == ("a", "b")


@pytest.mark.parametrize("engine", list(EngineModel))
@pytest.mark.parametrize(
    "calls",
    [
        ("step a", "hit b", "step c"),
        ("hit a", "step b", "hit c", "step a"),
        ("step c", "hit a", "hit b", "step a", "hit c"),
        ("hit c", "step c", "hit b", "step a", "step b"),
    ],
)
def test_noted_hits_and_last_steps_leave_the_model_as_one_call_each(
    engine: EngineModel, calls: tuple[str, ...]
) -> None:
    """The pod notes hits and last steps and sends them later (its docstring's
    "Speed"); the model ends as it would after one call each, in both orders."""
    pod = SimPod(PodSpec(pod_id="p", max_loras=3, max_cpu_loras=3, engine=engine))
    reference = PodResidency(engine, max_loras=3, max_cpu_loras=3)
    for adapter in ("a", "b", "c"):
        pod.fetch(adapter, now_s=0.0, busy=())
        pod.land(adapter, 0.0)
        reference.load(adapter, adapter)
        reference.request(adapter)
    for call in calls:
        kind, adapter = call.split()
        if kind == "hit":
            pod.request(adapter)
            reference.request(adapter)
        else:
            pod.last_step(adapter)
            reference.last_step(reference.entry(adapter))
    assert pod.model.on_gpu() == reference.on_gpu()
    assert pod.model.in_host() == reference.in_host()
    assert pod.agrees()
