"""The ``Planner`` port (demand to ``Plan``) and its two implementations over the solver.

The controller ticks through this port and so does the replay simulator; neither
builds a problem itself. ``SolverPlanner`` is the placement of record (``build_problem``
→ ``solve`` → ``extract_plan``, hinted with the plan in force); ``GreedyPlanner`` is the
solver's greedy plan alone (its hint and fallback), no CP-SAT, for fast replays.

Pure but for the clocks it is given and one log line: no IO. A stage-1 bound above its
plan's cost (an invalid cut, ``placement.solver.choose.bound_notes``) is logged as a
warning, since a controller's plans carry no notes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Protocol

from placement.clock import Clock
from placement.domain import AdapterId, Catalog, Fleet
from placement.errors import InfeasibleError
from placement.plan import Plan
from placement.settings import Settings
from placement.solver.choose import (
    bound_notes,
    combine_reports,
    empty_solution,
    greedy_assignment,
    pick_plan,
)
from placement.solver.counts import options_from
from placement.solver.improve import top_up
from placement.solver.infeasible import capacity_notes, quick_reasons
from placement.solver.problem import Demand, PlacementProblem, PoolProblem
from placement.solver.problem_build import build_problem
from placement.solver.solution import PoolSolution, Solution
from placement.solver.solve import extract_plan, solve
from placement.solver.timing import Deadline

logger = logging.getLogger(__name__)


class Planner(Protocol):
    def __call__(
        self,
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan: ...


class _ProblemPlanner:
    """A ``Planner`` over the solver's problem: it builds the problem, has ``_solve``
    solve it (each subclass its own way) and extracts the plan."""

    def __init__(self, catalog: Catalog, *, settings: Settings, clock: Clock | None) -> None:
        self._catalog = catalog
        self._settings = settings
        self._clock = clock

    def __call__(
        self,
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan:
        deadline = self._deadline()  # before the building, which the time limit counts
        problem = build_problem(
            self._catalog,
            fleet,
            demand,
            settings=self._settings,
            valid_from=valid_from,
            current=current.placement() if current is not None else None,
        )
        solution = self._solve(problem, deadline=deadline)
        return extract_plan(problem, solution, created_at=self._created_at(valid_from))

    def _deadline(self) -> Deadline | None:
        """The whole plan's deadline, started now; None: no deadline."""
        return None

    def _solve(self, problem: PlacementProblem, *, deadline: Deadline | None) -> Solution:
        """The problem's solution, within ``deadline`` (``_deadline``'s) where one is set."""
        raise NotImplementedError

    def _created_at(self, valid_from: datetime) -> datetime:
        # Without a clock (a replay) a plan is made at the moment it takes effect.
        if self._clock is None:
            return valid_from
        return datetime.fromtimestamp(self._clock(), UTC)


class SolverPlanner(_ProblemPlanner):
    """The CP-SAT placement, hinted with the plan in force.

    ``reproducible`` (by default: without a clock, as a replay plans) solves by CP-SAT's
    deterministic time (``SolveOptions.reproducible``), so that a replay gives the same
    plans, and the same figures, however busy the machine; the controller, with a clock,
    plans by the wall clock within its time limit. With ``deadline_clock`` (monotonic
    seconds, not the warped scenario ``clock``) and not reproducible, the time limit is
    a deadline for the whole plan, the problem's building included
    (``placement.solver.budget``); without it only CP-SAT's seconds count.
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        settings: Settings,
        clock: Clock | None,
        reproducible: bool | None = None,
        deadline_clock: Clock | None = None,
    ) -> None:
        super().__init__(catalog, settings=settings, clock=clock)
        self._reproducible = clock is None if reproducible is None else reproducible
        self._deadline_clock = None if self._reproducible else deadline_clock

    def _deadline(self) -> Deadline | None:
        if self._deadline_clock is None:
            return None
        limit_s = self._settings.planner.time_limit_s
        return Deadline.after(limit_s, clock=self._deadline_clock)

    def _solve(self, problem: PlacementProblem, *, deadline: Deadline | None) -> Solution:
        options = options_from(problem, reproducible=self._reproducible)
        solution = solve(problem, options=options, deadline=deadline)
        for note in bound_notes(list(solution.pools)):
            logger.warning("%s", note)
        return solution


class GreedyPlanner(_ProblemPlanner):
    """The solver's greedy plan (its hint and its fallback) without CP-SAT; the plan's
    status says FALLBACK_GREEDY."""

    def _solve(self, problem: PlacementProblem, *, deadline: Deadline | None) -> Solution:
        return greedy_solution(problem)


def greedy_solution(problem: PlacementProblem) -> Solution:
    """Every pool's greedy plan; InfeasibleError (or SolverError) when one cannot be packed."""
    reasons = quick_reasons(problem)
    if reasons:
        raise InfeasibleError(reasons)
    pools = [
        _greedy_plan(pool) if pool.candidates else empty_solution(pool) for pool in problem.pools
    ]
    notes = capacity_notes(problem, configured=problem.settings.planner.capacity_headroom)
    return Solution(pools=tuple(pools), report=combine_reports(pools), notes=tuple(notes))


def _greedy_plan(pool: PoolProblem) -> PoolSolution:
    fallback = greedy_assignment(pool)
    return pick_plan(pool, None, top_up(pool, fallback[1]) if fallback else None, 0.0)
