"""The fleet-health and controller metrics operators watch (thresholds: docs/background.md).

Owns the ``lorafleet_*`` metric families that are not the router's own (those live in
``placement.router.metrics``: requests by outcome, TTFT, loads the router caused,
request queue depth per pod). Two groups, each registered on a registry the entry
point passes in (no module-level registry, no globals):

- ``FleetMetrics``, for the process that sees adapters come and go on GPU slots (the
  router's ledger, or the controller's executor): residency time, GPU adapters per
  pod against slots, distinct active adapters against cluster slots, the load queue.
- ``ControllerMetrics``: the plan's age and period, solver gap and time, the online
  forecast score (its MAE beside persistence's and yesterday's, ``forecast_scored``),
  actions by kind and result, failed jobs, preloads.

``FleetMetrics.adapter_tenants`` exports each catalog adapter's tenant as an info
series, which the rules join with the router's request counter for the per-tenant
GPU-residency promise (the router's hot path carries no tenant label).

Must not decide anything or read the clock: times come in as ``now_s`` arguments.
``docs/metrics.md`` documents every family; ``deploy/monitoring/`` alerts on them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable
from datetime import datetime

import pandas as pd
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from placement.actuation.executor import ApplyReport, Status
from placement.domain import Catalog, Fleet, PodId, PoolId
from placement.forecast.scoring import ForecastScore
from placement.plan import Plan

#: Residency buckets in seconds: under 30 s is thrashing and under 5 min a
#: warning; healthy fleets keep adapters for tens of minutes (45 min in the war story).
RESIDENCY_BUCKETS_S = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0)
#: CP-SAT wall time buckets in seconds: the default time limit is seconds, not minutes.
SOLVER_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: ``result`` label of lorafleet_controller_actions_total, by executor status: only
#: ``ok`` changed a pod (an ``unchanged`` load found the adapter already there).
ACTION_RESULTS = {
    Status.DONE: "ok",
    Status.UNCHANGED: "unchanged",
    Status.SKIPPED: "skipped",
    Status.FAILED: "failed",
}


def in_files() -> bool:
    """Whether this process writes its figures to prometheus_client's multiprocess files
    (``router.metrics.record_in``): their series cannot be removed there (``remove``
    warns and leaves the file's value), so whoever renders leaves them out instead."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def drop_pod_series(families: Iterable[MetricWrapperBase], pods: Collection[str]) -> None:
    """Remove every series of ``families`` whose ``pod`` label is one of ``pods`` (pods
    that left the fleet: a fleet that churns pods keeps none of their series). A no-op in
    a process that writes to multiprocess files (``in_files``)."""
    if not pods or in_files():
        return
    for family in families:
        names = family._labelnames
        if "pod" not in names:
            continue
        for metric in family.collect():
            for sample in metric.samples:
                if sample.labels.get("pod") in pods:
                    family.remove(*(sample.labels[name] for name in names))


class FleetMetrics:
    """Residency, GPU occupancy and load queue per pod; active adapters per pool."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.residency = Histogram(
            "lorafleet_adapter_residency_seconds",
            "How long an adapter stayed on a GPU slot of a pod, activation to eviction.",
            ["pod"],
            buckets=RESIDENCY_BUCKETS_S,
            registry=registry,
        )
        self.evictions = Counter(
            "lorafleet_adapter_evictions",
            "Adapters that left a GPU slot of a pod (evicted or unloaded).",
            ["pod"],
            registry=registry,
        )
        self.gpu_adapters = Gauge(
            "lorafleet_pod_gpu_adapters",
            "Adapters on the pod's GPU slots now.",
            ["pod"],
            registry=registry,
        )
        self.gpu_slots = Gauge(
            "lorafleet_pod_gpu_slots",
            "The pod's GPU adapter slots (max_loras).",
            ["pod"],
            registry=registry,
        )
        self.load_queue = Gauge(
            "lorafleet_load_queue_depth",
            "Adapter loads waiting or in progress for the pod.",
            ["pod"],
            registry=registry,
        )
        self.active_adapters = Gauge(
            "lorafleet_active_adapters",
            "Distinct adapters with requests in the last activity window, per pool.",
            ["pool"],
            registry=registry,
        )
        self.slot_capacity = Gauge(
            "lorafleet_slot_capacity",
            "GPU adapter slots summed over the pool's ready pods.",
            ["pool"],
            registry=registry,
        )
        self.adapter_tenant = Gauge(
            "lorafleet_adapter_tenant_info",
            "1 for each catalog adapter with its tenant (joined with the request counter "
            "for the per-tenant GPU-residency promise).",
            ["adapter", "tenant"],
            registry=registry,
        )
        self._since_s: dict[tuple[str, str], float] = {}
        self._tenants: dict[str, str] = {}

    def pod_slots(self, pod: str, *, slots: int) -> None:
        self.gpu_slots.labels(pod=pod).set(slots)

    def activated(self, pod: str, adapter: str, *, now_s: float) -> None:
        """``adapter`` took a GPU slot on ``pod`` (a request or a warm-up pulled it in)."""
        key = (pod, adapter)
        if key not in self._since_s:
            self._since_s[key] = now_s
            self.gpu_adapters.labels(pod=pod).inc()

    def evicted(self, pod: str, adapter: str, *, now_s: float) -> None:
        """``adapter`` left its GPU slot on ``pod``; observes how long it stayed."""
        since_s = self._since_s.pop((pod, adapter), None)
        if since_s is None:
            return
        self.residency.labels(pod=pod).observe(max(0.0, now_s - since_s))
        self.evictions.labels(pod=pod).inc()
        self.gpu_adapters.labels(pod=pod).dec()

    def observe_gpu(self, pod: str, active: Collection[str], *, now_s: float) -> None:
        """A snapshot of the adapters on ``pod``'s GPU slots (the router's ledger after
        each scrape): arrivals start a stay, departures end one. Residency is then exact
        to the snapshot interval, and the caller needs no eviction hook."""
        current = set(active)
        held = {adapter for (owner, adapter) in self._since_s if owner == pod}
        for adapter in sorted(held - current):
            self.evicted(pod, adapter, now_s=now_s)
        for adapter in sorted(current - held):
            self.activated(pod, adapter, now_s=now_s)

    def pod_emptied(self, pod: str, *, now_s: float) -> None:
        """The pod restarted or left the fleet: every resident adapter's stay ends."""
        for key in [key for key in self._since_s if key[0] == pod]:
            self.evicted(pod, key[1], now_s=now_s)

    def pods_left(self, pods: Collection[str]) -> None:
        """``pods`` left the fleet: their stays end unobserved (their series go) and
        their per-pod series leave ``/metrics``. In multiprocess files, which keep a
        series, their GPU adapter count is set to 0 first: it moves by ``inc`` and
        ``dec``, so a pod back under the same name would count its adapters again on top
        of the old value; and their load queue depth, which a pod back would show until
        its next load."""
        if in_files():
            for pod in {owner for owner, _ in self._since_s if owner in pods}:
                self.gpu_adapters.labels(pod=pod).set(0)
            for pod in pods:  # a load in flight as it left wrote its last depth there
                self.load_queue.labels(pod=pod).set(0)
        for key in [key for key in self._since_s if key[0] in pods]:
            del self._since_s[key]
        drop_pod_series(
            (self.residency, self.evictions, self.gpu_adapters, self.gpu_slots, self.load_queue),
            pods,
        )

    def load_queue_depth(self, pod: str, *, depth: int) -> None:
        self.load_queue.labels(pod=pod).set(depth)

    def pool_activity(self, pool: str, *, active_adapters: int, slots: int) -> None:
        """Distinct adapters in demand against the pool's slots (the war story's 60 vs 32)."""
        self.active_adapters.labels(pool=pool).set(active_adapters)
        self.slot_capacity.labels(pool=pool).set(slots)

    def fleet_activity(
        self,
        counts: pd.DataFrame,
        *,
        catalog: Catalog,
        fleet: Fleet,
        since: datetime,
        ready: Collection[PodId] | None = None,
    ) -> None:
        """``pool_activity`` for every pool, from a counts frame (``ts``, ``adapter``,
        ``requests``, as ``RequestLog.counts`` or the Prometheus history source give)."""
        active = active_adapters_by_pool(counts, catalog=catalog, fleet=fleet, since=since)
        for pool in fleet.pools:
            slots = sum(p.max_loras for p in pool.pods if ready is None or p.name in ready)
            self.pool_activity(pool.name, active_adapters=active.get(pool.name, 0), slots=slots)
        self.adapter_tenants(catalog)

    def adapter_tenants(self, catalog: Catalog) -> None:
        """One ``lorafleet_adapter_tenant_info`` series per catalog adapter that has a
        tenant; adapters that left the catalog, or changed tenant, lose their old one."""
        tenants = {str(a.name): str(a.tenant) for a in catalog.adapters if a.tenant}
        if tenants == self._tenants:
            return
        for adapter, tenant in self._tenants.items():
            if tenants.get(adapter) != tenant:
                self.adapter_tenant.remove(adapter, tenant)
        for adapter, tenant in tenants.items():
            self.adapter_tenant.labels(adapter=adapter, tenant=tenant).set(1)
        self._tenants = tenants


class ControllerMetrics:
    """The controller's own health: plan age, solver quality, forecast error, actions."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.plan_created = Gauge(
            "lorafleet_plan_created_timestamp_seconds",
            "Unix time the plan in force was created; plan age is time() minus this.",
            registry=registry,
        )
        self.plan_period = Gauge(
            "lorafleet_plan_period_seconds",
            "The controller's planning period (plan-and-apply interval).",
            registry=registry,
        )
        self.plans = Counter(
            "lorafleet_plans",
            "Plans the controller made, by solver status (OPTIMAL, FEASIBLE, GREEDY, ...).",
            ["status"],
            registry=registry,
        )
        self.solver_gap = Gauge(
            "lorafleet_solver_gap_ratio",
            "Relative gap between the last plan's objective and the solver's bound.",
            registry=registry,
        )
        self.solver_duration = Histogram(
            "lorafleet_solver_duration_seconds",
            "Wall time of each solve.",
            buckets=SOLVER_BUCKETS_S,
            registry=registry,
        )
        self.predicted_hit = Gauge(
            "lorafleet_plan_predicted_hit_ratio",
            "The GPU hit ratio the plan in force predicts.",
            registry=registry,
        )
        self.forecast_error = Gauge(
            "lorafleet_forecast_error_ratio",
            "Weighted absolute percentage error of the last scored forecast window "
            "(sum of |forecast - actual| over sum of actual requests).",
            registry=registry,
        )
        self.forecast_mae = Gauge(
            "lorafleet_forecast_mae_rps",
            "Mean absolute error per adapter, in requests per second, of the last scored "
            "forecast window: the controller's forecast (model) and the naive ones "
            "(persistence: the hour before; yesterday: the same hour a day earlier).",
            ["forecast"],
            registry=registry,
        )
        self.forecast_scores = Counter(
            "lorafleet_forecast_scores",
            "Forecast windows the controller scored against the traffic that arrived.",
            registry=registry,
        )
        self.actions = Counter(
            "lorafleet_controller_actions",
            "Actions the controller pushed to pods, by kind (load, unload, warmup) and result.",
            ["kind", "pod", "result"],
            registry=registry,
        )
        self.job_failures = Counter(
            "lorafleet_controller_job_failures",
            "Scheduled jobs that failed (the last good plan stays in force).",
            ["job"],
            registry=registry,
        )

    def planning_period(self, period_s: float) -> None:
        """Call at start-up: with the period set and no plan yet, the plan looks as old
        as the epoch, so LorafleetPlanStale fires until a first plan is published."""
        self.plan_period.set(period_s)

    def plan_published(self, plan: Plan, *, period_s: float) -> None:
        """A plan came into force: its age, the solver's quality and its prediction."""
        self.plan_created.set(_unix_s(plan.created_at))
        self.plan_period.set(period_s)
        self.plans.labels(status=plan.solver.status).inc()
        if math.isfinite(plan.solver.gap):
            self.solver_gap.set(plan.solver.gap)
        self.solver_duration.observe(max(0.0, plan.solver.wall_s))
        hit = plan.predicted.get("gpu_hit_rate")
        if hit is not None:
            self.predicted_hit.set(hit)

    def forecast_scored(self, score: ForecastScore) -> None:
        """A forecast window scored: its WAPE, its MAE beside the naive forecasts'
        (a naive forecast the history is too short for keeps its last value)."""
        self.forecast_error.set(score.error_ratio)
        self.forecast_mae.labels(forecast="model").set(score.model_mae_rps)
        if score.persistence_mae_rps is not None:
            self.forecast_mae.labels(forecast="persistence").set(score.persistence_mae_rps)
        if score.yesterday_mae_rps is not None:
            self.forecast_mae.labels(forecast="yesterday").set(score.yesterday_mae_rps)
        self.forecast_scores.inc()

    def action_done(self, kind: str, pod: str, *, ok: bool) -> None:
        self.actions.labels(kind=kind, pod=pod, result="ok" if ok else "failed").inc()

    def apply_reported(self, report: ApplyReport) -> None:
        """Count every action of an executor run by kind, pod and result."""
        for result in report.results:
            action = result.action
            self.actions.labels(
                kind=action.kind.value, pod=action.pod, result=ACTION_RESULTS[result.status]
            ).inc()

    def job_failed(self, job: str) -> None:
        self.job_failures.labels(job=job).inc()


def forecast_error_ratio(forecast: dict[str, float], actual: dict[str, float]) -> float:
    """WAPE over adapters: sum |forecast - actual| / sum actual (0 when nothing came)."""
    names = forecast.keys() | actual.keys()
    error = sum(abs(forecast.get(n, 0.0) - actual.get(n, 0.0)) for n in names)
    total = sum(actual.values())
    if total <= 0.0:
        return 0.0 if error == 0.0 else 1.0
    return error / total


def active_adapters_by_pool(
    counts: pd.DataFrame, *, catalog: Catalog, fleet: Fleet, since: datetime
) -> dict[PoolId, int]:
    """Distinct adapters with requests at or after ``since``, per pool of their base
    model (adapters missing from the catalog or served by no pool are not counted)."""
    recent = counts.loc[(counts["ts"] >= pd.Timestamp(since)) & (counts["requests"] > 0)]
    names = set(recent["adapter"].astype(str))
    active: dict[PoolId, int] = {}
    for adapter in catalog.adapters:
        pool = fleet.pool_for_base(adapter.base_model)
        if pool is not None and adapter.name in names:
            active[pool.name] = active.get(pool.name, 0) + 1
    return active


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format, for a ``/metrics`` route."""
    return generate_latest(registry)


def _unix_s(moment: datetime) -> float:
    return moment.timestamp()
