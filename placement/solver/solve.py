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

Time: with a ``Deadline`` from the caller, the limit is wall time for the whole solve,
Python included (``placement.solver.budget``); without one, CP-SAT's wall time, or
with ``SolveOptions.reproducible`` its deterministic time (``placement.solver.timing``,
the deadline then ignored), so that a replay's plans do not depend on how busy the
machine is.

Pure: no IO, no clock but the deadline's (CP-SAT's seconds are reported).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from ortools.sat.python import cp_model

from placement.errors import InfeasibleError, SolverError
from placement.plan import Plan
from placement.solver.assignment import Assignment, evaluate
from placement.solver.budget import MIN_SEARCH_S, Budget
from placement.solver.choose import (
    bound_notes,
    combine_reports,
    empty_solution,
    gap_notes,
    greedy_assignment,
    pack_counts,
    pick_plan,
)
from placement.solver.counts import (
    SCALE,
    ModelVars,
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
from placement.solver.problem import PlacementProblem, PoolProblem
from placement.solver.solution import PoolSolution, Solution, assemble_plan
from placement.solver.timing import Deadline, spent_s

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
#: By a deadline, the most of what is left the exact packing may take: the rest is the
#: widenings' (seed 11's 8B pool's exact packing, never done in time, took the room its
#: widening needed: 2,909.8 against 2,404.6 ms/s). Reserving the widenings in full
#: instead left a 2,000 x 64 pool's exact packing 2.1 of the 6.0 s left, and one run
#: under load returned that benchmark's second pool's greedy plan, probably so (3,360.8
#: against 2,735.96 ms/s in all).
EXACT_SHARE = 0.6
#: A pool whose plan ends further than this from its bound gets a note saying why.
GAP_NOTE = 0.01


def solve(
    problem: PlacementProblem,
    *,
    options: SolveOptions | None = None,
    deadline: Deadline | None = None,
) -> Solution:
    """Solve every pool; raise InfeasibleError with actionable reasons when none exists.

    With a ``deadline`` (and ``options`` not reproducible) the time limit is wall time
    for the whole solve, Python included, ending at the deadline or ``time_limit_s``
    from now, whichever comes first (``placement.solver.budget``); without one, only
    CP-SAT's seconds count against it.
    """
    options = options or options_from(problem)
    reasons = quick_reasons(problem)
    if reasons:
        raise InfeasibleError(reasons)
    budget = _budget(options, deadline)
    sizes = [max(1, len(p.candidates)) for p in problem.pools]
    solutions: list[PoolSolution] = []
    for index, pool in enumerate(problem.pools):
        # Time a pool leaves unused goes to the pools after it, by their size.
        share = _pool_share_s(budget, sizes[index:])
        solution = solve_pool(pool, options, budget=budget.part(share))
        if solution is None:
            raise InfeasibleError(explain_by_relaxing(pool, time_limit_s=max(1.0, share)))
        solutions.append(solution)
    notes = capacity_notes(problem, configured=problem.settings.planner.capacity_headroom)
    notes.extend(bound_notes(solutions))
    notes.extend(gap_notes(solutions, gap_limit=GAP_NOTE))
    return Solution(
        pools=tuple(solutions),
        report=combine_reports(solutions),
        notes=tuple(notes),
    )


def _budget(options: SolveOptions, deadline: Deadline | None) -> Budget:
    """By the deadline, unless there is none or the solve must be reproducible."""
    if deadline is None or options.reproducible:
        return Budget.counted(options.time_limit_s)
    return Budget.until(deadline, limit_s=options.time_limit_s)


def _pool_share_s(budget: Budget, sizes: list[int]) -> float:
    """The next pool's seconds: its size's share of what is left. Counted, at least
    0.5 s (CP-SAT's seconds can overrun a share); by a deadline, nothing more than is
    left."""
    left_s = budget.left_s()
    left_s = max(0.0, left_s) if budget.by_deadline else max(0.5, left_s)
    return left_s * sizes[0] / sum(sizes)


def solve_pool(
    problem: PoolProblem, options: SolveOptions, *, budget: Budget | None = None
) -> PoolSolution | None:
    """One pool's plan, or None when CP-SAT proves its stage 1 infeasible; within
    ``budget`` (by default ``options.time_limit_s`` of CP-SAT's seconds)."""
    budget = budget or Budget.counted(options.time_limit_s)
    fallback = budget.timed("greedy", lambda: greedy_assignment(problem))
    if not problem.candidates:
        return empty_solution(problem)
    # The greedy plan's top-up runs first where it fits beside stage 1, so that the
    # reserves after the search know what a top-up takes; else last, if time is left.
    greedy = fallback[1] if fallback else None
    early = budget.affords("top_up", "build", "pack")
    if early:
        greedy = _topped(problem, greedy, options, budget)
    # Stage 1 leaves a quarter of the pool's time to stage 2 and the greedy's checks;
    # with whole pods in stage 1, half, for the retries and the top-ups.
    share = STAGE1_SHARE if options.per_pod else 0.75
    stage1 = replace(options, time_limit_s=share * budget.limit_s)
    # By a deadline the search leaves room for the packing its counts need; the top-ups
    # after it improve a plan and run only where they still fit.
    first = solve_stage1(problem, stage1, fallback, budget=budget, after=("pack",))
    if first.status == cp_model.INFEASIBLE:
        return None
    assignment, counts, bound = None, first.counts, first.bound
    if counts is not None:
        assignment = _pack(problem, counts, options, budget)
        if options.per_pod:
            assignment = _widened(problem, counts, assignment, options, budget, bound=bound)
        assignment = _retry_tighter(problem, assignment, options, fallback, budget, bound=bound)
    solver_plan = _topped(problem, assignment, options, budget)
    if not early:
        greedy = _topped(problem, greedy, options, budget)
    return pick_plan(
        problem,
        solver_plan,
        greedy,
        budget.searched_s,
        proven=first.status == cp_model.OPTIMAL,
        bound=bound,
        relaxed=first.objective,
    )


def _topped(
    problem: PoolProblem, assignment: Assignment | None, options: SolveOptions, budget: Budget
) -> Assignment | None:
    """With whole pods (``per_pod``), free GPU slots given to the adapters worth most;
    by a deadline, only while a top-up still fits (at 5,000 adapters one takes 7-9 s)."""
    if assignment is None or not options.per_pod or not budget.affords("top_up"):
        return assignment
    return budget.timed("top_up", lambda: top_up(problem, assignment))


@dataclass(frozen=True, kw_only=True)
class Stage1:
    """What stage 1 found: its status, counts (None without a solution), bound, the
    objective of its counts on pool totals (ms/s; None without) and CP-SAT seconds.

    Without a solution the bound is -inf: CP-SAT then answers 0 for its best objective
    bound whether or not it proved one (measured with a deterministic time of 1e-4 on a
    60-adapter pool), and a model with stability credits can go below 0.
    """

    status: cp_model.CpSolverStatus
    counts: Counts | None = None
    bound: float = float("-inf")
    objective: float | None = None
    spent_s: float = 0.0


def solve_stage1(
    problem: PoolProblem,
    options: SolveOptions,
    fallback: tuple[Counts, Assignment] | None,
    *,
    budget: Budget | None = None,
    after: tuple[str, ...] = (),
) -> Stage1:
    """Stage 1 within ``options.time_limit_s`` and, by a deadline, the ``budget``'s time
    left less what the steps ``after`` it need (UNKNOWN, no search, when too little)."""
    budget = budget or Budget.counted(options.time_limit_s)
    unknown = Stage1(status=cp_model.UNKNOWN)
    if not budget.affords("build", *after):
        return unknown
    model, variables = budget.timed("build", lambda: _stage1_model(problem, options, fallback))
    limit_s = budget.search_s(options.time_limit_s, after=after)
    if budget.by_deadline and limit_s < MIN_SEARCH_S:
        return unknown
    solver = cp_solver(replace(options, time_limit_s=limit_s), model_size=len(problem.candidates))
    status = solver.solve(model)
    spent = spent_s(solver, reproducible=options.reproducible)
    budget.charge(spent)
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"pool {problem.pool}: invalid model: {model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Stage1(status=status, spent_s=spent)
    return Stage1(
        status=status,
        counts=counts_from(solver, variables),
        bound=solver.best_objective_bound / SCALE,
        objective=solver.objective_value / SCALE,
        spent_s=spent,
    )


def _stage1_model(
    problem: PoolProblem, options: SolveOptions, fallback: tuple[Counts, Assignment] | None
) -> tuple[cp_model.CpModel, ModelVars]:
    model, variables = build_model(problem, scale=options.scale, per_pod=options.per_pod)
    if fallback is not None:
        add_hint(model, variables, fallback[0])
    return model, variables


def _pack(
    problem: PoolProblem,
    counts: Counts,
    options: SolveOptions,
    budget: Budget,
    *,
    retry: bool = False,
) -> Assignment | None:
    """Stage 2; a retry's goes from the greedy packing straight to the repair.

    The exact packing gets what is left, at least 2 s when counted; by a deadline, what
    is left less its model's building and a top-up, and at most ``EXACT_SHARE`` of it.
    """
    exact_s = budget.search_s(max(2.0, budget.left_s()), after=("build", "top_up"))
    if budget.by_deadline:
        exact_s = min(exact_s, EXACT_SHARE * budget.left_s())

    def step() -> Assignment | None:
        assignment, spent = pack_counts(
            problem,
            counts,
            exact_s=exact_s if exact_s >= MIN_SEARCH_S else 0.0,
            workers=options.workers,
            seed=options.seed,
            quick=retry,
            reproducible=options.reproducible,
        )
        budget.charge(spent)
        return assignment

    # A retry's packing (greedy, then repair) is timed apart: the first one's exact
    # packing, trims and repair took 0.75 s of Python on seed 11's 8B pool, a retry's
    # 0.17 s, and reserving the one for the other left no room for the widening.
    return budget.timed("quick_pack" if retry else "pack", step)


def _widened(
    problem: PoolProblem,
    counts: Counts,
    assignment: Assignment | None,
    options: SolveOptions,
    budget: Budget,
    *,
    bound: float,
) -> Assignment | None:
    """The best of the packed counts and the same counts with their busiest adapters
    spread over more replicas (``widen_counts``), each topped up, by ``evaluate``.

    Stage 1 gives every adapter its fewest replicas; a busy one then fills its pods'
    q90 limit alone. ``bench.solver_overload --seed 3`` (docs/benchmarks.md, 2026-12-01):
    8B pool 3,246.2 -> 2,542.3 ms/s, 70B 5,051.9 -> 4,155.6, against bounds of 2,433.7
    and 3,863.3.
    Skipped when the packed counts are already within the gap limit of the bound; by a
    deadline, each widening only while its packing and three top-ups fit (its own, the
    packed counts' and the chosen plan's).
    """
    if assignment is not None:
        cost = evaluate(problem, assignment).model_total
        if cost - bound <= options.gap_limit * abs(cost):
            return assignment
    plans = [assignment] if assignment is not None else []
    for share in WIDEN_SHARES:
        if not budget.affords("quick_pack", "top_up", "top_up", "top_up"):
            break
        wider = widen_counts(problem, counts, share=share)
        packed = _pack(problem, wider, options, budget, retry=True)
        if packed is not None:
            plans.append(packed)
    if not plans:
        return None
    topped = [_topped(problem, plan, options, budget) or plan for plan in plans]
    return min(topped, key=lambda a: evaluate(problem, a).model_total)


def _retry_tighter(
    problem: PoolProblem,
    assignment: Assignment | None,
    options: SolveOptions,
    fallback: tuple[Counts, Assignment] | None,
    budget: Budget,
    *,
    bound: float,
) -> Assignment | None:
    """When stage 1's counts did not pack near its bound, stage 1 again with less
    headroom (each replica's q90 then leaves room on its pod), keeping the best plan.

    Per-pod q90 limits are a packing that stage 1 only relaxes; counts planned against
    a little less capacity pack with less repair. The bound stays the first solve's.
    Each retry takes a third of the time left, and none starts with under 40% of the
    pool's time left; by a deadline, none without room for its model, its packing and
    two top-ups (its own and the chosen plan's) after the search.
    """
    if assignment is None or not options.per_pod:
        return assignment
    best, best_cost = assignment, evaluate(problem, assignment).model_total
    if best_cost - bound <= options.gap_limit * abs(best_cost):
        return assignment
    for factor in RETRY_HEADROOM:
        left_s = budget.left_s()
        if left_s < max(RETRY_MIN_S, RETRY_MIN_SHARE * budget.limit_s):
            break
        tighter = replace(problem, headroom=problem.headroom * factor)
        counts = solve_stage1(
            tighter,
            replace(options, time_limit_s=left_s / 3),
            fallback,
            budget=budget,
            after=("quick_pack", "top_up", "top_up"),
        ).counts
        if counts is None:
            continue
        packed = _topped(
            problem, _pack(problem, counts, options, budget, retry=True), options, budget
        )
        if packed is not None and evaluate(problem, packed).model_total < best_cost:
            best, best_cost = packed, evaluate(problem, packed).model_total
    return best


def extract_plan(problem: PlacementProblem, solution: Solution, *, created_at: datetime) -> Plan:
    """The plan of a solution: pods' sets, adapters' tiers and weights, preloads, why."""
    return assemble_plan(problem, solution, created_at=created_at)
