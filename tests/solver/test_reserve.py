"""The tail reserve: GPU slots per pod a plan keeps for the dynamic cache, priced.

The property: no plan puts more hot adapters on a pod than its slots less its reserve
(the reserve never takes the slots a pod's named pins need, so pins are exempt by
construction), with the CP-SAT solver and with the greedy planner. The pricing: a
forecast without spread reserves nothing (steady adapters gain nothing from the
dynamic cache), a bursty tail does, and ``tail_reserve_max_slots`` 0 reserves nothing.
The plan says the reserve per pod, and a plan without the field still reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.domain import AdapterId, PodId
from placement.errors import InfeasibleError, PlanError
from placement.plan import plan_from_json, plan_to_json
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, extract_plan, solve
from placement.solver.planner import greedy_solution
from placement.solver.problem import Demand, PlacementProblem
from placement.solver.problem_build import build_problem
from placement.solver.reserve import busy_share, choose_reserve
from tests.factories import adapter, catalog, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FAST = SolveOptions(time_limit_s=1.0, workers=1, seed=0, gap_limit=PlannerSettings().gap_limit)


def _problem(
    rates: dict[str, tuple[float, float]],
    *,
    pods: int = 2,
    slots: int = 4,
    limit: int = 2,
    pins: Mapping[str, tuple[str, ...]] | None = None,
) -> PlacementProblem:
    pins = pins or {}
    adapters = [
        adapter(name, pinned=name in pins, pinned_pods=pins.get(name, ()), size_mib=20)
        for name in rates
    ]
    main = pool("p", pods, max_loras=slots, max_cpu_loras=4 * slots, hbm_mib=4096)
    demand = {AdapterId(n): Demand(mean_rps=m, q90_rps=q) for n, (m, q) in rates.items()}
    planner = PlannerSettings(tail_reserve_max_slots=limit, replicate_share=1.0)
    return build_problem(
        catalog(*adapters),
        fleet(main),
        demand,
        settings=Settings(planner=planner),
        valid_from=AT,
    )


def _reserved(problem: PlacementProblem) -> list[int]:
    return [cls.reserved_slots for pool_problem in problem.pools for cls in pool_problem.classes]


def test_steady_adapters_leave_no_reserve() -> None:
    # q90 = mean: each needs its slot all the time, so the dynamic cache saves nothing
    # a plan does not.
    rates = {f"a{i}": (1.0 / (i + 1), 1.0 / (i + 1)) for i in range(20)}
    assert _reserved(_problem(rates)) == [0]


def test_a_bursty_tail_gets_slots_kept_from_the_planned_adapters() -> None:
    # Eight steady adapters would fill the 8 slots; twelve bursty ones (busy a tenth of
    # the time at their q90) each save nearly as much as the last planned ones, and a
    # slot holds ten of them: one slot per pod (two in all) holds the twelve. A second
    # would only move steady adapters from the plan to the cache, saving nothing more.
    rates = {f"s{i}": (1.0 - 0.01 * i, 1.0 - 0.01 * i) for i in range(8)}
    rates.update({f"b{i}": (0.9, 9.0) for i in range(12)})
    problem = _problem(rates, limit=2)
    assert _reserved(problem) == [1]
    assert [cls.max_loras for cls in problem.pools[0].classes] == [3]


def test_the_setting_at_zero_reserves_nothing() -> None:
    rates = {f"b{i}": (0.9, 9.0) for i in range(20)}
    assert _reserved(_problem(rates, limit=0)) == [0]


def test_named_pins_keep_their_slots_from_the_reserve() -> None:
    rates = {f"b{i}": (0.9, 9.0) for i in range(20)}
    pins = {"b0": ("p-0",), "b1": ("p-0",), "b2": ("p-0",)}
    problem = _problem(rates, limit=3, pins=pins)
    # Three adapters pinned to p-0 by name: its class keeps 3 of 4 slots plannable.
    assert _reserved(problem) == [1]


def test_the_price_compares_saving_per_slot_with_the_tail_s() -> None:
    # One pod, two slots; a planned adapter saving 5 ms/s per slot against two bursty
    # ones busy a quarter of the time, each saving 3: one slot holds both (6 > 5).
    problem = _problem({"s": (5.0 / 85, 5.0 / 85), "b0": (0.03, 0.12), "b1": (0.03, 0.12)})
    candidates = problem.pools[0].candidates
    by_name = {c.name: c for c in candidates}
    assert busy_share(by_name[AdapterId("b0")]) == pytest.approx(0.25)
    cls = replace(problem.pools[0].classes[0], max_loras=2, reserved_slots=0, pods=(PodId("x"),))
    choice = choose_reserve([cls], candidates, limit=1, named_pins={})
    assert len(choice.value_by_level) == 2
    planned_only = choice.value_by_level[0]
    with_reserve = choice.value_by_level[1]
    assert choice.slots_per_pod == (1 if with_reserve > planned_only else 0)


def test_the_plan_says_the_reserve_and_an_older_plan_reads_without_it() -> None:
    rates = {f"s{i}": (1.0, 1.0) for i in range(8)}
    rates.update({f"b{i}": (0.9, 9.0) for i in range(12)})
    problem = _problem(rates, limit=1)
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    assert {p.reserved_slots for p in plan.pods.values()} == {1}
    text = plan_to_json(plan)
    read = plan_from_json(text)
    assert {p: read.pods[p].reserved_slots for p in read.pods} == {p: 1 for p in plan.pods}
    assert plan_to_json(read) == text
    raw = json.loads(text)
    for pod in raw["pods"].values():
        del pod["reserved_slots"]
    older = plan_from_json(json.dumps(raw))
    assert {p.reserved_slots for p in older.pods.values()} == {0}
    raw["pods"]["p-0"]["reserved_slots"] = -1
    with pytest.raises(PlanError, match=r"pods\.p-0\.reserved_slots"):
        plan_from_json(json.dumps(raw))


@dataclass(frozen=True)
class Case:
    problem: PlacementProblem
    #: Every pod's GPU slots (fleet.yaml's max_loras) and the adapters pinned by name.
    slots: int
    pins: dict[str, tuple[str, ...]]


@st.composite
def reserve_cases(draw: st.DrawFn) -> Case:
    pods = draw(st.integers(1, 4))
    slots = draw(st.integers(1, 5))
    n = draw(st.integers(1, 14))
    rates = {}
    for i in range(n):
        mean = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 2.0]))
        rates[f"a{i}"] = (mean, mean * draw(st.sampled_from([1.0, 1.2, 3.0, 20.0])))
    pins: dict[str, tuple[str, ...]] = {}
    for name in rates:
        if draw(st.integers(0, 7)) == 0:
            pins[name] = draw(st.sampled_from([(), ("p-0",)]))
    limit = draw(st.integers(0, 4))
    problem = _problem(rates, pods=pods, slots=slots, limit=limit, pins=pins)
    return Case(problem=problem, slots=slots, pins=pins)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reserve_cases(), st.booleans())
def test_reserve_slots_hold(case: Case, greedy: bool) -> None:
    problem = case.problem
    limit = problem.settings.planner.tail_reserve_max_slots
    try:
        solution = greedy_solution(problem) if greedy else solve(problem, options=FAST)
    except InfeasibleError:
        return
    plan = extract_plan(problem, solution, created_at=AT)
    for pod_id, pod_plan in plan.pods.items():
        named = sum(pod_id in held for held in case.pins.values())
        reserved = pod_plan.reserved_slots
        assert 0 <= reserved <= limit
        # Pins excepted: the reserve leaves a pod its named pins' slots and one at least.
        assert reserved <= max(0, case.slots - max(1, named))
        assert len(pod_plan.hot) <= case.slots - reserved, (pod_id, pod_plan)
