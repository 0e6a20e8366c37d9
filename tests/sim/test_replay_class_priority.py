"""``RouterSettings.class_priority`` in the replay, through ``run_policy`` as ``lorafleet
replay`` and the bench scripts call it: on, lorafleet gets the catalog's class weights
(``replay_planning`` carries them), sends the warm-up that keeps production resident
while an experiment idles beside it, and the result has the figures per class; off,
no warm-up, no per-class figures, and the engine's LRU evicts production."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from placement.domain import AdapterClass, Catalog
from placement.settings import Settings
from placement.sim.engine import GPU_HIT
from placement.sim.figures import class_figures
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.routers import ClassedPlanning
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests import factories

START = datetime(2026, 3, 10, tzinfo=UTC)
#: One pod of two GPU slots: "prod" then "exp-a" fill it, "exp-b" must evict one, and
#: "prod" comes back.
ARRIVALS = [(0.0, "prod"), (5.0, "exp-a"), (10.0, "exp-b"), (20.0, "prod")]


def workload() -> SimWorkload:
    return SimWorkload(
        start=START,
        arrival_s=[moment for moment, _ in ARRIVALS],
        adapters=[name for _, name in ARRIVALS],
        prompt_tokens=[100] * len(ARRIVALS),
        output_tokens=[10] * len(ARRIVALS),
        size_bytes=dict.fromkeys((name for _, name in ARRIVALS), 50_000_000),
    )


def classed_catalog(load: SimWorkload) -> Catalog:
    catalog = factories.replay_catalog(load.size_bytes)
    adapters = tuple(
        a if a.name == "prod" else replace(a, adapter_class=AdapterClass.EXPERIMENT)
        for a in catalog.adapters
    )
    return replace(catalog, adapters=adapters)


def replay(*, on: bool, policy: str = "lorafleet") -> ReplayResult:
    load = workload()
    fleet = factories.replay_fleet(1, max_loras=2, max_cpu_loras=8)
    settings = Settings()
    settings = replace(settings, router=replace(settings.router, class_priority=on))
    planning = replay_planning(classed_catalog(load), fleet, settings=settings, planner="greedy")
    return run_policy(policy, load, fleet, settings=settings, planning=planning)


def test_replay_planning_carries_the_catalogs_classes() -> None:
    planning = replay_planning(
        classed_catalog(workload()), factories.replay_fleet(1), settings=Settings()
    )
    assert isinstance(planning, ClassedPlanning)
    assert planning.class_weight == {"exp-a": 0.1, "exp-b": 0.1, "prod": 1.0}
    assert planning.class_of["prod"] == "production"


def test_with_class_priority_production_comes_back_to_its_gpu_slot() -> None:
    result = replay(on=True)
    assert result.warmups == 1
    assert result.log.outcome[-1] == GPU_HIT, "prod was kept on the GPU"
    assert set(result.by_class) == {"experiment", "production"}
    production = result.by_class["production"]
    assert (production["requests"], production["gpu_hit_rate"]) == (2, 0.5)


def test_without_it_the_engines_lru_evicts_production() -> None:
    result = replay(on=False)
    assert result.warmups == 0
    assert result.log.outcome[-1] != GPU_HIT, "prod was the LRU victim"
    assert result.by_class == {}


@pytest.mark.parametrize("policy", ["bounded", "oracle"])
def test_other_policies_get_per_class_figures_and_no_class_warm_ups(policy: str) -> None:
    result = replay(on=True, policy=policy)
    assert result.warmups == 0
    assert set(result.by_class) == {"experiment", "production"}


def test_class_figures_count_each_class_in_the_window() -> None:
    result = replay(on=False)
    classes = {"prod": "production", "exp-a": "experiment"}  # "exp-b" absent: production
    figures = class_figures(result.log, workload(), classes, window=(4.0, 30.0))
    assert figures["experiment"]["requests"] == 1
    assert figures["production"]["requests"] == 2  # "exp-b" and the second "prod"
    assert 0.0 <= figures["production"]["gpu_hit_rate"] <= 1.0
