"""The placement solver: a problem from catalog, fleet and demand, solved to a plan.

``build_problem`` (``problem``) gathers what the solver sees; ``solve`` (``solve``) runs,
per pool, stage 1 (``counts``: CP-SAT over replica counts per class of identical pods)
and stage 2 (``packing``, ``packing_sat``: which pods), keeps the better of that and the
greedy plan (``greedy``, ``choose``), and says why when no plan exists (``infeasible``);
``extract_plan`` (``solution``) turns the solution into the ``Plan`` every part shares.

Pure: no IO, no clock.
"""

from placement.solver.counts import SolveOptions, options_from
from placement.solver.problem import Demand, PlacementProblem
from placement.solver.problem_build import build_problem
from placement.solver.solution import Solution
from placement.solver.solve import extract_plan, solve

__all__ = [
    "Demand",
    "PlacementProblem",
    "Solution",
    "SolveOptions",
    "build_problem",
    "extract_plan",
    "options_from",
    "solve",
]
