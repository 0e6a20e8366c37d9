"""Choosing one pool's plan and reporting it: solver against greedy, status, gap.

The greedy plan (``greedy`` counts packed by ``packing``, repairing what does not fit)
is the solver's hint and its fallback; ``pick_plan`` returns the better of the two by
``evaluate`` and says how it was reached (OPTIMAL, FEASIBLE or FALLBACK_GREEDY)
with the objective, the best bound and the gap, and whether the bound had to be
lowered to the plan's cost (``bound_notes``: an invalid cut).

Pure: no IO, no clock.
"""

from __future__ import annotations

from types import MappingProxyType

from placement.errors import InfeasibleError, SolverError
from placement.plan import SolverReport
from placement.solver.assignment import Assignment, evaluate
from placement.solver.counts import rounding_slack
from placement.solver.greedy import ClassKey, Counts, greedy_counts, trim_counts
from placement.solver.infeasible import honours_pins, pin_packing_reasons
from placement.solver.packing import assign_around, assign_pods
from placement.solver.packing_sat import pack_hot
from placement.solver.problem import PoolProblem
from placement.solver.solution import PoolSolution

#: Above this many (adapter, pod) pairs the exact stage-2 model is skipped: at 10,000
#: adapters on 128 pods (190,000 pairs) it found nothing in 18 s; 10,000 pairs take 2 s.
EXACT_PACKING_PAIRS = 50_000
#: Shares of hot replicas made warm, in turn, when the pods cannot be packed otherwise.
TRIM_FRACTIONS = (0.005, 0.01, 0.03)


def greedy_assignment(problem: PoolProblem) -> tuple[Counts, Assignment] | None:
    """The greedy plan, packed onto pods (repairing what does not fit), with its counts."""
    assignment = assign_pods(problem, greedy_counts(problem), repair=True)
    if assignment is None or not honours_pins(problem, assignment):
        return None
    return counts_of(problem, assignment), assignment


def counts_of(problem: PoolProblem, assignment: Assignment) -> Counts:
    """Replicas per (adapter, class) of an assignment: the hint the model starts from."""
    class_of = problem.class_of()
    hot: dict[ClassKey, int] = {}
    warm: dict[ClassKey, int] = {}
    for held, counts in ((assignment.hot, hot), (assignment.warm, warm)):
        for adapter, pods in held.items():
            for pod in pods:
                key = (adapter, class_of[pod].key)
                counts[key] = counts.get(key, 0) + 1
    return Counts(hot=MappingProxyType(hot), warm=MappingProxyType(warm))


def pick_plan(
    problem: PoolProblem,
    assignment: Assignment | None,
    greedy: Assignment | None,
    wall_s: float,
    *,
    proven: bool = False,
    bound: float = float("-inf"),
    relaxed: float | None = None,
) -> PoolSolution:
    """The better of the solver's plan and the greedy one (each as it is: the caller
    tops them up); the greedy when the solver has none.

    A bound above the chosen plan's cost by more than rounding can lift it
    (``rounding_slack`` at the plan's counts) comes from an invalid cut: the plan is
    kept, the bound reported is its cost, and the pool solution says so
    (``bound_excess``, a note of ``bound_notes``). ``proven`` and ``relaxed`` are
    stage 1's: whether it ended OPTIMAL, and its counts' objective (``gap_notes``).
    """
    options = []
    if assignment is not None:
        options.append(("solver", assignment, evaluate(problem, assignment)))
    if greedy is not None:
        options.append(("greedy", greedy, evaluate(problem, greedy)))
    if not options:
        reasons = pin_packing_reasons(problem)
        if reasons:
            raise InfeasibleError(reasons)
        raise SolverError(
            f"pool {problem.pool}: no plan found within the time limit and the greedy "
            "could not pack the pods; raise --time-limit"
        )
    source, chosen, cost = min(options, key=lambda item: item[2].model_total)
    # The bound is the model's (delay less stability credit), a lower bound on both;
    # rounded coefficients can lift it a hair above a proven objective.
    modelled = cost.model_total
    slack = rounding_slack(problem, counts_of(problem, chosen))
    found = 0.0 if bound == float("-inf") else bound
    excess = found - modelled if found - modelled > _tolerance(modelled, slack) else 0.0
    bound = min(found, modelled)
    if assignment is None:
        status = "FALLBACK_GREEDY"
    elif proven and modelled - bound <= _tolerance(modelled, slack):
        status = "OPTIMAL"
    else:
        status = "FEASIBLE"
    report = SolverReport(
        status=status,
        objective=cost.total,
        bound=bound,
        gap=_gap(modelled, bound),
        wall_s=wall_s,
    )
    return PoolSolution(
        problem=problem,
        assignment=chosen,
        cost=cost,
        report=report,
        source=source,
        bound_excess=excess,
        relaxed_ms_per_s=relaxed,
    )


def _tolerance(modelled: float, slack: float) -> float:
    """How far a valid bound may lie above a plan's cost: rounding, relative or not."""
    return max(slack, 1e-4 * abs(modelled))


def bound_notes(solutions: list[PoolSolution]) -> list[str]:
    """Pools whose stage-1 bound came out above their plan's cost beyond rounding:
    a cut that is not valid there, which the reported bound (the plan's cost) hides."""
    return [
        f"pool {s.problem.pool}: stage 1's bound {s.report.bound + s.bound_excess:.6g} "
        f"ms/s is above the plan's cost {s.cost.model_total:.6g} ms/s beyond rounding: "
        "a cut of stage 1 is not valid for this pool (a solver bug); the plan is kept "
        "and its cost reported as the bound"
        for s in solutions
        if s.bound_excess > 0
    ]


def _gap(modelled: float, bound: float) -> float:
    """The solver's relative gap on its model: how far its plan may be from the best."""
    return max(0.0, modelled - bound) / max(abs(modelled), 1e-9)


def combine_reports(solutions: list[PoolSolution]) -> SolverReport:
    """One report for all pools: sums, the worst status, the gap of the sums."""
    reports = [s.report for s in solutions]
    objective = sum(r.objective for r in reports)
    bound = sum(r.bound for r in reports)
    statuses = {r.status for r in reports}
    if "FALLBACK_GREEDY" in statuses:
        status = "FALLBACK_GREEDY"
    elif statuses <= {"OPTIMAL"}:
        status = "OPTIMAL"
    else:
        status = "FEASIBLE"
    gap = _gap(sum(s.cost.model_total for s in solutions), bound)
    return SolverReport(
        status=status,
        objective=objective,
        bound=bound,
        gap=gap,
        wall_s=sum(r.wall_s for r in reports),
    )


def gap_notes(solutions: list[PoolSolution], *, gap_limit: float) -> list[str]:
    """Pools whose plan ended further from its bound than ``gap_limit``, and what
    the gap is made of there (``_gap_split``).

    Stage 1 counts against pool totals (exact per pod only for GPU slots and bytes);
    a pod's q90 limit is a packing it relaxes. When those limits bind (an overloaded
    pool, or busy adapters whose pods cannot fill their slots) the bound is loose and
    the gap says as much about it as about the plan.
    """
    notes = []
    for solution in solutions:
        report, problem = solution.report, solution.problem
        if report.gap <= gap_limit or report.status == "OPTIMAL":
            continue
        capacity = sum(cls.capacity_rps * cls.size for cls in problem.classes)
        load = (
            f"the pool is overloaded (forecast q90 {problem.q90_total_rps:.4g} rps on "
            f"{capacity:.4g} rps of pods, planned at {problem.headroom:.0%} of capacity)"
            if problem.overloaded
            else "busy adapters leave their pods' slots unusable"
        )
        notes.append(
            f"pool {problem.pool}: the plan is within {report.gap:.1%} of its bound after "
            f"{report.wall_s:.1f} s, not {gap_limit:.1%}: {load}; {_gap_split(solution)}, "
            "so the plan may be closer to the best than that; add pods or raise "
            "capacity_rps to plan with room"
        )
    return notes


def _gap_split(solution: PoolSolution) -> str:
    """What the gap is made of. Stage 1's counts priced on pool totals lie between its
    bound and the plan: above its bound is as far as more stage-1 time could raise
    it (the relaxation's optimum is no higher); above them is per-pod packing, which
    either the plan or the bound leaves, the bound counting each pod's q90 limit only
    as a pool total."""
    relaxed, bound = solution.relaxed_ms_per_s, solution.report.bound
    if relaxed is None:
        return "stage 1 found no counts in its time, so the bound is 0; raise --time-limit"
    plan = solution.cost.model_total
    search = max(0.0, min(relaxed, plan) - bound)
    packing = max(0.0, plan - max(relaxed, bound))
    whole = max(search + packing, 1e-9)
    return (
        f"stage 1's counts cost {relaxed:,.1f} ms/s on pool totals, {search / whole:.0%} "
        "of the gap above its bound (the most more time could raise it), and "
        f"{plan:,.1f} as the pods hold them: {packing / whole:.0%} of the gap is per-pod "
        "packing, and the bound counts each pod's q90 limit only as a pool total"
    )


def pack_counts(
    problem: PoolProblem,
    counts: Counts,
    *,
    exact_s: float,
    workers: int,
    seed: int,
    quick: bool = False,
    reproducible: bool = False,
) -> tuple[Assignment | None, float]:
    """Stage 2 for stage 1's counts, and the CP-SAT seconds it took.

    Pool totals can pack where single pods cannot (bytes and capacity fragment): then
    an exact CP-SAT packing (small pools, given ``exact_s`` seconds; none at 0), else
    the least valuable hot replicas made warm, else a repair that demotes whatever does
    not fit. None only for pins.
    ``quick`` (a retry's) goes from the greedy packing straight to the repair;
    ``reproducible``: the exact packing as ``placement.solver.timing`` says.
    """
    assignment = assign_pods(problem, counts)
    wall_s = 0.0
    if quick:
        return assignment or assign_pods(problem, counts, repair=True), wall_s
    exact = exact_s > 0 and _hot_pairs(problem, counts) <= EXACT_PACKING_PAIRS
    if assignment is None and exact:
        hot, wall_s = pack_hot(
            problem,
            counts,
            time_limit_s=exact_s,
            workers=workers,
            seed=seed,
            reproducible=reproducible,
        )
        if hot is not None:
            assignment = assign_around(problem, counts, hot)
    for fraction in TRIM_FRACTIONS:
        if assignment is None:
            assignment = assign_pods(problem, trim_counts(problem, counts, fraction=fraction))
    if assignment is None:
        assignment = assign_pods(problem, counts, repair=True)
    return assignment, wall_s


def _hot_pairs(problem: PoolProblem, counts: Counts) -> int:
    """(adapter, pod) booleans the exact packing model would need."""
    sizes = {cls.key: cls.size for cls in problem.classes}
    return sum(sizes[key] for (_, key), n in counts.hot.items() if n)


def empty_solution(problem: PoolProblem) -> PoolSolution:
    """A pool with nothing to place: nothing hot, nothing warm, proven optimal."""
    empty = Assignment(hot={}, warm={}, weights={})
    report = SolverReport(status="OPTIMAL", objective=0.0, bound=0.0, gap=0.0, wall_s=0.0)
    return PoolSolution(
        problem=problem,
        assignment=empty,
        cost=evaluate(problem, empty),
        report=report,
        source="solver",
    )
