"""Replay one workload under several policies: the entry point of ``lorafleet replay``.

Owns the choice of router per policy name, the eviction each uses (the engine's LRU,
for lorafleet too, unless a counterfactual one is asked for; Belady for the oracle, a
bound no engine reaches) and the per-policy result: the metrics and, when
asked, the per-request log. Each policy runs on a fresh fleet with the same requests.
``Levers`` runs a hybrid between lorafleet and the oracle instead (``bench/oracle_levers.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from placement.domain import Fleet
from placement.errors import InputError, Problem
from placement.residency import engine_model
from placement.settings import Settings
from placement.sim.engine import FleetReplay, SimLog, SimRouter
from placement.sim.events import EventController, SimEvent
from placement.sim.eviction_choice import VictimWait
from placement.sim.faults import FaultSchedule
from placement.sim.figures import (
    Metrics,
    after_pod_loss,
    class_figures,
    compute_metrics,
    event_metrics,
    event_metrics_by_kind,
    surge_ttft_p95_ms,
)
from placement.sim.planning import ReplayHistory, ReplayPlanning, TrueDemand
from placement.sim.pods import PodSpec
from placement.sim.routers import (
    PLANNED,
    POLICIES,
    ClassedPlanning,
    PlannedRouter,
    ReactiveRouter,
)
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy, EvictionSettings

#: What availability replicas are for: the requests in the ten minutes after a pod loss.
AFTER_POD_LOSS_S = 600.0


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    policy: str
    eviction: EvictionPolicy
    metrics: Metrics
    log: SimLog
    pod_ids: tuple[str, ...]
    plan_sources: dict[str, int]
    #: With events delivered (``--events``): ``event_metrics``; None otherwise.
    event_figures: Metrics | None = None
    #: With events: ``event_metrics_by_kind`` (``pipeline``, ``login``).
    event_figures_by_kind: dict[str, Metrics] = field(default_factory=dict)
    #: With events: ``surge_ttft_p95_ms`` per tenant.
    login_surge_ttft_p95_ms: dict[str, float] = field(default_factory=dict)
    #: With faults (``--faults``): the requests arriving within ``AFTER_POD_LOSS_S`` of
    #: each restart or outage start (``figures.after_pod_loss``); None otherwise.
    after_pod_loss: Metrics | None = None
    #: With ``RouterSettings.class_priority`` and the catalog's classes
    #: (``ClassedPlanning``): ``figures.class_figures``; empty otherwise.
    by_class: dict[str, Metrics] = field(default_factory=dict)
    #: Class warm-ups the router sent (``SimLog.warmups``).
    warmups: int = 0


def pod_specs(fleet: Fleet) -> list[PodSpec]:
    if len(fleet.pools) != 1:
        names = ", ".join(pool.name for pool in fleet.pools)
        raise InputError(
            [Problem(source="fleet", message=f"replay models one pool; this fleet has: {names}")]
        )
    storage = fleet.pools[0].storage
    return [
        PodSpec(
            pod_id=str(pod.name),
            max_loras=pod.max_loras,
            max_cpu_loras=max(pod.max_cpu_loras, pod.max_loras),
            capacity_rps=pod.capacity_rps,
            engine=engine_model(pod.engine),
            storage_bytes_per_s=storage.bytes_per_s if storage is not None else None,
            first_byte_ms=storage.first_byte_ms if storage is not None else 0.0,
        )
        for pod in fleet.pods
    ]


def check_policies(names: Sequence[str]) -> None:
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise InputError(
            [
                Problem(
                    source="--policy",
                    message=f"unknown policy {name!r}; choose from {', '.join(POLICIES)}",
                )
                for name in unknown
            ]
        )


@dataclass(frozen=True, kw_only=True)
class Levers:
    """A hybrid between ``lorafleet`` (forecast plan, LRU, idle time) and ``oracle``
    (true plan, Belady, true next use), one lever at a time."""

    #: Plan from the true future demand (the oracle's bound planner, no events heard)
    #: instead of lorafleet's forecast.
    true_plan: bool
    #: The engine's eviction; under Belady the plan's whole hot set is preloaded and kept,
    #: as for the oracle.
    eviction: EvictionPolicy
    #: What the victim's worth reads as its wait (``PlannedRouter``).
    victim_wait: VictimWait
    #: Warm-ups that make the LRU victim the idle adapter used furthest in the future.
    warm_to_true_victim: bool = False
    #: Warm-ups that make the LRU victim the idle adapter lorafleet's estimate values
    #: least ("worth" or "recent": ``PlannedRouter.warm_by_estimate``), past a margin.
    warm_by_estimate: str | None = None
    warm_margin_s: float = 0.0


def oracle_planning(planning: ReplayPlanning, history: ReplayHistory) -> ReplayPlanning:
    """The oracle's planning: ``planning``'s bound planner on the true future demand."""
    return ReplayPlanning(
        fleet=planning.fleet,
        forecaster=TrueDemand(history),
        planner=planning.bound_planner or planning.planner,
        hot_min_rps=planning.hot_min_rps,
        description="the true future demand",
    )


def _classes(settings: Settings, planning: ReplayPlanning) -> Mapping[str, float] | None:
    return (
        planning.class_weight
        if settings.router.class_priority and isinstance(planning, ClassedPlanning)
        else None
    )


def _hybrid(
    levers: Levers,
    replay: FleetReplay,
    settings: Settings,
    planning: ReplayPlanning,
    events: EventController | None,
) -> PlannedRouter:
    history = ReplayHistory(replay.workload)
    belady = levers.eviction is EvictionPolicy.BELADY
    return PlannedRouter(
        "oracle" if belady else "lorafleet",
        replay,
        settings,
        levers.eviction,
        planning=oracle_planning(planning, history) if levers.true_plan else planning,
        history=history,
        events=None if levers.true_plan else events,
        class_weight=None if levers.true_plan else _classes(settings, planning),
        victim_wait=levers.victim_wait,
        warm_to_true_victim=levers.warm_to_true_victim,
        warm_by_estimate=levers.warm_by_estimate,
        warm_margin_s=levers.warm_margin_s,
    )


def _router(
    name: str,
    replay: FleetReplay,
    settings: Settings,
    eviction: EvictionPolicy,
    planning: ReplayPlanning | None,
    events: EventController | None,
) -> SimRouter:
    if name not in PLANNED:
        return ReactiveRouter(name, replay, settings, eviction)
    assert planning is not None  # run_policy checked
    history = ReplayHistory(replay.workload)
    if name == "oracle":
        oracle = oracle_planning(planning, history)
        return PlannedRouter(
            name, replay, settings, EvictionPolicy.BELADY, planning=oracle, history=history
        )
    # lorafleet cannot change how vLLM evicts: it runs on the engine's LRU unless a
    # counterfactual eviction is asked for (--eviction forecast: the engine it would want).
    # Only lorafleet's controller hears events; the oracle's plan knows the future anyway.
    # Production before experiments (class_priority): the catalog's class weights, which
    # replay_planning carries (ClassedPlanning); the oracle, a bound, has no classes.
    classes = _classes(settings, planning)
    return PlannedRouter(
        name,
        replay,
        settings,
        eviction,
        planning=planning,
        history=history,
        events=events,
        class_weight=classes,
    )


def run_policy(
    name: str,
    workload: SimWorkload,
    fleet: Fleet,
    *,
    settings: Settings,
    eviction: EvictionPolicy = EvictionPolicy.LRU,
    planning: ReplayPlanning | None = None,
    replay_type: type[FleetReplay] = FleetReplay,
    window_s: tuple[float, float] | None = None,
    events: Sequence[SimEvent] = (),
    controller: EventController | None = None,
    faults: FaultSchedule | None = None,
    levers: Levers | None = None,
) -> ReplayResult:
    """Replay ``workload`` on a fresh ``fleet`` under policy ``name``; ``lorafleet`` and
    ``oracle`` plan with ``planning``, and with ``levers`` (a planned ``name``) the
    hybrid they name runs instead. The figures are of ``window_s`` (replay seconds)
    when given, of the whole replay otherwise."""
    check_policies([name])
    if name in PLANNED and planning is None:
        raise InputError([Problem(source="--policy", message=f"{name!r} needs a planner")])
    specs = pod_specs(fleet)
    replay = replay_type(
        workload,
        specs,
        sim=settings.sim,
        load_cost=settings.load_cost,
        eviction_settings=EvictionSettings(),
        events=list(events),
        faults=faults,
    )
    router = (
        _hybrid(levers, replay, settings, planning, controller)
        if levers is not None and planning is not None and name in PLANNED
        else _router(name, replay, settings, eviction, planning, controller)
    )
    log = replay.run(router)
    metrics = compute_metrics(
        log, replay.pods, workload.arrival_s, sim=settings.sim, window=window_s
    )
    figures, by_kind, surges = None, {}, {}
    if controller is not None:
        figures = event_metrics(log, workload, events, window=window_s)
        by_kind = event_metrics_by_kind(log, workload, events, window=window_s)
        tenants = {str(a.name): str(a.tenant) for a in controller.catalog.adapters if a.tenant}
        surges = surge_ttft_p95_ms(log, workload, events, adapter_tenants=tenants, window=window_s)
    sources = router.plan_sources if isinstance(router, PlannedRouter) else {}
    lost = (
        after_pod_loss(log, workload.arrival_s, faults.steps, after_s=AFTER_POD_LOSS_S)
        if faults is not None and faults.steps
        else None
    )
    by_class = (
        class_figures(log, workload, planning.class_of, window=window_s)
        if settings.router.class_priority and isinstance(planning, ClassedPlanning)
        else {}
    )
    return ReplayResult(
        policy=name,
        eviction=router.eviction,
        metrics=metrics,
        log=log,
        pod_ids=tuple(spec.pod_id for spec in specs),
        plan_sources=sources,
        event_figures=figures,
        event_figures_by_kind=by_kind,
        login_surge_ttft_p95_ms=surges,
        after_pod_loss=lost,
        by_class=by_class,
        warmups=log.warmups,
    )


def run_replay(
    workload: SimWorkload,
    fleet: Fleet,
    policies: Sequence[str],
    *,
    settings: Settings,
    eviction: EvictionPolicy = EvictionPolicy.LRU,
    planning: ReplayPlanning | None = None,
    window_s: tuple[float, float] | None = None,
    events: Sequence[SimEvent] = (),
    controller: EventController | None = None,
    faults: FaultSchedule | None = None,
) -> list[ReplayResult]:
    """Every named policy on the same requests (and events and faults), in the order
    given."""
    check_policies(policies)
    return [
        run_policy(
            name,
            workload,
            fleet,
            settings=settings,
            eviction=eviction,
            planning=planning,
            window_s=window_s,
            events=events,
            controller=controller,
            faults=faults,
        )
        for name in policies
    ]
