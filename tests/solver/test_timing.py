"""Reproducible solves: a replay's planner gives the same plan however busy the machine.

With ``SolveOptions.reproducible`` every CP-SAT search runs on one worker and stops by
CP-SAT's deterministic time, and the seconds the solver counts against its budget are
deterministic seconds, so two solves of one problem spend, and decide, alike. A
``SolverPlanner`` without a clock (the replay's) solves so; one with a clock (the
controller's) keeps the wall clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
from ortools.sat.python import cp_model

from placement.domain import AdapterId, Catalog, Fleet
from placement.plan import Plan
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, build_problem, solve
from placement.solver import planner as planner_module
from placement.solver.greedy import greedy_counts
from placement.solver.packing_sat import pack_hot
from placement.solver.planner import SolverPlanner
from placement.solver.problem import Demand, PlacementProblem
from placement.solver.solution import Solution
from placement.solver.timing import DETERMINISTIC_PER_S, WALL_GUARD, Deadline, limit
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
RATES = {f"a{i}": 3.0 / (i + 1) for i in range(40)}


def _setup() -> tuple[Catalog, Fleet]:
    return catalog(*(adapter(name) for name in RATES)), fleet(
        pool("p", 8, max_loras=4, max_cpu_loras=8)
    )


def _problem() -> PlacementProblem:
    cat, fl = _setup()
    return build_problem(cat, fl, demand(RATES), settings=Settings(), valid_from=AT)


def _options(*, reproducible: bool) -> SolveOptions:
    return SolveOptions(
        time_limit_s=2.0,
        workers=2,
        seed=0,
        gap_limit=PlannerSettings().gap_limit,
        reproducible=reproducible,
    )


def test_a_reproducible_search_is_on_one_worker_and_stops_by_deterministic_time() -> None:
    solver = cp_model.CpSolver()
    limit(solver, 0.5, workers=4, seed=3, reproducible=True)
    assert solver.parameters.num_workers == 1
    assert solver.parameters.max_deterministic_time == pytest.approx(0.5 * DETERMINISTIC_PER_S)
    assert solver.parameters.max_time_in_seconds == pytest.approx(0.5 * WALL_GUARD)
    assert solver.parameters.random_seed == 3
    wall = cp_model.CpSolver()
    limit(wall, 0.5, workers=4, seed=3, reproducible=False)
    assert wall.parameters.num_workers == 4
    assert wall.parameters.max_time_in_seconds == pytest.approx(0.5)


def test_the_exact_packing_counts_deterministic_seconds_when_reproducible() -> None:
    (pool_problem,) = _problem().pools
    counts = greedy_counts(pool_problem)
    runs = [
        pack_hot(pool_problem, counts, time_limit_s=2.0, workers=2, seed=0, reproducible=True)
        for _ in range(3)
    ]
    placed = {tuple(sorted(hot.items())) if hot else None for hot, _ in runs}
    seconds = {spent for _, spent in runs}
    assert len(placed) == 1 and None not in placed
    assert len(seconds) == 1, f"deterministic seconds differ between runs: {seconds}"
    assert seconds.pop() > 0.0


def test_a_reproducible_solve_spends_and_decides_alike_every_time() -> None:
    problem = _problem()
    solutions = [solve(problem, options=_options(reproducible=True)) for _ in range(3)]
    assert len({s.report.wall_s for s in solutions}) == 1
    assert len({s.report.objective for s in solutions}) == 1
    assert len({tuple(sorted(s.pools[0].assignment.hot.items())) for s in solutions}) == 1


def _planned_options(
    monkeypatch: pytest.MonkeyPatch, planner: SolverPlanner
) -> tuple[Plan, list[SolveOptions]]:
    seen: list[SolveOptions] = []
    real = solve

    def spy(
        problem: PlacementProblem,
        *,
        options: SolveOptions | None = None,
        deadline: Deadline | None = None,
    ) -> Solution:
        assert options is not None
        seen.append(options)
        return real(problem, options=options, deadline=deadline)

    monkeypatch.setattr(planner_module, "solve", spy)
    rates: Mapping[AdapterId, Demand] = demand(RATES)
    _, fl = _setup()
    plan = planner(rates, fleet=fl, valid_from=AT, current=None)
    return plan, seen


def test_a_planner_without_a_clock_solves_reproducibly_and_one_with_a_clock_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cat, _ = _setup()
    replay = SolverPlanner(cat, settings=Settings(), clock=None)
    plan, seen = _planned_options(monkeypatch, replay)
    assert [o.reproducible for o in seen] == [True]
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")
    live = SolverPlanner(cat, settings=Settings(), clock=AT.timestamp)
    _, seen = _planned_options(monkeypatch, live)
    assert [o.reproducible for o in seen] == [False]
    forced = SolverPlanner(cat, settings=Settings(), clock=None, reproducible=False)
    _, seen = _planned_options(monkeypatch, forced)
    assert [o.reproducible for o in seen] == [False]
