"""Planning in a replay: the history a forecaster sees, the oracle's demand, and how the
``lorafleet`` router follows the ``Plan`` its planner returns."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

import pytest

from placement.domain import AdapterId, Fleet, PodId, Tier
from placement.errors import SolverError
from placement.inputs.request_log import RequestLog
from placement.plan import AdapterPlan, Plan, PodPlan
from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.planning import (
    RecentFloor,
    ReplayHistory,
    ReplayPlanning,
    TrueDemand,
    WindowRates,
    observed_plan,
)
from placement.sim.replay import pod_specs
from placement.sim.routers import PlannedRouter
from placement.sim.workload import SimWorkload
from placement.solver.problem import Demand
from policies.eviction import EvictionPolicy
from tests import factories

START = datetime(2026, 3, 10, 9, 0, 30, tzinfo=UTC)
MODEL = "llama-3.1-8b"


def workload(arrivals: list[tuple[float, str]]) -> SimWorkload:
    arrivals = sorted(arrivals)
    return SimWorkload(
        start=START,
        arrival_s=[moment for moment, _ in arrivals],
        adapters=[name for _, name in arrivals],
        prompt_tokens=[100] * len(arrivals),
        output_tokens=[10] * len(arrivals),
        size_bytes=dict.fromkeys({name for _, name in arrivals}, 50_000_000),
    )


def two_pods() -> Fleet:
    return factories.replay_fleet(2, max_loras=2, max_cpu_loras=4)


def plan_of(hot: Mapping[str, tuple[str, ...]]) -> Plan:
    """Each adapter hot on the pods listing it, its traffic shared equally."""
    holders: dict[AdapterId, list[PodId]] = {}
    for pod, names in hot.items():
        for name in names:
            holders.setdefault(AdapterId(name), []).append(PodId(pod))
    return Plan(
        id="fixed",
        created_at=START,
        valid_from=START,
        valid_until=START + timedelta(hours=1),
        pods=MappingProxyType(
            {
                PodId(pod): PodPlan(hot=tuple(AdapterId(n) for n in names))
                for pod, names in hot.items()
            }
        ),
        adapters=MappingProxyType(
            {
                name: AdapterPlan(tier=Tier.HOT, pods={pod: 1 / len(pods) for pod in pods})
                for name, pods in holders.items()
            }
        ),
    )


class FixedPlanner:
    """Answers with its plans in turn; an exception in the list is raised instead."""

    def __init__(self, *answers: Plan | Exception) -> None:
        self.answers = list(answers)

    def __call__(
        self,
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def fixed_demand(rates: Mapping[str, float]) -> RecentFloor:
    def forecast(
        history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        return {AdapterId(n): Demand(mean_rps=r, q90_rps=r) for n, r in rates.items()}

    return RecentFloor(forecast)


def router(load: SimWorkload, planning: ReplayPlanning) -> tuple[PlannedRouter, FleetReplay]:
    settings = Settings()
    replay = FleetReplay(
        load, pod_specs(planning.fleet), sim=settings.sim, load_cost=settings.load_cost
    )
    routed = PlannedRouter(
        "lorafleet",
        replay,
        settings,
        EvictionPolicy.LRU,
        planning=planning,
        history=ReplayHistory(load),
    )
    return routed, replay


LOAD = workload([(float(i), "busy") for i in range(300)] + [(150.5, "rare")])


def test_the_history_holds_only_complete_minutes_before_now() -> None:
    history = ReplayHistory(LOAD)
    # The replay starts 30 s into a minute: at 100 s, minutes ending by 09:01:30 are whole.
    log = history.log_until(100.0)
    assert log.aggregated
    assert log.frame["ts"].max() < START + timedelta(seconds=100)
    assert int(log.frame["requests"].sum()) == 90  # 09:00:30 to 09:02:00, one a second
    assert history.log_until(0.0).frame.empty


def test_the_recent_rates_are_of_the_window_before_the_moment_read() -> None:
    rates = WindowRates(LOAD, window_s=1200.0)
    rates.now_s = 100.0  # 100 requests of "busy" in the 100 s the replay has run
    assert dict(rates) == {"busy": 1.0}
    assert rates.get("rare") == 0.0  # asked for at 150.5 s: not yet
    rates.now_s = 200.0
    assert rates["busy"] == 1.0
    assert rates["rare"] == 1 / 200.0
    rates.now_s = 1400.0  # the window is 200-1,400 s: 100 of "busy", not "rare"
    assert dict(rates) == {"busy": 100 / 1200.0}
    rates.now_s = 1500.0  # "busy" stopped at 299 s
    assert dict(rates) == {}
    assert rates.get("busy") == 0.0


def test_the_oracle_sees_the_mean_and_the_busiest_window_coming() -> None:
    history = ReplayHistory(LOAD)
    demand = TrueDemand(history)(history.log_until(0.0), start=START, duration_s=1200)
    assert demand[AdapterId("busy")].mean_rps == pytest.approx(300 / 1200)
    assert demand[AdapterId("busy")].q90_rps == pytest.approx(300 / 600)
    assert demand[AdapterId("rare")].q90_rps == pytest.approx(1 / 600)


def test_an_adapter_seen_lately_is_forecast_at_least_at_its_recent_rate() -> None:
    history = ReplayHistory(LOAD)
    floor = fixed_demand({"busy": 0.1})
    demand = floor(history.log_until(270.0), start=START + timedelta(seconds=270), duration_s=600)
    # 09:05:00: the whole minutes before it hold 270 requests of busy and 1 of rare.
    assert demand[AdapterId("busy")].q90_rps == pytest.approx(270 / 1200)
    assert demand[AdapterId("rare")].mean_rps == pytest.approx(1 / 1200)


def test_only_hot_adapters_forecast_at_the_floor_are_protected_and_routed_by_weight() -> None:
    fleet = two_pods()
    plan = plan_of({"pod-0": ("busy", "rare"), "pod-1": ("busy",)})
    planning = ReplayPlanning(
        fleet=fleet,
        forecaster=fixed_demand({"busy": 1.0, "rare": 0.01}),
        planner=FixedPlanner(plan),
        hot_min_rps=0.2,
    )
    routed, replay = router(LOAD, planning)
    hot = routed.plan(0.0, replay)
    assert hot == {"pod-0": frozenset({"busy"}), "pod-1": frozenset({"busy"})}
    assert routed.weights == {"busy": {"pod-0": 0.5, "pod-1": 0.5}}
    assert routed.plan_sources == {"NONE": 1}


def test_a_failed_plan_keeps_the_last_one() -> None:
    planning = ReplayPlanning(
        fleet=two_pods(),
        forecaster=fixed_demand({"busy": 1.0}),
        planner=FixedPlanner(plan_of({"pod-1": ("busy",)}), SolverError("no plan")),
    )
    routed, replay = router(LOAD, planning)
    first = routed.plan(0.0, replay)
    assert routed.plan(60.0, replay) == first == {"pod-0": frozenset(), "pod-1": {"busy"}}
    assert routed.weights == {"busy": {"pod-1": 1.0}}
    assert routed.plan_sources == {"NONE": 1, "failed (kept the last plan)": 1}


def test_the_planner_is_hinted_with_what_the_pods_hold() -> None:
    hint = observed_plan({"pod-0": frozenset({"b", "a"}), "pod-1": frozenset()}, at=START)
    assert hint.placement() == {
        PodId("pod-0"): {AdapterId("a"): Tier.HOT, AdapterId("b"): Tier.HOT},
        PodId("pod-1"): {},
    }
