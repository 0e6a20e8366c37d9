"""Class priority: when GPU slots are short, production adapters keep them first.

With room for k adapters hot, no experiment is hot while a production adapter with at
least its demand is not, and no batch adapter either; with room for all, every class
is hot; the plan's explanation names a class other than production.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from placement.domain import Adapter, AdapterClass, AdapterId
from placement.settings import PlannerSettings, Settings
from placement.solver import Solution, SolveOptions, build_problem, extract_plan, solve
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FAST = SolveOptions(time_limit_s=1.0, workers=1, seed=0, gap_limit=PlannerSettings().gap_limit)
#: One replica per hot adapter, so that k slots hold k adapters.
SETTINGS = Settings(planner=PlannerSettings(replicate_share=1.0))


def classed(name: str, cls: AdapterClass, *, size_mib: int = 50) -> Adapter:
    return replace(adapter(name, size_mib=size_mib), adapter_class=cls)


def plan_for(
    adapters: list[Adapter], rates: dict[str, float], *, pods: int, slots: int
) -> tuple[Solution, set[AdapterId]]:
    fl = fleet(pool("p", pods, max_loras=slots, max_cpu_loras=4 * slots + len(adapters)))
    problem = build_problem(catalog(*adapters), fl, demand(rates), settings=SETTINGS, valid_from=AT)
    solution = solve(problem, options=FAST)
    return solution, {a for s in solution.pools for a in s.assignment.hot}


def outranked(adapters: list[Adapter], rates: dict[str, float], hot: set[AdapterId]) -> list[str]:
    """Pairs (lower class hot, production not hot with at least its demand)."""
    production = [a for a in adapters if a.adapter_class is AdapterClass.PRODUCTION]
    lower = [a for a in adapters if a.adapter_class is not AdapterClass.PRODUCTION]
    return [
        f"{low.name} ({low.adapter_class}, {rates[low.name]}) hot, {p.name} ({rates[p.name]}) not"
        for low in lower
        if low.name in hot
        for p in production
        if p.name not in hot and rates[p.name] >= rates[low.name]
    ]


@st.composite
def fleets_short_of_slots(draw: st.DrawFn) -> tuple[list[Adapter], dict[str, float], int, int]:
    n = draw(st.integers(2, 9))
    pods = draw(st.integers(1, 2))
    slots = draw(st.integers(1, max(1, (n - 1) // pods)))
    adapters = [
        classed(
            f"a{i}",
            draw(st.sampled_from(list(AdapterClass))),
            size_mib=draw(st.sampled_from([20, 50, 120])),
        )
        for i in range(n)
    ]
    rates: dict[str, float] = {a.name: draw(st.integers(1, 40)) / 10 for a in adapters}
    return adapters, rates, pods, slots


@given(fleets_short_of_slots())
def test_no_lower_class_is_hot_while_a_busier_production_adapter_is_not(
    case: tuple[list[Adapter], dict[str, float], int, int],
) -> None:
    adapters, rates, pods, slots = case
    _, hot = plan_for(adapters, rates, pods=pods, slots=slots)
    assert outranked(adapters, rates, hot) == []


def test_an_experiment_as_busy_as_production_yields_its_slot() -> None:
    # Two slots, three adapters equally busy: production goes first.
    adapters = [
        classed("prod-a", AdapterClass.PRODUCTION),
        classed("prod-b", AdapterClass.PRODUCTION),
        classed("exp", AdapterClass.EXPERIMENT),
    ]
    rates = {"prod-a": 1.0, "prod-b": 1.0, "exp": 1.0}
    _, hot = plan_for(adapters, rates, pods=1, slots=2)
    assert hot == {AdapterId("prod-a"), AdapterId("prod-b")}


def test_batch_keeps_its_slot_before_an_experiment() -> None:
    adapters = [classed("batch", AdapterClass.BATCH), classed("exp", AdapterClass.EXPERIMENT)]
    _, hot = plan_for(adapters, {"batch": 1.0, "exp": 1.0}, pods=1, slots=1)
    assert hot == {AdapterId("batch")}


def test_with_room_for_all_every_class_is_hot_and_the_plan_says_its_class() -> None:
    adapters = [
        classed("prod", AdapterClass.PRODUCTION),
        classed("exp", AdapterClass.EXPERIMENT),
    ]
    rates = {"prod": 1.0, "exp": 0.5}
    fl = fleet(pool("p", 1, max_loras=4, max_cpu_loras=8))
    problem = build_problem(catalog(*adapters), fl, demand(rates), settings=SETTINGS, valid_from=AT)
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    assert {a for a, p in plan.adapters.items() if p.tier.value == "hot"} == {"prod", "exp"}
    assert "class experiment (counted at 10%)" in plan.why[AdapterId("exp")]
    assert "class" not in plan.why[AdapterId("prod")]


def test_an_experiment_left_out_is_explained_by_its_class() -> None:
    adapters = [classed("prod", AdapterClass.PRODUCTION), classed("exp", AdapterClass.EXPERIMENT)]
    fl = fleet(pool("p", 1, max_loras=1, max_cpu_loras=8))
    problem = build_problem(
        catalog(*adapters), fl, demand({"prod": 1.0, "exp": 1.0}), settings=SETTINGS, valid_from=AT
    )
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    assert (
        "class experiment: GPU slots go to production adapters first" in plan.why[AdapterId("exp")]
    )
