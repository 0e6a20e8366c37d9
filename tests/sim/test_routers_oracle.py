"""The oracle in the replay weighs a load's victim by its own horizon
(``SimSettings.oracle_victim_horizon_s``), whatever lorafleet's
(``RouterSettings.victim_horizon_s``): a bound must not inherit a setting tuned for the
policy it bounds."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from placement.domain import AdapterId
from placement.inputs.request_log import RequestLog
from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.planning import RecentFloor, ReplayHistory, ReplayPlanning
from placement.sim.replay import pod_specs
from placement.sim.routers import PlannedRouter
from placement.sim.workload import SimWorkload
from placement.solver.problem import Demand
from policies.eviction import EvictionPolicy
from tests import factories
from tests.sim.test_routers_ahead import empty_plan

START = datetime(2026, 3, 10, 9, 0, 0, tzinfo=UTC)
#: The adapters on the two pods and when each is next asked for after 100 s: pod-0's
#: Belady victim ("b") soon, pod-1's ("d") much later.
NEXT_S = {"a": 104.0, "b": 106.0, "c": 400.0, "d": 500.0}


def every_one_busy(
    history: RequestLog, *, start: datetime, duration_s: int
) -> dict[AdapterId, Demand]:
    return {AdapterId(name): Demand(mean_rps=1.0, q90_rps=1.0) for name in NEXT_S}


def oracle_on_full_pods(settings: Settings) -> PlannedRouter:
    """The oracle planned at 100 s over two full pods: pod-0 holds "a" and "b", pod-1
    "c" and "d" behind a queue of eight; each adapter asked for nine times before."""
    past = [(10.0 * i, name) for name in NEXT_S for i in range(1, 10)]
    future = [(moment, name) for name, moment in NEXT_S.items()]
    requests = sorted([*past, (100.0, "new"), *future])
    load = SimWorkload(
        start=START,
        arrival_s=[moment for moment, _ in requests],
        adapters=[name for _, name in requests],
        prompt_tokens=[100] * len(requests),
        output_tokens=[10] * len(requests),
        size_bytes=dict.fromkeys([*NEXT_S, "new"], 50_000_000),
    )
    fleet = factories.replay_fleet(2, max_loras=2, max_cpu_loras=4)
    replay = FleetReplay(load, pod_specs(fleet), sim=settings.sim, load_cost=settings.load_cost)
    for pod, held in zip(replay.pods, (("a", "b"), ("c", "d")), strict=True):
        for name in held:
            pod.load(name, now_s=0.0)
    replay.pods[1].queue_depth = 8
    # As FleetReplay.run sets up a Belady engine: each pod's victim is Belady's, its
    # cost its wait to its true next use.
    replay.router_eviction = EvictionPolicy.BELADY
    for pod in replay.pods:
        pod.victim_cost = replay._victim_cost
    replay.now_s = 100.0
    planning = ReplayPlanning(
        fleet=fleet, forecaster=RecentFloor(every_one_busy), planner=empty_plan, hot_min_rps=0.2
    )
    oracle = PlannedRouter(
        "oracle",
        replay,
        settings,
        EvictionPolicy.BELADY,
        planning=planning,
        history=ReplayHistory(load),
    )
    oracle.plan(100.0, replay)
    return oracle


def horizons(*, lorafleet_s: float, oracle_s: float) -> Settings:
    settings = Settings()
    return replace(
        settings,
        # The horizons alone: a load's stall on the queued pod (load_stall_weight) aside.
        router=replace(settings.router, victim_horizon_s=lorafleet_s, load_stall_weight=0.0),
        sim=replace(settings.sim, oracle_victim_horizon_s=oracle_s),
    )


def test_a_long_oracle_horizon_protects_the_victim_needed_soon() -> None:
    # Over 1,000 s both victims are likely needed, "b" surely: the queue of eight on pod-1
    # costs less than the difference. lorafleet's 1 s horizon would see neither.
    oracle = oracle_on_full_pods(horizons(lorafleet_s=1.0, oracle_s=1000.0))
    assert oracle.route("new", 100.0).pod_id == "pod-1"


def test_a_short_oracle_horizon_sees_neither_victim_whatever_lorafleet_s() -> None:
    oracle = oracle_on_full_pods(horizons(lorafleet_s=1000.0, oracle_s=1.0))
    assert oracle.route("new", 100.0).pod_id == "pod-0"


@pytest.mark.parametrize("horizon_s", [0.0, -60.0, math.nan, math.inf])
def test_an_oracle_horizon_that_is_no_span_is_refused_by_name(horizon_s: float) -> None:
    # NaN or a negative horizon made every victim's worth NaN or negative (-prior: a
    # division by zero) in the replay, long after the settings were given.
    with pytest.raises(ValueError, match=r"SimSettings\.oracle_victim_horizon_s must be"):
        horizons(lorafleet_s=60.0, oracle_s=horizon_s)


@pytest.mark.parametrize("eviction", [p for p in EvictionPolicy if p is not EvictionPolicy.BELADY])
def test_lorafleet_weighs_its_victims_over_its_own_horizon_on_any_engine_but_belady(
    eviction: EvictionPolicy,
) -> None:
    settings = horizons(lorafleet_s=60.0, oracle_s=600.0)
    load = SimWorkload(
        start=START,
        arrival_s=[0.0],
        adapters=["a"],
        prompt_tokens=[1],
        output_tokens=[1],
        size_bytes={"a": 1},
    )
    fleet = factories.replay_fleet(1, max_loras=2, max_cpu_loras=4)
    replay = FleetReplay(load, pod_specs(fleet), sim=settings.sim, load_cost=settings.load_cost)
    planning = ReplayPlanning(
        fleet=fleet, forecaster=RecentFloor(every_one_busy), planner=empty_plan, hot_min_rps=0.2
    )
    router = PlannedRouter(
        "lorafleet", replay, settings, eviction, planning=planning, history=ReplayHistory(load)
    )
    assert router.victim_horizon_s == 60.0
