"""Connect a replay to the project's forecaster and planner, as the controller does.

``replay_planning`` builds the ``ReplayPlanning`` of the ``lorafleet`` and ``oracle``
policies from the same parts the controller wires: ``ModelForecaster``
(``placement.forecast.forecaster``, the ``models/`` forecasters) behind ``RecentFloor``,
and ``SolverPlanner`` (CP-SAT, with the solver's greedy as its hint and fallback) or,
for speed, ``GreedyPlanner`` (the greedy alone) from ``placement.solver.planner``.
The catalog's class weights travel with it (``ClassedPlanning``): ``run_policy`` gives
them to ``lorafleet`` when ``RouterSettings.class_priority`` is on. Only a plan's hot
adapters forecast at or above ``SimSettings.plan_hot_min_rps`` are preloaded and routed
by weight; the rest stay with the routers' LRU, which the replays show serves a long
tail better than a guess.
"""

from __future__ import annotations

from dataclasses import replace

from placement.domain import Catalog, Fleet
from placement.forecast.forecaster import ModelForecaster
from placement.settings import Settings
from placement.sim.planning import RecentFloor
from placement.sim.routers import ClassedPlanning, class_weights
from placement.solver.planner import GreedyPlanner, Planner, SolverPlanner

#: CP-SAT time per replan inside a replay: hundreds of replans must fit in minutes.
REPLAY_SOLVER_TIME_S = 0.5
PLANNERS = ("solver", "greedy")


def replay_settings(settings: Settings) -> Settings:
    """The settings a replay plans with: a short solver time, a short forecast."""
    # The availability replicas stay as configured (replicate_share): a replay meets pod
    # faults (--faults), and since lorafleet preloads only planned adapters no pod holds,
    # a second copy costs a slot only where it is used (ServeGen m-mid, greedy planner:
    # 95.7% GPU hits, 29,678 loads, p95 264 ms with the default 2% share; 29,354 loads,
    # 255 ms with replicas off).
    planner = replace(settings.planner, time_limit_s=REPLAY_SOLVER_TIME_S)
    # Forecast only the plan's horizon: the next day is not planned from one replan.
    forecast = replace(settings.forecast, horizon_s=int(settings.sim.plan_horizon_s))
    return replace(settings, planner=planner, forecast=forecast)


def replay_planning(
    catalog: Catalog,
    fleet: Fleet,
    *,
    settings: Settings,
    planner: str = "solver",
    forecast_model: str = "level-profile",
) -> ClassedPlanning:
    """The planning of ``lorafleet`` (and, with the true demand, of ``oracle``), with
    the catalog's class weights (routed by only under ``RouterSettings.class_priority``)."""
    tuned = replay_settings(settings)
    chosen: Planner = (
        GreedyPlanner(catalog, settings=tuned, clock=None)
        if planner == "greedy"
        else SolverPlanner(catalog, settings=tuned, clock=None)
    )
    # The oracle's bound: the same planner without availability replicas.
    unreplicated = replace(tuned, planner=replace(tuned.planner, replicate_share=1.0))
    bound: Planner = (
        GreedyPlanner(catalog, settings=unreplicated, clock=None)
        if planner == "greedy"
        else SolverPlanner(catalog, settings=unreplicated, clock=None)
    )
    forecaster = ModelForecaster(settings=tuned.forecast, catalog=catalog, model=forecast_model)
    described = "solver's greedy" if planner == "greedy" else "CP-SAT solver"
    return ClassedPlanning(
        fleet=fleet,
        forecaster=RecentFloor(forecaster),
        planner=chosen,
        hot_min_rps=settings.sim.plan_hot_min_rps,
        description=f"{forecast_model} forecast (placement.forecast), {described} plan",
        bound_planner=bound,
        class_weight=class_weights(catalog),
        class_of={str(a.name): a.adapter_class.value for a in catalog.adapters},
    )
