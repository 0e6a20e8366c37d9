"""The placement solver: CP-SAT over replica counts per pool, then pods, then a plan.

Two stages, one pool at a time (pools share nothing, so each is its own problem):

1. ``build_model`` (CP-SAT): for every adapter, whether it is hot or warm and how many
   hot replicas and warm registrations it has in each class of identical pods, within
   the class totals of slots, host places and bytes. Pods of a class are
   interchangeable, so this model has a handful of variables per adapter instead of
   one per (adapter, pod), and its optimum bounds the full problem's.
2. ``placement.solver.choose.pack_counts``: which pods of the class, with every per-pod budget
   checked (greedy packing, an exact CP-SAT packing for small pools, trimming).

The objective is in one unit, milliseconds of request delay per second: requests of
a warm adapter wait a host-to-GPU load, those of a cold one a storage load (both by
the forecast mean), plus the plan's own loads amortised over its validity; stage 2
adds the load imbalance. A greedy plan is the hint and the fallback; the plan
returned is never worse than the greedy one by ``evaluate``.

Pure: no IO, no clock (wall time is measured by CP-SAT and reported).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from ortools.sat.python import cp_model

from placement.errors import InfeasibleError, SolverError
from placement.plan import Plan
from placement.solver.choose import (
    combine_reports,
    empty_solution,
    greedy_assignment,
    pack_counts,
    pick_plan,
)
from placement.solver.counts import (
    SCALE,
    SolveOptions,
    add_hint,
    build_model,
    counts_from,
    cp_solver,
    options_from,
)
from placement.solver.infeasible import capacity_notes, explain_by_relaxing, quick_reasons
from placement.solver.problem import PlacementProblem, PoolProblem
from placement.solver.solution import PoolSolution, Solution, assemble_plan


def solve(problem: PlacementProblem, *, options: SolveOptions | None = None) -> Solution:
    """Solve every pool; raise InfeasibleError with actionable reasons when none exists."""
    options = options or options_from(problem)
    reasons = quick_reasons(problem)
    if reasons:
        raise InfeasibleError(reasons)
    sizes = [max(1, len(p.candidates)) for p in problem.pools]
    solutions: list[PoolSolution] = []
    for index, pool in enumerate(problem.pools):
        # Time a pool leaves unused goes to the pools after it, by their size.
        left_s = options.time_limit_s - sum(s.report.wall_s for s in solutions)
        share = max(0.5, left_s) * sizes[index] / sum(sizes[index:])
        solution = _solve_pool(pool, replace(options, time_limit_s=share))
        if solution is None:
            raise InfeasibleError(explain_by_relaxing(pool, time_limit_s=max(1.0, share)))
        solutions.append(solution)
    notes = capacity_notes(problem, configured=problem.settings.planner.capacity_headroom)
    return Solution(
        pools=tuple(solutions),
        report=combine_reports(solutions),
        notes=tuple(notes),
    )


def _solve_pool(problem: PoolProblem, options: SolveOptions) -> PoolSolution | None:
    """One pool's plan, or None when CP-SAT proves its stage 1 infeasible."""
    fallback = greedy_assignment(problem)
    if not problem.candidates:
        return empty_solution(problem)
    model, variables = build_model(problem, scale=options.scale)
    if fallback is not None:
        add_hint(model, variables, fallback[0])
    # Stage 1 leaves a quarter of the pool's time to stage 2 and the greedy's checks.
    solver = cp_solver(
        replace(options, time_limit_s=0.75 * options.time_limit_s),
        model_size=len(problem.candidates),
    )
    status = solver.solve(model)
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"pool {problem.pool}: invalid model: {model.validate()}")
    if status == cp_model.INFEASIBLE:
        return None
    assignment = None
    bound = float("-inf")
    wall_s = solver.wall_time
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = solver.best_objective_bound / SCALE
        assignment, extra_s = pack_counts(
            problem,
            counts_from(solver, variables),
            time_left_s=options.time_limit_s - solver.wall_time,
            workers=options.workers,
            seed=options.seed,
        )
        wall_s += extra_s
    return pick_plan(
        problem,
        assignment,
        fallback,
        wall_s,
        proven=status == cp_model.OPTIMAL,
        bound=bound,
        slack=_rounding_slack(problem),
    )


def _rounding_slack(problem: PoolProblem) -> float:
    """How far rounding the model's coefficients to 1/SCALE can move an objective."""
    terms = len(problem.candidates) * (3 + 2 * len(problem.classes))
    return terms * 0.5 / SCALE


def extract_plan(problem: PlacementProblem, solution: Solution, *, created_at: datetime) -> Plan:
    """The plan of a solution: pods' sets, adapters' tiers and weights, preloads, why."""
    return assemble_plan(problem, solution, created_at=created_at)
