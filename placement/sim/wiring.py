"""Connect the replay's planning interface to the project's solver (and forecaster).

``solver_planner`` adapts ``placement.solver.solve`` (CP-SAT over pod classes) to the
``Planner`` of ``placement.sim.planning``: forecast rates become ``Demand``, the
pods' GPU contents the current placement, and the plan's hot pods and weights the
``SimPlan``. Of the plan's hot adapters only those forecast at or above
``hot_min_rps`` are protected and routed by weight; the rest stay with the routers'
LRU, which the replays show serves a long tail better than a guess. When the solver
fails (infeasible, or an error) the greedy fallback plans instead, and says so.

``ModelsForecaster`` adapts ``placement.forecast.forecaster.forecast_demand``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pandas as pd

from placement.domain import AdapterId, Catalog, Fleet, PodId, Tier
from placement.errors import ForecastError, LorafleetError
from placement.forecast.forecaster import forecast_demand
from placement.settings import Settings
from placement.sim.planning import (
    Forecaster,
    History,
    Planner,
    PlanRequest,
    SimPlan,
    greedy_rate_planner,
    recent_and_yesterday,
)
from placement.sim.replay import PlanningParts
from placement.solver import Demand, build_problem, extract_plan, options_from, solve

#: CP-SAT time per replan inside a replay: hundreds of replans must fit in minutes.
REPLAY_SOLVER_TIME_S = 0.5


def solver_planner(
    catalog: Catalog, fleet: Fleet, *, settings: Settings, start: datetime
) -> Planner:
    """A ``Planner`` backed by the CP-SAT solver, with the greedy plan as fallback."""
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


class ModelsForecaster:
    """``placement.forecast.forecaster`` (the ``models/`` forecasters) as a replay ``Forecaster``.

    Keeps the history as 10-minute bucket rows, appending only buckets completed since
    the last call. The rate per adapter is the peak bucket mean over the horizon, and
    at least the last 20 minutes' rate, so an adapter that just appeared (the war
    story's variants) is planned before a bucket model could see it. Falls back to
    ``recent_and_yesterday`` when the model cannot forecast.
    """

    def __init__(self, *, start: datetime, model: str, bucket_s: int = 600) -> None:
        self.start = start
        self.model = model
        self.bucket_s = bucket_s
        self.rows: list[tuple[datetime, str, int]] = []
        self.done_until_s = 0.0
        self.failures = 0

    def __call__(self, history: History, now_s: float, horizon_s: float) -> dict[str, float]:
        self._extend(history, now_s)
        recent = recent_and_yesterday(history, now_s, 0.0)
        if not self.rows:
            return recent
        counts = pd.DataFrame(self.rows, columns=["ts", "adapter", "requests"])
        try:
            forecast = forecast_demand(
                counts,
                at=self.start + timedelta(seconds=self.done_until_s),
                horizon_s=int(horizon_s + now_s - self.done_until_s),
                bucket_s=self.bucket_s,
                model=self.model,
            )
        except (ForecastError, ValueError, KeyError):
            self.failures += 1
            return recent_and_yesterday(history, now_s, horizon_s)
        peaks = forecast.frame.groupby("adapter", observed=True)["mean"].max() / self.bucket_s
        rates = {str(name): float(rate) for name, rate in peaks.items()}
        for name, rate in recent.items():
            rates[name] = max(rates.get(name, 0.0), rate)
        return rates

    def _extend(self, history: History, now_s: float) -> None:
        complete_s = (now_s // self.bucket_s) * self.bucket_s
        while self.done_until_s + self.bucket_s <= complete_s:
            begin = self.done_until_s
            moment = self.start + timedelta(seconds=begin)
            for name, count in history.totals(begin, begin + self.bucket_s).items():
                self.rows.append((moment, name, count))
            self.done_until_s = begin + self.bucket_s


def planning_parts(
    catalog: Catalog,
    fleet: Fleet,
    *,
    settings: Settings,
    start: datetime,
    forecast_model: str | None = "level-profile",
) -> PlanningParts:
    """The planning the ``lorafleet`` and ``oracle`` policies use: the project's
    forecaster (``forecast_model``; None for the simulator's own) and its CP-SAT solver.
    """
    planner = solver_planner(catalog, fleet, settings=settings, start=start)
    if forecast_model is None:
        forecaster: Forecaster = recent_and_yesterday
        described = "recent-and-yesterday forecast (sim fallback)"
    else:
        forecaster = ModelsForecaster(start=start, model=forecast_model)
        described = f"{forecast_model} forecast (placement.forecast.forecaster)"
    return PlanningParts(
        forecaster=forecaster,
        planner=planner,
        oracle_planner=planner,
        description=f"{described}, CP-SAT solver plan",
    )
