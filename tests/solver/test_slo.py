"""Tenant SLOs: a tighter TTFT SLO makes an adapter's GPU residency worth more.

With slots for k adapters and equal demand, no adapter with a looser SLO is hot while
one with a tighter SLO is not; the weight is the reference SLO over the adapter's,
clipped; the plan's explanation names the SLO's weight.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.domain import Adapter, AdapterId
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, build_problem, extract_plan, solve
from placement.solver.problem_build import slo_weight
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FAST = SolveOptions(time_limit_s=1.0, workers=1, seed=0, gap_limit=PlannerSettings().gap_limit)
#: One replica per hot adapter, so that k slots hold k adapters.
SETTINGS = Settings(planner=PlannerSettings(replicate_share=1.0))
SLOS = [None, 200.0, 300.0, 500.0, 1000.0, 2000.0, 5000.0]


def with_slo(name: str, slo_ttft_ms: float | None) -> Adapter:
    return replace(adapter(name), slo_ttft_ms=slo_ttft_ms)


def effective(slo_ttft_ms: float | None) -> float:
    return slo_weight(slo_ttft_ms, SETTINGS.planner)


def hot_set(adapters: list[Adapter], *, pods: int, slots: int) -> set[AdapterId]:
    rates = {str(a.name): 1.0 for a in adapters}
    fl = fleet(pool("p", pods, max_loras=slots, max_cpu_loras=4 * slots + len(adapters)))
    problem = build_problem(catalog(*adapters), fl, demand(rates), settings=SETTINGS, valid_from=AT)
    solution = solve(problem, options=FAST)
    return {a for s in solution.pools for a in s.assignment.hot}


@st.composite
def slots_short(draw: st.DrawFn) -> tuple[list[Adapter], int, int]:
    n = draw(st.integers(2, 8))
    pods = draw(st.integers(1, 2))
    slots = draw(st.integers(1, max(1, (n - 1) // pods)))
    adapters = [with_slo(f"a{i}", draw(st.sampled_from(SLOS))) for i in range(n)]
    return adapters, pods, slots


@given(slots_short())
def test_no_looser_slo_is_hot_while_a_tighter_one_is_not(
    case: tuple[list[Adapter], int, int],
) -> None:
    adapters, pods, slots = case
    hot = hot_set(adapters, pods=pods, slots=slots)
    assert len(hot) == min(len(adapters), pods * slots)
    inverted = [
        f"{loose.name} (SLO {loose.slo_ttft_ms}) hot, {tight.name} (SLO {tight.slo_ttft_ms}) not"
        for loose in adapters
        if loose.name in hot
        for tight in adapters
        if tight.name not in hot and effective(tight.slo_ttft_ms) > effective(loose.slo_ttft_ms)
    ]
    assert inverted == []


def test_the_tighter_slo_takes_the_one_slot_whatever_the_order() -> None:
    for names in (("tight", "loose"), ("loose", "tight")):
        slos = {"tight": 300.0, "loose": 3000.0}
        adapters = [with_slo(n, slos[n]) for n in names]
        assert hot_set(adapters, pods=1, slots=1) == {AdapterId("tight")}


@pytest.mark.parametrize(
    ("slo_ttft_ms", "weight"),
    [
        pytest.param(None, 1.0, id="no-slo"),
        pytest.param(1000.0, 1.0, id="reference"),
        pytest.param(500.0, 2.0, id="twice-as-tight"),
        pytest.param(100.0, 4.0, id="clipped-high"),
        pytest.param(10_000.0, 0.5, id="clipped-low"),
        pytest.param(0.0, 1.0, id="zero-ignored"),
    ],
)
def test_the_weight_is_the_reference_over_the_slo_clipped(
    slo_ttft_ms: float | None, weight: float
) -> None:
    assert slo_weight(slo_ttft_ms, PlannerSettings()) == pytest.approx(weight)


def test_the_plan_says_how_the_slo_counts() -> None:
    adapters = [with_slo("tight", 250.0), with_slo("loose", 4000.0)]
    fl = fleet(pool("p", 1, max_loras=1, max_cpu_loras=8))
    rates = {"tight": 1.0, "loose": 1.0}
    problem = build_problem(catalog(*adapters), fl, demand(rates), settings=SETTINGS, valid_from=AT)
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    assert "TTFT SLO counts its GPU saving at 400%" in plan.why[AdapterId("tight")]
    assert "a loose TTFT SLO counts its GPU saving at 50%" in plan.why[AdapterId("loose")]
