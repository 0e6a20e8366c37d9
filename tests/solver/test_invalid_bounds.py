"""A stage-1 bound above its plan's cost is a solver bug, and it is made visible.

``pick_plan`` keeps the plan and reports its cost as the bound (the gap cannot go
below zero), but records how far the bound was above it (``bound_excess``); the solve's
notes name the pool, the bound and the plan's cost, and ``SolverPlanner`` logs them
as warnings. Rounding (``rounding_slack``) is no such excess.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from placement.settings import Settings
from placement.solver import Solution, SolveOptions, build_problem, solve
from placement.solver import planner as planner_module
from placement.solver.assignment import evaluate
from placement.solver.choose import bound_notes, counts_of, greedy_assignment, pick_plan
from placement.solver.counts import rounding_slack
from placement.solver.planner import SolverPlanner
from placement.solver.problem import PlacementProblem, PoolProblem
from placement.solver.timing import Deadline
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
RATES = {"a": 2.0, "b": 1.0, "c": 0.5}


def _pool() -> PoolProblem:
    cat = catalog(*(adapter(name) for name in RATES))
    fl = fleet(pool("p", 1, max_loras=1, max_cpu_loras=2))
    return build_problem(cat, fl, demand(RATES), settings=Settings(), valid_from=AT).pools[0]


@pytest.mark.parametrize(
    ("tolerances_above", "flagged"),
    [(0.0, False), (0.9, False), (400.0, True)],
    ids=["at-the-plan", "within-rounding", "an-invalid-cut"],
)
def test_a_bound_above_the_plan_is_kept_visible(tolerances_above: float, flagged: bool) -> None:
    # Rounding (rounding_slack at the plan's counts) or 1e-4 of the plan's cost, the
    # larger, is no invalid cut.
    problem = _pool()
    greedy = greedy_assignment(problem)
    assert greedy is not None
    cost = evaluate(problem, greedy[1]).model_total
    slack = rounding_slack(problem, counts_of(problem, greedy[1]))
    above = tolerances_above * max(slack, 1e-4 * cost)
    solved = pick_plan(problem, greedy[1], None, 0.1, bound=cost + above)
    assert solved.report.bound == pytest.approx(cost)
    assert solved.report.gap == 0.0
    assert (solved.bound_excess > 0) is flagged
    notes = bound_notes([solved])
    if flagged:
        assert solved.bound_excess == pytest.approx(above)
        assert notes == [
            f"pool p: stage 1's bound {cost + above:.6g} ms/s is above the plan's cost "
            f"{cost:.6g} ms/s beyond rounding: a cut of stage 1 is not valid for this pool "
            "(a solver bug); the plan is kept and its cost reported as the bound"
        ]
    else:
        assert notes == []


def test_a_planner_logs_an_invalid_bound_as_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = solve

    def with_an_invalid_cut(
        problem: PlacementProblem,
        *,
        options: SolveOptions | None = None,
        deadline: Deadline | None = None,
    ) -> Solution:
        solution = real(problem, options=options, deadline=deadline)
        pools = tuple(replace(s, bound_excess=7.0) for s in solution.pools)
        return replace(solution, pools=pools)

    monkeypatch.setattr(planner_module, "solve", with_an_invalid_cut)
    cat = catalog(*(adapter(name) for name in RATES))
    fl = fleet(pool("p", 1, max_loras=1, max_cpu_loras=2))
    planner = SolverPlanner(cat, settings=Settings(), clock=None)
    with caplog.at_level(logging.WARNING, logger="placement.solver.planner"):
        planner(demand(RATES), fleet=fl, valid_from=AT, current=None)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("pool p: stage 1's bound ")
    assert "above the plan's cost" in record.getMessage()


def test_a_solve_of_a_valid_pool_flags_nothing() -> None:
    cat = catalog(*(adapter(name) for name in RATES))
    fl = fleet(pool("p", 2, max_loras=1, max_cpu_loras=2))
    problem = build_problem(cat, fl, demand(RATES), settings=Settings(), valid_from=AT)
    options = SolveOptions(time_limit_s=1.0, workers=1, seed=0, gap_limit=0.0)
    solution = solve(problem, options=options)
    assert [s.bound_excess for s in solution.pools] == [0.0]
    assert not any("stage 1's bound" in note for note in solution.notes)
