"""Choosing one pool's plan and reporting it: solver against greedy, status, gap.

The greedy plan (``placement.greedy`` counts packed by ``placement.assign``, repairing
what does not fit) is the solver's hint and its fallback; ``pick_plan`` returns the
better of the two by ``evaluate`` and says how it was reached (OPTIMAL, FEASIBLE or
FALLBACK_GREEDY) with the objective, the best bound and the gap.

Pure: no IO, no clock.
"""

from __future__ import annotations

from types import MappingProxyType

from placement.assign import Assignment, assign_pods, evaluate
from placement.errors import InfeasibleError, SolverError
from placement.greedy import ClassKey, Counts, greedy_counts
from placement.plan import SolverReport
from placement.plan_content import PoolSolution
from placement.problem import PoolProblem


def greedy_assignment(problem: PoolProblem) -> tuple[Counts, Assignment] | None:
    """The greedy plan, packed onto pods (repairing what does not fit), with its counts."""
    from placement.explain import honours_pins

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
    fallback: tuple[Counts, Assignment] | None,
    wall_s: float,
    *,
    proven: bool = False,
    bound: float = float("-inf"),
    slack: float = 0.0,
) -> PoolSolution:
    """The better of the solver's and the greedy plan; the greedy when the solver has none."""
    options = []
    if assignment is not None:
        options.append(("solver", assignment, evaluate(problem, assignment)))
    if fallback is not None:
        options.append(("greedy", fallback[1], evaluate(problem, fallback[1])))
    if not options:
        from placement.explain import pin_packing_reasons

        reasons = pin_packing_reasons(problem)
        if reasons:
            raise InfeasibleError(reasons)
        raise SolverError(
            f"pool {problem.pool}: no plan found within the time limit and the greedy "
            "could not pack the pods; raise --time-limit"
        )
    source, chosen, cost = min(options, key=lambda item: item[2].total)
    objective = cost.total
    # Rounded coefficients can lift the bound a hair above a proven objective.
    bound = 0.0 if bound == float("-inf") else min(bound, objective)
    gap = max(0.0, objective - bound) / max(abs(objective), 1e-9)
    if assignment is None:
        status = "FALLBACK_GREEDY"
    elif proven and objective - bound <= max(slack, 1e-4 * abs(objective)):
        status = "OPTIMAL"
    else:
        status = "FEASIBLE"
    report = SolverReport(status=status, objective=objective, bound=bound, gap=gap, wall_s=wall_s)
    return PoolSolution(problem=problem, assignment=chosen, cost=cost, report=report, source=source)


def combine_reports(reports: list[SolverReport]) -> SolverReport:
    objective = sum(r.objective for r in reports)
    bound = sum(r.bound for r in reports)
    statuses = {r.status for r in reports}
    if "FALLBACK_GREEDY" in statuses:
        status = "FALLBACK_GREEDY"
    elif statuses <= {"OPTIMAL"}:
        status = "OPTIMAL"
    else:
        status = "FEASIBLE"
    gap = max(0.0, objective - bound) / max(abs(objective), 1e-9)
    return SolverReport(
        status=status,
        objective=objective,
        bound=bound,
        gap=gap,
        wall_s=sum(r.wall_s for r in reports),
    )
