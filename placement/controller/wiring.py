"""The controller's composition root: every port wired to its real adapter.

``build`` reads nothing itself but the parsed ``controller.yaml`` (and the webhook
secret from the environment it names) and the inputs it names; it picks Kubernetes
or state-directory adapters, the history source, the forecaster, the planner and the
actuator, and returns the schedule and the ASGI app to serve. The controller gets
the catalog file to re-read and ``bound``, which builds the catalog-bound ports
(forecaster, planner, actuator, event predictors) over a new catalog.
``placement.cli.controller_cmds`` only parses the command line and runs what this
builds.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

import httpx
import pandas as pd
from fastapi import FastAPI
from kubernetes import client
from prometheus_client import CollectorRegistry

from placement.adapters.kube import (
    KubeConfigMapKey,
    KubeHotSets,
    KubeLeaseStore,
    KubePlanStore,
    KubePods,
    KubeStateStore,
    KubeTarget,
    claim_all,
    connect,
)
from placement.adapters.prom import PromHistorySource
from placement.adapters.statedir import DirLock, DirPlanStore, DirStateStore, ensure_state_dir
from placement.clock import Clock, warped_clock
from placement.controller.config import (
    SAME_HOUR_MODEL,
    ClockConfig,
    ControllerConfig,
    KubernetesConfig,
    read_secret,
)
from placement.controller.leader import LeaderElector
from placement.controller.live_ports import (
    ConfigMapCatalog,
    EngineActuator,
    FileHistory,
    PrometheusHistory,
    PrometheusObserver,
    ReusingForecaster,
    SeasonalForecaster,
)
from placement.controller.ports import (
    CatalogBound,
    CatalogSource,
    ControllerPorts,
    HistorySource,
    Leadership,
)
from placement.controller.recent_use import RouterLogUse
from placement.controller.schedule import Schedule, add_process_routes
from placement.controller.ticks import Controller
from placement.controller.webhook import EventRejected, create_webhook_app
from placement.domain import Catalog, Fleet, Pipelines
from placement.forecast.demand import DemandForecaster
from placement.forecast.event_preloads import (
    Event,
    EventDecision,
    EventKind,
    Predictor,
    learned_predictor,
    pipeline_predictor,
)
from placement.forecast.forecaster import ModelForecaster, learn_events
from placement.inputs import load_fleet, load_pipelines
from placement.inputs.catalog import CatalogFile
from placement.inputs.request_log import RequestLog
from placement.ports import HotSetBoard, PlanStore, PodDiscovery, StateStore
from placement.settings import Settings
from placement.solver.planner import SolverPlanner

DAY_S = 86_400

logger = logging.getLogger(__name__)


def _target(section: KubernetesConfig, *, api_timeout_s: float) -> KubeTarget:
    return KubeTarget(
        namespace=section.namespace,
        selector=section.selector,
        pool_label=section.pool_label,
        default_pool=section.default_pool,
        port_name=section.port_name,
        default_port=section.default_port,
        plan_configmap=section.plan_configmap,
        state_configmap=section.state_configmap,
        lease_name=section.lease_name,
        hot_sets_configmap=section.hot_sets_configmap,
        request_timeout_s=api_timeout_s,
    )


def _catalog_source(config: ControllerConfig, settings: Settings, fleet: Fleet) -> CatalogSource:
    """The catalog file, or the ConfigMap's key ``kubernetes.catalog_configmap`` names."""
    kube = config.kubernetes
    if kube is not None and kube.catalog_configmap:
        target = _target(kube, api_timeout_s=settings.controller.api_timeout_s)
        key = KubeConfigMapKey(
            connect(host=kube.api_host),
            target=target,
            name=kube.catalog_configmap,
            key=kube.catalog_key,
        )
        return ConfigMapCatalog(key, fleet=fleet, rules=settings.inputs)
    assert config.catalog is not None  # the config's validator requires one of the two
    return CatalogFile(config.catalog, fleet=fleet, rules=settings.inputs)


def settings_for(config: ControllerConfig) -> Settings:
    """The settings tree with what controller.yaml sets laid over its defaults."""
    return config.override(Settings())


def plan_store_for(config: ControllerConfig, api: client.ApiClient | None) -> PlanStore:
    if config.kubernetes is not None and api is not None:
        timeout_s = settings_for(config).controller.api_timeout_s
        return KubePlanStore(api, target=_target(config.kubernetes, api_timeout_s=timeout_s))
    assert config.state_dir is not None  # the config's validator requires one of the two
    return DirPlanStore(ensure_state_dir(config.state_dir))


def _history(config: ControllerConfig, settings: Settings) -> HistorySource:
    section = config.history
    if section.log is not None:
        return FileHistory(section.log, live=section.live_log, bucket_s=settings.forecast.bucket_s)
    assert section.prometheus_url is not None
    return PrometheusHistory(
        PromHistorySource(section.prometheus_url),
        lookback_s=section.lookback_days * DAY_S,
        bucket_s=settings.forecast.bucket_s,
        clock=time.time,
    )


def _clocks(section: ClockConfig | None) -> tuple[Clock, Callable[[datetime], datetime] | None]:
    """The controller's clock, and how its times map to the wall's (None: the same)."""
    if section is None:
        return time.time, None
    origin_s = section.origin_s if section.origin_s is not None else time.time()
    start_s, speed = section.start.timestamp(), section.speed
    clock = warped_clock(start=section.start, speed=speed, wall_origin_s=origin_s)

    def to_wall(at: datetime) -> datetime:
        return datetime.fromtimestamp(origin_s + (at.timestamp() - start_s) / speed, UTC)

    return clock, to_wall


def _recent_use(config: ControllerConfig, settings: Settings) -> RouterLogUse | None:
    """The router's log as each event's record of recent use, when one is named."""
    live = config.history.live_log
    if live is None:
        return None
    return RouterLogUse(live, refresh_s=settings.controller.recent_use_refresh_s)


def _forecaster(config: ControllerConfig, settings: Settings, catalog: Catalog) -> DemandForecaster:
    bucket_s = settings.forecast.bucket_s
    if config.forecast_model == SAME_HOUR_MODEL:
        return SeasonalForecaster(bucket_s=bucket_s)
    model = ModelForecaster(
        settings=settings.forecast, catalog=catalog, model=config.forecast_model
    )
    return ReusingForecaster(model, bucket_s=bucket_s)


def _event_learner(
    pipelines: Pipelines | None, catalog: Catalog, declared: Predictor
) -> Callable[[RequestLog], Predictor]:
    def learn(history: RequestLog) -> Predictor:
        # learn_events fills missing tenants with "", which a categorical column refuses.
        frame = history.frame
        if "tenant" in frame and isinstance(frame["tenant"].dtype, pd.CategoricalDtype):
            frame = frame.assign(tenant=frame["tenant"].astype(object))
            history = replace(history, frame=frame)
        models = learn_events(history, pipelines=pipelines, catalog=catalog)
        return learned_predictor(models, declared=declared)

    return learn


@dataclass
class ControllerEvents:
    """The webhook's EventSink: the controller, acting only while it leads, on the
    triggers pipelines.yaml names (another is refused: 422)."""

    controller: Controller
    triggers: frozenset[str]

    def accepting(self) -> bool:
        return self.controller.is_leader()

    async def submit(self, event: Event) -> EventDecision:
        if event.kind is EventKind.PIPELINE and event.trigger not in self.triggers:
            known = ", ".join(sorted(self.triggers)[:10]) or "none"
            raise EventRejected(
                f"unknown trigger {event.trigger!r} (pipelines.yaml defines: {known})"
            )
        return await self.controller.on_event(event)


@dataclass(frozen=True, kw_only=True)
class _Cluster:
    """The cluster-side ports: Kubernetes objects, or a state directory and its lock."""

    plans: PlanStore
    state: StateStore
    elector: Leadership
    discovery: PodDiscovery | None = None
    hot_sets: HotSetBoard | None = None
    claim: Callable[[], None] | None = None


def _cluster(config: ControllerConfig, settings: Settings, *, identity: str) -> _Cluster:
    kube = config.kubernetes
    if kube is None:
        assert config.state_dir is not None  # the config's validator requires one of the two
        directory = ensure_state_dir(config.state_dir)
        return _Cluster(
            plans=DirPlanStore(directory),
            state=DirStateStore(directory),
            elector=DirLock(directory, identity=identity),
        )
    api = connect(host=kube.api_host)
    cfg = settings.controller
    target = _target(kube, api_timeout_s=cfg.api_timeout_s)
    elector = LeaderElector(
        KubeLeaseStore(api, target=target),
        identity=identity,
        duration_s=cfg.lease_duration_s,
        renew_deadline_s=cfg.lease_renew_deadline_s,
        clock=time.monotonic,
        wall=lambda: datetime.now(UTC),
    )
    plans = KubePlanStore(api, target=target, term=elector.term)
    state = KubeStateStore(api, target=target, term=elector.term)
    hot_sets = KubeHotSets(api, target=target, term=elector.term)
    return _Cluster(
        plans=plans,
        state=state,
        discovery=KubePods(api, target=target),
        hot_sets=hot_sets,
        elector=elector,
        claim=partial(claim_all, plans, state, hot_sets),
    )


def build(
    config: ControllerConfig,
    *,
    http: httpx.AsyncClient,
    monotonic: Callable[[], float] = time.monotonic,
) -> tuple[Schedule, FastAPI]:
    """Every port wired: the schedule and the ASGI app to serve. ``monotonic`` times
    the jobs in flight (a hung one fails /healthz); tests pass a fake one."""
    settings = settings_for(config)
    fleet = load_fleet(config.fleet)
    catalog_file = _catalog_source(config, settings, fleet)
    catalog = catalog_file.poll()
    assert catalog is not None  # a source's first poll answers its catalog
    pipelines = load_pipelines(config.pipelines, catalog=catalog) if config.pipelines else None
    clock, to_wall = _clocks(config.clock)
    secret = read_secret(config.webhook, dict(os.environ))
    identity = config.identity or os.environ.get("POD_NAME") or socket.gethostname()
    cluster = _cluster(config, settings, identity=identity)
    registry = CollectorRegistry()
    rng = random.Random()

    def bound(over: Catalog) -> CatalogBound:
        """The ports over one catalog; pipelines.yaml is checked against it again."""
        pipes = load_pipelines(config.pipelines, catalog=over) if config.pipelines else None
        declared = pipeline_predictor(pipes or Pipelines(), over)
        return CatalogBound(
            forecaster=_forecaster(config, settings, over),
            planner=SolverPlanner(
                over, settings=settings, clock=clock, deadline_clock=time.monotonic
            ),
            actuator=EngineActuator(catalog=over, http=http, settings=settings, rng=rng),
            predictor=declared,
            learn_predictor=_event_learner(pipes, over, declared) if config.learn_events else None,
        )

    first = bound(catalog)
    ports = ControllerPorts(
        catalog=catalog,
        fleet=fleet,
        history=_history(config, settings),
        forecaster=first.forecaster,
        planner=first.planner,
        actuator=first.actuator,
        plans=cluster.plans,
        state=cluster.state,
        predictor=first.predictor,
        learn_predictor=first.learn_predictor,
        discovery=cluster.discovery,
        hot_sets=cluster.hot_sets,
        elector=cluster.elector,
        claim=cluster.claim,
        catalog_file=catalog_file,
        rebind=bound,
        recent_use=_recent_use(config, settings),
    )
    observer = PrometheusObserver(registry, bucket_s=settings.forecast.bucket_s)
    # With the period known before any plan, LorafleetPlanStale fires until one is out.
    observer.shared.planning_period(settings.controller.plan_interval_s)
    controller = Controller(ports, settings=settings, clock=clock, metrics=observer)
    schedule = Schedule(
        controller, settings=settings.controller, to_wall=to_wall, monotonic=monotonic
    )
    if secret is None:
        logger.warning(
            "no webhook secret (%s or webhook.secret_file): POST /v1/events is off",
            config.webhook.secret_env,
        )
        webhook = FastAPI(title="lorafleet controller", version="1")
    else:
        triggers = frozenset(p.trigger for p in pipelines.pipelines) if pipelines else frozenset()
        webhook = create_webhook_app(
            ControllerEvents(controller, triggers=triggers),
            secret=secret,
            settings=settings.controller,
            clock=time.time,
            registry=registry,
        )
    add_process_routes(webhook, schedule, registry)
    return schedule, webhook
