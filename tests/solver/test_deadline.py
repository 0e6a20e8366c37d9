"""The time limit as a deadline for the whole solve, Python included.

A ``Budget`` by a deadline gives each CP-SAT search what is left less what the steps
after it were measured to need, and an expired deadline still gives the greedy plan;
a budget counted in CP-SAT's seconds (a reproducible solve's, or one without a clock)
is the arithmetic from before, so a replay's plans do not move. Clocks here are
``ManualClock``s moved by the steps themselves: no wall time, no timing assertions.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import pytest

from placement.clock import ManualClock
from placement.domain import AdapterId, Catalog, Fleet
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, build_problem, solve
from placement.solver.budget import GUESS_OVER_GREEDY, MARGIN, Budget
from placement.solver.planner import SolverPlanner
from placement.solver.problem import Demand, PlacementProblem
from placement.solver.solve import solve_pool
from placement.solver.timing import Deadline
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
RATES = {f"a{i}": 3.0 / (i + 1) for i in range(30)}


def _setup() -> tuple[Catalog, Fleet]:
    return catalog(*(adapter(name) for name in RATES)), fleet(
        pool("p", 6, max_loras=4, max_cpu_loras=8)
    )


def _problem() -> PlacementProblem:
    cat, fl = _setup()
    return build_problem(cat, fl, demand(RATES), settings=Settings(), valid_from=AT)


def _options(*, reproducible: bool = False) -> SolveOptions:
    return SolveOptions(
        time_limit_s=5.0,
        workers=1,
        seed=0,
        gap_limit=PlannerSettings().gap_limit,
        reproducible=reproducible,
    )


class JumpingClock:
    """Monotonic seconds that jump ``step_s`` at every read after the first."""

    def __init__(self, step_s: float) -> None:
        self.now_s, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        now_s = self.now_s
        self.now_s += self.step_s
        return now_s


def _deadline_budget(clock: ManualClock, limit_s: float) -> Budget:
    return Budget.until(Deadline.after(limit_s, clock=clock), limit_s=limit_s)


def test_a_search_gets_what_is_left_less_what_the_steps_after_it_need() -> None:
    clock = ManualClock()
    budget = _deadline_budget(clock, 10.0)
    budget.timed("greedy", lambda: clock.advance(0.2))
    budget.timed("top_up", lambda: clock.advance(0.5))
    pack_s = GUESS_OVER_GREEDY["pack"] * 0.2
    assert budget.need_s("pack", "top_up") == pytest.approx(MARGIN * (pack_s + 0.5))
    # Far from the deadline a search gets what it asks for; near it, what is left less
    # the reserve for the packing and the top-up after it.
    assert budget.search_s(4.0, after=("pack", "top_up")) == 4.0
    clock.advance(7.3)
    left_s = 10.0 - 0.7 - 7.3
    wanted_s = budget.search_s(4.0, after=("pack", "top_up"))
    assert wanted_s == pytest.approx(left_s - MARGIN * (pack_s + 0.5))
    assert budget.affords("pack") and not budget.affords("pack", "top_up", "top_up")


def test_a_step_is_measured_without_the_searches_inside_it() -> None:
    clock = ManualClock()
    budget = _deadline_budget(clock, 10.0)

    def pack_with_a_search() -> None:
        clock.advance(0.3)
        clock.advance(2.0)
        budget.charge(2.0)

    budget.timed("pack", pack_with_a_search)
    assert budget.need_s("pack") == pytest.approx(MARGIN * 0.3)
    assert budget.searched_s == 2.0


def test_a_pools_part_ends_by_the_deadline_and_charges_the_whole() -> None:
    clock = ManualClock()
    budget = _deadline_budget(clock, 10.0)
    clock.advance(6.0)
    pool_budget = budget.part(8.0)
    assert pool_budget.left_s() == pytest.approx(4.0)
    pool_budget.charge(1.5)
    assert budget.searched_s == 1.5


def test_a_counted_budget_counts_only_cp_sats_seconds() -> None:
    budget = Budget.counted(10.0)
    part = budget.part(4.0)
    part.timed("greedy", lambda: None)
    part.charge(3.0)
    assert budget.left_s() == 7.0 and part.left_s() == 1.0
    assert part.need_s("pack", "top_up") == 0.0 and part.affords("build", "pack")
    assert part.search_s(9.0, after=("pack",)) == 9.0


def test_an_expired_deadline_still_gives_the_greedy_plan() -> None:
    (pool_problem,) = _problem().pools
    clock = ManualClock()
    expired = Budget.until(Deadline(clock=clock, end_s=-1.0), limit_s=5.0)
    solved = solve_pool(pool_problem, _options(), budget=expired)
    assert solved is not None
    assert solved.report.status in ("FALLBACK_GREEDY", "FEASIBLE")
    assert solved.source == "greedy"
    assert solved.report.wall_s == 0.0, "no CP-SAT search starts past the deadline"


def test_a_deadline_too_close_for_a_search_gives_the_greedy_plan() -> None:
    # Every read of the clock moves it a second: the greedy plan alone spends the 3 s.
    problem = _problem()
    deadline = Deadline.after(3.0, clock=JumpingClock(1.0))
    solution = solve(problem, options=_options(), deadline=deadline)
    assert solution.report.status == "FALLBACK_GREEDY"
    assert solution.report.wall_s == 0.0


def test_a_deadline_with_time_left_solves_as_the_counted_budget_does() -> None:
    problem = _problem()
    deadline = Deadline.after(5.0, clock=ManualClock())
    by_deadline = solve(problem, options=_options(), deadline=deadline)
    counted = solve(problem, options=_options())
    assert by_deadline.report.status == counted.report.status == "OPTIMAL"
    assert by_deadline.report.objective == pytest.approx(counted.report.objective)


def test_a_reproducible_solve_ignores_the_deadline() -> None:
    problem = _problem()
    expired = Deadline(clock=ManualClock(), end_s=-1.0)
    options = _options(reproducible=True)
    with_deadline = solve(problem, options=options, deadline=expired)
    without = solve(problem, options=options)
    assert with_deadline.report == without.report
    assert with_deadline.pools[0].assignment == without.pools[0].assignment


def _plan_status(planner: SolverPlanner) -> str:
    _, fl = _setup()
    rates: Mapping[AdapterId, Demand] = demand(RATES)
    return planner(rates, fleet=fl, valid_from=AT, current=None).solver.status


def test_a_planner_with_a_deadline_clock_plans_within_its_deadline() -> None:
    cat, _ = _setup()
    live = SolverPlanner(
        cat, settings=Settings(), clock=AT.timestamp, deadline_clock=JumpingClock(100.0)
    )
    assert _plan_status(live) == "FALLBACK_GREEDY"
    replay = SolverPlanner(cat, settings=Settings(), clock=None, deadline_clock=JumpingClock(100.0))
    assert _plan_status(replay) in ("OPTIMAL", "FEASIBLE")
