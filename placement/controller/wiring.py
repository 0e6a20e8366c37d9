"""The controller's composition root: every port wired to its real adapter.

``build`` reads nothing itself but the parsed ``controller.yaml`` (and the webhook
secret from the environment it names); it picks Kubernetes or state-directory adapters,
the history source, the forecaster, the planner and the actuator, and returns the
schedule and the ASGI app to serve. ``placement.cli.controller_cmds`` only parses the
command line and runs what this builds.
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
from pathlib import Path

import httpx
import pandas as pd
from fastapi import FastAPI
from kubernetes import client
from prometheus_client import CollectorRegistry

from placement.adapters.kube import (
    KubeAnnotator,
    KubeLeaseStore,
    KubePlanStore,
    KubePods,
    KubeStateStore,
    KubeTarget,
    connect,
)
from placement.adapters.prom import PromHistorySource
from placement.adapters.statedir import DirPlanStore, DirStateStore, ensure_state_dir
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
    EngineActuator,
    FileHistory,
    PrometheusHistory,
    PrometheusObserver,
    ReusingForecaster,
    SeasonalForecaster,
)
from placement.controller.ports import ControllerPorts, HistorySource
from placement.controller.schedule import Schedule, add_process_routes
from placement.controller.ticks import Controller
from placement.controller.webhook import create_webhook_app
from placement.domain import Catalog, Pipelines
from placement.forecast.demand import DemandForecaster
from placement.forecast.event_preloads import (
    Event,
    EventDecision,
    Predictor,
    learned_predictor,
    pipeline_predictor,
)
from placement.forecast.forecaster import ModelForecaster, learn_events
from placement.inputs import load_catalog, load_fleet, load_pipelines
from placement.inputs.request_log import RequestLog
from placement.ports import PlanStore
from placement.settings import Settings
from placement.solver.planner import SolverPlanner

DAY_S = 86_400

logger = logging.getLogger(__name__)


def _target(section: KubernetesConfig) -> KubeTarget:
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
    )


def settings_for(config: ControllerConfig) -> Settings:
    """The settings tree with what controller.yaml sets laid over its defaults."""
    return config.override(Settings())


def plan_store_for(config: ControllerConfig, api: client.ApiClient | None) -> PlanStore:
    if config.kubernetes is not None and api is not None:
        return KubePlanStore(api, target=_target(config.kubernetes))
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
class _Sink:
    """The webhook's EventSink: the controller, acting only while it leads."""

    controller: Controller

    def accepting(self) -> bool:
        return self.controller.is_leader()

    async def submit(self, event: Event) -> EventDecision:
        return await self.controller.on_event(event)


def build(config: ControllerConfig, *, http: httpx.AsyncClient) -> tuple[Schedule, FastAPI]:
    """Every port wired: the schedule and the ASGI app to serve."""
    settings = settings_for(config)
    fleet = load_fleet(config.fleet)
    catalog = load_catalog(config.catalog, fleet=fleet)
    pipelines = load_pipelines(config.pipelines, catalog=catalog) if config.pipelines else None
    clock, to_wall = _clocks(config.clock)
    declared = pipeline_predictor(pipelines or Pipelines(), catalog)
    secret = read_secret(config.webhook, dict(os.environ))
    identity = config.identity or os.environ.get("POD_NAME") or socket.gethostname()
    api = None
    if config.kubernetes is not None:
        api = connect(host=config.kubernetes.api_host)
    kube = config.kubernetes
    target = _target(kube) if kube is not None else None
    registry = CollectorRegistry()
    ports = ControllerPorts(
        catalog=catalog,
        fleet=fleet,
        history=_history(config, settings),
        forecaster=_forecaster(config, settings, catalog),
        planner=SolverPlanner(catalog, settings=settings, clock=clock),
        actuator=EngineActuator(catalog=catalog, http=http, settings=settings, rng=random.Random()),
        plans=plan_store_for(config, api),
        state=(
            KubeStateStore(api, target=target)
            if api is not None and target is not None
            else DirStateStore(ensure_state_dir(config.state_dir or Path("state")))
        ),
        predictor=declared,
        learn_predictor=_event_learner(pipelines, catalog, declared)
        if config.learn_events
        else None,
        discovery=KubePods(api, target=target) if api is not None and target else None,
        annotator=KubeAnnotator(api, target=target) if api is not None and target else None,
        elector=(
            LeaderElector(
                KubeLeaseStore(api, target=target),
                identity=identity,
                duration_s=settings.controller.lease_duration_s,
                clock=time.monotonic,
                wall=lambda: datetime.now(UTC),
            )
            if api is not None and target is not None
            else None
        ),
    )
    observer = PrometheusObserver(registry, bucket_s=settings.forecast.bucket_s)
    # With the period known before any plan, LorafleetPlanStale fires until one is out.
    observer.shared.planning_period(settings.controller.plan_interval_s)
    controller = Controller(ports, settings=settings, clock=clock, metrics=observer)
    if secret is None:
        logger.warning(
            "no webhook secret (%s or webhook.secret_file): POST /v1/events is off",
            config.webhook.secret_env,
        )
        webhook = FastAPI(title="lorafleet controller", version="1")
    else:
        webhook = create_webhook_app(
            _Sink(controller),
            secret=secret,
            settings=settings.controller,
            clock=time.time,
            registry=registry,
        )
    add_process_routes(webhook, controller, registry)
    return Schedule(controller, settings=settings.controller, to_wall=to_wall), webhook
