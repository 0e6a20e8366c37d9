"""lorafleet in the replay: after a plan it weighs a load's victim by the forecast it
planned with (fading as the victim idles on its pod) and by its class, on
the engine's LRU: it chooses the pod, never the victim, and names the warm-ups that keep
a higher class off the victim's place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from placement.domain import AdapterId, Fleet, PodId, Tier
from placement.inputs.request_log import RequestLog
from placement.plan import AdapterPlan, Plan, PodPlan
from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.planning import RecentFloor, ReplayHistory, ReplayPlanning
from placement.sim.replay import pod_specs
from placement.sim.routers import PlannedRouter, ReactiveRouter
from placement.sim.workload import SimWorkload
from placement.solver.problem import Demand
from policies.eviction import EvictionPolicy
from policies.routing import RouteReason
from tests import factories

START = datetime(2026, 3, 10, 9, 0, 0, tzinfo=UTC)
MODEL = "llama-3.1-8b"
NAMES = ("busy", "idle", "x", "y", "new", "fresh")


def fleet_of_two() -> Fleet:
    return factories.replay_fleet(2, max_loras=2, max_cpu_loras=4)


def empty_plan(
    demand: Mapping[AdapterId, Demand], *, fleet: Fleet, valid_from: datetime, current: Plan | None
) -> Plan:
    return Plan(
        id="empty",
        created_at=valid_from,
        valid_from=valid_from,
        valid_until=valid_from + timedelta(hours=1),
        pods=MappingProxyType({}),
        adapters=MappingProxyType({}),
    )


def forecast(history: RequestLog, *, start: datetime, duration_s: int) -> dict[AdapterId, Demand]:
    # "busy" is forecast at one request a second, the rest at nothing.
    return {AdapterId("busy"): Demand(mean_rps=1.0, q90_rps=1.0)}


def full_pods() -> tuple[FleetReplay, Settings, ReplayPlanning]:
    """Two pods of two slots, full: pod-0's LRU victim is "busy" (idle since 1 s),
    pod-1's is "idle" (idle since 50 s): bounded affinity evicts "busy"."""
    settings = Settings()
    load = SimWorkload(
        start=START,
        # "busy" was asked for nine times in the last 100 s (its forecast borne out).
        arrival_s=[*(10.0 * i for i in range(1, 10)), 100.0],
        adapters=[*["busy"] * 9, "new"],
        prompt_tokens=[100] * 10,
        output_tokens=[10] * 10,
        size_bytes=dict.fromkeys(NAMES, 50_000_000),
    )
    fleet = fleet_of_two()
    replay = FleetReplay(load, pod_specs(fleet), sim=settings.sim, load_cost=settings.load_cost)
    for pod, held, victim_used_s in zip(
        replay.pods, (("busy", "x"), ("idle", "y")), (1.0, 50.0), strict=True
    ):
        for name in held:
            pod.load(name, now_s=0.0)
        pod.last_used.update({held[0]: victim_used_s, held[1]: 90.0})
    planning = ReplayPlanning(
        fleet=fleet, forecaster=RecentFloor(forecast), planner=empty_plan, hot_min_rps=0.2
    )
    return replay, settings, planning


def _lorafleet(
    replay: FleetReplay,
    settings: Settings,
    planning: ReplayPlanning,
    *,
    workload: SimWorkload | None = None,
    class_weight: Mapping[str, float] | None = None,
) -> PlannedRouter:
    """lorafleet over LRU pods, its history ``workload`` (the replay's by default)."""
    history = ReplayHistory(replay.workload if workload is None else workload)
    return PlannedRouter(
        "lorafleet",
        replay,
        settings,
        EvictionPolicy.LRU,
        planning=planning,
        history=history,
        class_weight=class_weight,
    )


def test_bounded_affinity_evicts_the_adapter_idle_longest() -> None:
    replay, settings, _ = full_pods()
    bounded = ReactiveRouter("bounded", replay, settings, EvictionPolicy.LRU)
    assert bounded.route("new", 100.0).pod_id == "pod-0"


def test_lorafleet_loads_where_the_forecast_says_the_victim_is_not_needed() -> None:
    replay, settings, planning = full_pods()
    lorafleet = _lorafleet(replay, settings, planning)
    assert lorafleet.route("new", 100.0).pod_id == "pod-0"  # no forecast yet: bounded
    lorafleet.plan(100.0, replay)
    decision = lorafleet.route("new", 100.0)
    assert (decision.pod_id, decision.reason) == ("pod-1", RouteReason.GENERAL_POOL)


def test_lorafleet_sends_class_warm_ups_with_a_load_that_would_evict_production() -> None:
    # pod-0 holds "busy" (production, its LRU victim) and "x" (batch); pod-1 has a long
    # queue. The load goes to pod-0 with a warm-up of "busy", so "x" is evicted.
    replay, settings, planning = full_pods()
    replay.pods[1].queue_depth = 40
    lorafleet = _lorafleet(replay, settings, planning, class_weight={"x": 0.5, "y": 0.5})
    lorafleet.plan(100.0, replay)
    decision = lorafleet.route("new", 100.0)
    assert (decision.pod_id, decision.refresh) == ("pod-0", ("busy",))


def hot_plan(
    demand: Mapping[AdapterId, Demand], *, fleet: Fleet, valid_from: datetime, current: Plan | None
) -> Plan:
    """ "busy" hot on pod-1 (where it is not), "fresh" hot on pod-0."""
    return plan_with({"pod-0": ("fresh",), "pod-1": ("busy",)}, at=valid_from)


def plan_with(hot: Mapping[str, tuple[str, ...]], *, at: datetime) -> Plan:
    return Plan(
        id="hot",
        created_at=at,
        valid_from=at,
        valid_until=at + timedelta(hours=1),
        pods=MappingProxyType(
            {
                PodId(pod): PodPlan(hot=tuple(AdapterId(n) for n in names))
                for pod, names in hot.items()
            }
        ),
        adapters=MappingProxyType(
            {
                AdapterId(name): AdapterPlan(tier=Tier.HOT, pods={PodId(pod): 1.0})
                for pod, names in hot.items()
                for name in names
            }
        ),
    )


def test_lorafleet_preloads_only_what_no_pod_holds() -> None:
    # "busy" is on pod-0 already: a copy on pod-1 would only evict there. "fresh" is
    # nowhere: it is preloaded where the plan puts it. The oracle's engine keeps the
    # plan's whole hot set, so it is asked to preload both.
    replay, settings, planning = full_pods()
    both = {AdapterId("busy"): Demand(mean_rps=1.0, q90_rps=1.0)} | {
        AdapterId("fresh"): Demand(mean_rps=1.0, q90_rps=1.0)
    }
    planning = replace(
        planning,
        forecaster=RecentFloor(lambda history, *, start, duration_s: both),
        planner=hot_plan,
    )
    history = ReplayHistory(replay.workload)
    lorafleet = PlannedRouter(
        "lorafleet", replay, settings, EvictionPolicy.LRU, planning=planning, history=history
    )
    assert lorafleet.plan(100.0, replay) == {"pod-0": frozenset({"fresh"}), "pod-1": frozenset()}
    oracle = PlannedRouter(
        "oracle", replay, settings, EvictionPolicy.BELADY, planning=planning, history=history
    )
    assert oracle.plan(100.0, replay) == {
        "pod-0": frozenset({"fresh"}),
        "pod-1": frozenset({"busy"}),
    }


def test_a_forecast_the_traffic_does_not_bear_out_protects_no_victim() -> None:
    replay, settings, planning = full_pods()
    quiet = replace(
        replay.workload, arrival_s=[100.0], adapters=["new"], prompt_tokens=[1], output_tokens=[1]
    )
    lorafleet = _lorafleet(replay, settings, planning, workload=quiet)
    lorafleet.plan(100.0, replay)
    assert lorafleet.route("new", 100.0).pod_id == "pod-0"  # as bounded affinity


def test_a_session_that_ended_since_the_plan_protects_its_victim_no_longer() -> None:
    # "busy" was last asked for at 90 s; at 1,400 s no request of it is in the last
    # 20 minutes, the live router's window: its forecast protects it no more, though no
    # replan has come since 100 s (a rate read at the replan protected it until the next).
    replay, settings, planning = full_pods()
    lorafleet = _lorafleet(replay, settings, planning)
    lorafleet.plan(100.0, replay)
    assert lorafleet.route("new", 100.0).pod_id == "pod-1"
    assert lorafleet.route("new", 1400.0).pod_id == "pod-0"  # as bounded affinity
