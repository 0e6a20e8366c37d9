"""What a plan says: JSON round trip and schema, stability, tiers, affinity, fallback."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]  # no stubs: types-jsonschema is not installed
import pytest

from placement.domain import AdapterId, Catalog, Fleet, PodId, Tier
from placement.plan import Plan, plan_from_json, plan_to_dict, plan_to_json
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, extract_plan, solve
from placement.solver.problem import PlacementProblem
from placement.solver.problem_build import build_problem
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FAST = SolveOptions(time_limit_s=2.0, workers=1, seed=0, gap_limit=PlannerSettings().gap_limit)
A = AdapterId


def _schema() -> dict[str, object]:
    text = (Path(__file__).parents[2] / "placement" / "schemas" / "plan.schema.json").read_text()
    loaded: dict[str, object] = json.loads(text)
    return loaded


def _zipf(n: int) -> dict[str, float]:
    return {f"a{i}": 4.0 / (i + 1) for i in range(n)}


def _problem(
    cat: Catalog,
    fl: Fleet,
    rates: dict[str, float],
    *,
    current: dict[PodId, dict[AdapterId, Tier]] | None = None,
    planner: PlannerSettings | None = None,
) -> PlacementProblem:
    settings = Settings(planner=planner or PlannerSettings())
    return build_problem(cat, fl, demand(rates), settings=settings, valid_from=AT, current=current)


def _plan(problem: PlacementProblem, options: SolveOptions = FAST) -> Plan:
    return extract_plan(problem, solve(problem, options=options), created_at=AT)


def _basic() -> tuple[Catalog, Fleet, dict[str, float]]:
    adapters = [
        adapter(f"a{i}", pinned=i == 3, group="docs" if i in (5, 6) else None) for i in range(12)
    ]
    adapters.append(adapter("other-base", base="qwen2.5-7b"))
    return catalog(*adapters), fleet(pool("p", 3, max_loras=3, max_cpu_loras=6)), _zipf(12)


def test_plan_json_round_trips_and_matches_the_schema() -> None:
    plan = _plan(_problem(*_basic()))
    raw = plan_to_dict(plan)
    jsonschema.validate(raw, _schema())
    assert plan_to_dict(plan_from_json(plan_to_json(plan))) == raw
    assert raw["valid_until"] == "2026-03-02T10:00:00Z"
    assert raw["solver"]["status"] == "OPTIMAL"
    assert set(raw["why"]) == set(raw["adapters"])


def test_busiest_adapters_are_hot_and_the_pin_is_kept() -> None:
    plan = _plan(_problem(*_basic()))
    assert plan.tier_of(A("a0")) is Tier.HOT
    assert plan.tier_of(A("a3")) is Tier.HOT, "pinned"
    assert plan.tier_of(A("a11")) is not Tier.HOT
    assert plan.tier_of(A("other-base")) is Tier.COLD
    assert plan.why[A("other-base")] == "cold: no pool serves base model qwen2.5-7b"
    assert plan.why[A("a3")].startswith("hot on 2 pods: pinned;")
    assert all(A("a3") in pod.pinned for pod_id, pod in plan.pods.items() if A("a3") in pod.hot)


def test_traffic_above_the_share_threshold_gets_two_replicas() -> None:
    plan = _plan(_problem(*_basic()))
    assert len(plan.hot_pods(A("a0"))) == 2
    rates = {"big": 10.0, **{f"t{i}": 0.01 for i in range(60)}}
    cat = catalog(adapter("big"), *[adapter(f"t{i}") for i in range(60)])
    small = _plan(_problem(cat, fleet(pool("p", 3, max_loras=4)), rates))
    singles = [a for a, e in small.adapters.items() if e.tier is Tier.HOT and len(e.pods) == 1]
    assert singles and A("big") not in singles


def test_predicted_hit_rates_add_up() -> None:
    plan = _plan(_problem(*_basic()))
    p = plan.predicted
    assert p["gpu_hit_rate"] + p["cpu_hit_rate"] + p["cold_rate"] == pytest.approx(1.0)
    assert 0.5 < p["gpu_hit_rate"] < 1.0
    assert p["expected_delay_ms"] > 0


def test_replanning_the_same_demand_needs_no_loads() -> None:
    cat, fl, rates = _basic()
    first = _plan(_problem(cat, fl, rates))
    assert first.preloads and all(
        p.at == AT - timedelta(seconds=Settings().forecast.preload_lead_s) for p in first.preloads
    )
    second = _plan(_problem(cat, fl, rates, current=first.placement()))
    assert second.preloads == ()
    assert second.placement() == first.placement()
    assert second.predicted["loads"] == 0


def test_churn_limits_new_registrations_per_pod() -> None:
    cat, fl, rates = _basic()
    first = _plan(_problem(cat, fl, rates))
    shifted = {name: rates[f"a{11 - int(name[1:])}"] for name in rates}
    planner = PlannerSettings(max_loads_per_pod=1)
    second = _plan(_problem(cat, fl, shifted, current=first.placement(), planner=planner))
    for pod_id, pod in second.pods.items():
        before = first.placement()[pod_id]
        new = [a for a in pod.registered if a not in before and a != A("a3")]
        assert len(new) <= 1
    assert second.tier_of(A("a11")) is not Tier.COLD


def test_affinity_group_members_share_pods() -> None:
    adapters = [adapter(f"g{i}", group="pipe") for i in range(3)]
    adapters += [adapter(f"x{i}") for i in range(3)]
    rates = {"g0": 1.0, "g1": 1.0, "g2": 1.0, "x0": 1.0, "x1": 1.0, "x2": 1.0}
    planner = PlannerSettings(replicate_share=1.0)
    plan = _plan(
        _problem(catalog(*adapters), fleet(pool("p", 2, max_loras=3)), rates, planner=planner)
    )
    group_pods = {pod for g in ("g0", "g1", "g2") for pod in plan.hot_pods(A(g))}
    assert len(group_pods) == 1


def test_routing_weights_balance_the_pods() -> None:
    plan = _plan(_problem(*_basic()))
    loads = [pod.expected_rps for pod in plan.pods.values()]
    assert max(loads) - min(loads) < 0.25 * max(loads)
    for name, entry in plan.adapters.items():
        if entry.tier is Tier.HOT:
            assert sum(entry.pods.values()) == pytest.approx(1.0), name


def test_time_limit_without_a_solution_falls_back_to_the_greedy_plan() -> None:
    problem = _problem(*_basic())
    plan = _plan(problem, replace(FAST, deterministic_time=0.0))
    assert plan.solver.status == "FALLBACK_GREEDY"
    assert plan.tier_of(A("a3")) is Tier.HOT
    best = _plan(problem)
    assert best.solver.objective <= plan.solver.objective


def test_gap_and_bound_are_reported() -> None:
    plan = _plan(_problem(*_basic()))
    report = plan.solver
    assert report.bound <= report.objective
    assert report.gap == pytest.approx((report.objective - report.bound) / report.objective)
    assert report.wall_s > 0


@pytest.mark.parametrize(
    ("challenger_rps", "promoted"),
    [
        pytest.param(1.05, False, id="five-percent-busier-does-not-displace"),
        pytest.param(1.5, True, id="half-again-busier-displaces"),
    ],
)
def test_hysteresis_keeps_the_incumbent_unless_the_gain_is_worth_it(
    challenger_rps: float, promoted: bool
) -> None:
    cat = catalog(adapter("incumbent"), adapter("challenger"))
    fl = fleet(pool("p", 1, max_loras=1))
    planner = PlannerSettings(replicate_share=1.0)
    first = _plan(_problem(cat, fl, {"incumbent": 1.0, "challenger": 0.5}, planner=planner))
    assert first.tier_of(A("incumbent")) is Tier.HOT
    rates = {"incumbent": 1.0, "challenger": challenger_rps}
    second = _plan(_problem(cat, fl, rates, current=first.placement(), planner=planner))
    assert (second.tier_of(A("challenger")) is Tier.HOT) is promoted


def test_two_workers_give_the_same_plan_twice() -> None:
    options = replace(FAST, workers=2, seed=3)
    one, two = (_plan(_problem(*_basic()), options) for _ in range(2))
    assert one.placement() == two.placement()
    assert dict(one.adapters) == dict(two.adapters)
