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

Time is CP-SAT's: wall time, or with ``SolveOptions.reproducible`` its deterministic
time (``placement.solver.timing``), so that a replay's plans do not depend on how busy
the machine is.

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
    gap_notes,
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
from placement.solver.greedy import Counts, widen_counts
from placement.solver.improve import top_up
from placement.solver.infeasible import (
    capacity_notes,
    explain_by_relaxing,
    quick_reasons,
)
from placement.solver.packing import Assignment, evaluate
from placement.solver.problem import PlacementProblem, PoolProblem
from placement.solver.solution import PoolSolution, Solution, assemble_plan
from placement.solver.timing import spent_s

#: Headroom factors of the stage-1 retries when counts do not pack, and the seconds
#: (and share of the pool's time) a retry needs left to start.
RETRY_HEADROOM = (0.97, 0.9)
RETRY_MIN_S = 1.0
RETRY_MIN_SHARE = 0.4
#: The most of a pod's q90 limit one replica of a busy adapter may take when stage 1's
#: counts are spread wider (``placement.solver.greedy.widen_counts``), tried in turn.
WIDEN_SHARES = (0.3, 0.6)
#: The share of a pool's time stage 1 may take.
STAGE1_SHARE = 0.5
#: A pool whose plan ends further than this from its bound gets a note saying why.
GAP_NOTE = 0.01


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
        solution = solve_pool(pool, replace(options, time_limit_s=share))
        if solution is None:
            raise InfeasibleError(explain_by_relaxing(pool, time_limit_s=max(1.0, share)))
        solutions.append(solution)
    notes = capacity_notes(problem, configured=problem.settings.planner.capacity_headroom)
    notes.extend(gap_notes(solutions, gap_limit=GAP_NOTE))
    return Solution(
        pools=tuple(solutions),
        report=combine_reports(solutions),
        notes=tuple(notes),
    )


def solve_pool(problem: PoolProblem, options: SolveOptions) -> PoolSolution | None:
    """One pool's plan, or None when CP-SAT proves its stage 1 infeasible."""
    fallback = greedy_assignment(problem)
    if not problem.candidates:
        return empty_solution(problem)
    # Stage 1 leaves a quarter of the pool's time to stage 2 and the greedy's checks;
    # with whole pods in stage 1, half, for the retries and the top-up (Python time,
    # which CP-SAT's clock does not count).
    share = STAGE1_SHARE if options.per_pod else 0.75
    stage1 = replace(options, time_limit_s=share * options.time_limit_s)
    status, counts, bound, wall_s = solve_stage1(problem, stage1, fallback)
    if status == cp_model.INFEASIBLE:
        return None
    assignment = None
    if counts is not None:
        assignment, extra_s = _pack(problem, counts, options, wall_s)
        wall_s += extra_s
        if options.per_pod:
            assignment = _widened(problem, counts, assignment, options, spent_s=wall_s, bound=bound)
        assignment, extra_s = _retry_tighter(
            problem, assignment, options, fallback, spent_s=wall_s, bound=bound
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
        top_up_free=options.per_pod,
    )


def solve_stage1(
    problem: PoolProblem, options: SolveOptions, fallback: tuple[Counts, Assignment] | None
) -> tuple[cp_model.CpSolverStatus, Counts | None, float, float]:
    """Stage 1's status, counts (None without a solution), bound and seconds.

    Without a solution the bound is -inf: CP-SAT then answers 0 for its best objective
    bound whether or not it proved one (measured with a deterministic time of 1e-4 on a
    60-adapter pool), and a model with stability credits can go below 0.
    """
    model, variables = build_model(problem, scale=options.scale, per_pod=options.per_pod)
    if fallback is not None:
        add_hint(model, variables, fallback[0])
    solver = cp_solver(options, model_size=len(problem.candidates))
    status = solver.solve(model)
    spent = spent_s(solver, reproducible=options.reproducible)
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"pool {problem.pool}: invalid model: {model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return status, None, float("-inf"), spent
    counts = counts_from(solver, variables)
    return status, counts, solver.best_objective_bound / SCALE, spent


def _pack(
    problem: PoolProblem,
    counts: Counts,
    options: SolveOptions,
    spent_s: float,
    *,
    retry: bool = False,
) -> tuple[Assignment | None, float]:
    """Stage 2; a retry's goes from the greedy packing straight to the repair."""
    return pack_counts(
        problem,
        counts,
        time_left_s=options.time_limit_s - spent_s,
        workers=options.workers,
        seed=options.seed,
        quick=retry,
        reproducible=options.reproducible,
    )


def _widened(
    problem: PoolProblem,
    counts: Counts,
    assignment: Assignment | None,
    options: SolveOptions,
    *,
    spent_s: float,
    bound: float,
) -> Assignment | None:
    """The best of the packed counts and the same counts with their busiest adapters
    spread over more replicas (``widen_counts``), each topped up, by ``evaluate``.

    Stage 1 gives every adapter its fewest replicas; a busy one then fills its pods'
    q90 limit alone. ``bench.solver_overload --seed 3`` (docs/benchmarks.md, 2026-12-01):
    8B pool 3,246.2 -> 2,542.3 ms/s, 70B 5,051.9 -> 4,155.6, against bounds of 2,433.7
    and 3,863.3.
    Skipped when the packed counts are already within the gap limit of the bound.
    """
    if assignment is not None:
        cost = evaluate(problem, assignment).model_total
        if cost - bound <= options.gap_limit * abs(cost):
            return assignment
    plans = [assignment] if assignment is not None else []
    for share in WIDEN_SHARES:
        wider = widen_counts(problem, counts, share=share)
        packed, _ = _pack(problem, wider, options, spent_s, retry=True)
        if packed is not None:
            plans.append(packed)
    if not plans:
        return None
    topped = [top_up(problem, a) for a in plans]
    return min(topped, key=lambda a: evaluate(problem, a).model_total)


def _retry_tighter(
    problem: PoolProblem,
    assignment: Assignment | None,
    options: SolveOptions,
    fallback: tuple[Counts, Assignment] | None,
    *,
    spent_s: float,
    bound: float,
) -> tuple[Assignment | None, float]:
    """When stage 1's counts did not pack near its bound, stage 1 again with less
    headroom (each replica's q90 then leaves room on its pod), keeping the best plan.

    Per-pod q90 limits are a packing that stage 1 only relaxes; counts planned against
    a little less capacity pack with less repair. The bound stays the first solve's.
    Each retry takes a third of the time left, and none starts with under 40% of the
    pool's time left: packing and the greedy run in Python, outside CP-SAT's clock.
    """
    if assignment is None or not options.per_pod:
        return assignment, 0.0
    best, best_cost = assignment, evaluate(problem, assignment).model_total
    if best_cost - bound <= options.gap_limit * abs(best_cost):
        return assignment, 0.0
    extra_s = 0.0
    for factor in RETRY_HEADROOM:
        left_s = options.time_limit_s - spent_s - extra_s
        if left_s < max(RETRY_MIN_S, RETRY_MIN_SHARE * options.time_limit_s):
            break
        tighter = replace(problem, headroom=problem.headroom * factor)
        _, counts, _, wall_s = solve_stage1(
            tighter, replace(options, time_limit_s=left_s / 3), fallback
        )
        extra_s += wall_s
        if counts is None:
            continue
        packed, pack_s = _pack(problem, counts, options, spent_s + extra_s, retry=True)
        extra_s += pack_s
        packed = top_up(problem, packed) if packed is not None else None
        if packed is not None and evaluate(problem, packed).model_total < best_cost:
            best, best_cost = packed, evaluate(problem, packed).model_total
    return best, extra_s


def _rounding_slack(problem: PoolProblem) -> float:
    """How far rounding the model's coefficients to 1/SCALE can move an objective."""
    terms = len(problem.candidates) * (3 + 2 * len(problem.classes))
    return terms * 0.5 / SCALE


def extract_plan(problem: PlacementProblem, solution: Solution, *, created_at: datetime) -> Plan:
    """The plan of a solution: pods' sets, adapters' tiers and weights, preloads, why."""
    return assemble_plan(problem, solution, created_at=created_at)
