"""Connect the replay's planning interface to the project's solver (and forecaster).

``solver_planner`` adapts ``placement.solver`` (CP-SAT over pod classes) to the
``Planner`` of ``placement.sim.planning``: forecast rates become ``Demand``, the
pods' GPU contents the current placement, and the plan's hot pods and weights the
``SimPlan``. Of the plan's hot adapters only those forecast at or above
``hot_min_rps`` are protected and routed by weight; the rest stay with the routers'
LRU, which the replays show serves a long tail better than a guess. When the solver
fails (infeasible, or an error) the greedy fallback plans instead, and says so.

The forecaster is the simulator's ``recent_and_yesterday`` until ``placement.forecasting``
offers one (checked at import time of this module's caller, not here).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from placement.domain import AdapterId, Catalog, Fleet, PodId, Tier
from placement.errors import LorafleetError
from placement.settings import Settings
from placement.sim.planning import (
    Planner,
    PlanRequest,
    SimPlan,
    greedy_rate_planner,
    recent_and_yesterday,
)
from placement.sim.replay import PlanningParts

#: CP-SAT time per replan inside a replay: hundreds of replans must fit in minutes.
REPLAY_SOLVER_TIME_S = 0.5


def solver_planner(
    catalog: Catalog, fleet: Fleet, *, settings: Settings, start: datetime
) -> Planner:
    """A ``Planner`` backed by the CP-SAT solver, with the greedy plan as fallback."""
    from placement.problem import Demand, build_problem
    from placement.solver import extract_plan, options_from, solve

    # No availability replicas (seed 001's second copy for a pod failure): a replay
    # has no failures, and each such copy costs a GPU slot the LRU tail would use.
    planner_settings = replace(
        settings,
        planner=replace(settings.planner, time_limit_s=REPLAY_SOLVER_TIME_S, replicate_share=1.0),
    )

    def plan(request: PlanRequest) -> SimPlan:
        demand = {
            AdapterId(name): Demand(mean_rps=rate, q90_rps=rate)
            for name, rate in request.rates.items()
            if rate > 0.0
        }
        current = {
            PodId(pod_id): {AdapterId(name): Tier.HOT for name in names}
            for pod_id, names in request.current.items()
        }
        moment = start + timedelta(seconds=request.now_s)
        try:
            problem = build_problem(
                catalog,
                fleet,
                demand,
                settings=planner_settings,
                valid_from=moment,
                current=current,
            )
            solution = solve(problem, options=options_from(problem))
            full = extract_plan(problem, solution, created_at=moment)
        except (LorafleetError, ValueError):
            return replace(greedy_rate_planner(request), source="greedy (solver failed)")
        protected = {
            name
            for name, entry in full.adapters.items()
            if entry.tier is Tier.HOT and request.rates.get(name, 0.0) >= request.hot_min_rps
        }
        hot = {
            str(pod_id): frozenset(str(name) for name in pod_plan.hot if name in protected)
            for pod_id, pod_plan in full.pods.items()
        }
        weights = {
            str(name): {str(pod): share for pod, share in full.hot_pods(name).items()}
            for name in protected
        }
        return SimPlan(hot=hot, weights=weights, source="solver")

    return plan


def planning_parts(
    catalog: Catalog, fleet: Fleet, *, settings: Settings, start: datetime
) -> PlanningParts:
    """The solver-backed planning the ``lorafleet`` and ``oracle`` policies use."""
    planner = solver_planner(catalog, fleet, settings=settings, start=start)
    return PlanningParts(
        forecaster=recent_and_yesterday,
        planner=planner,
        oracle_planner=planner,
        description="recent-and-yesterday forecast (sim fallback), CP-SAT solver plan",
    )
