"""Hit rate before and after a plan: the last day of the request log replayed twice.

Owns the bridge from a fixed ``Plan`` to the replay simulator (``placement.sim``):
a ``Planner`` that always answers with that plan, so that the simulator's
``lorafleet`` policy routes and protects exactly what the plan says. The
"before" side replays the plan it is compared against, or, without one, the
reactive ``round-robin`` baseline (what a fleet without a plan does). Each side's
per-request outcomes give SLO attainment per tenant (``placement.review.slo``).

No IO; CPU only (a day of requests replays in seconds). Raises ``InputError`` when
the log and catalog cannot be replayed (unknown adapters, several pools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from placement.domain import AdapterId, Catalog, Fleet
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.plan import Plan
from placement.review.slo import TenantAttainment, attainment_per_tenant
from placement.settings import Settings
from placement.sim.planning import ReplayPlanning
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.workload import workload_from_log
from placement.solver.planner import Planner
from placement.solver.problem import Demand

#: The figures the report shows, in order, with their labels.
SHOWN = (
    ("gpu_hit_rate", "GPU hit rate"),
    ("cpu_hit_rate", "host (warm) hit rate"),
    ("cold_load_rate", "cold load rate"),
    ("loads", "adapter loads"),
    ("loads_per_pod_s_peak", "peak loads / pod / s"),
    ("residency_p50_s", "residency p50 (s)"),
    ("ttft_p95_ms", "TTFT p95 (ms)"),
)
BASELINE = "round-robin"


@dataclass(frozen=True, kw_only=True)
class ReplayComparison:
    before_label: str
    after_label: str
    before: Mapping[str, float | int | bool]
    after: Mapping[str, float | int | bool]
    requests: int
    span: str
    #: SLO attainment per tenant in each replay (``placement.review.slo``).
    before_tenants: tuple[TenantAttainment, ...] = ()
    after_tenants: tuple[TenantAttainment, ...] = ()


def fixed_planner(plan: Plan) -> Planner:
    """A planner that ignores the demand and answers with ``plan``."""

    def planner(
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan:
        return plan

    return planner


def _no_forecast(
    history: RequestLog, *, start: datetime, duration_s: int
) -> Mapping[AdapterId, Demand]:
    return {}


def last_day(log: RequestLog, *, span: timedelta = timedelta(days=1)) -> RequestLog:
    """The requests of the last ``span`` of the log."""
    frame = log.frame
    if frame.empty:
        return log
    recent = frame.loc[frame["ts"] >= frame["ts"].max() - span]
    return request_log_from_frame(recent, source=log.source)


def compare_replays(
    plan: Plan,
    *,
    against: Plan | None,
    log: RequestLog,
    catalog: Catalog,
    fleet: Fleet,
    settings: Settings,
    span: timedelta = timedelta(days=1),
) -> ReplayComparison:
    """Replay the last ``span`` of ``log`` under ``against`` (or the baseline) and ``plan``."""
    recent = last_day(log, span=span)
    workload = workload_from_log(recent, catalog, bucket_s=settings.forecast.bucket_s)

    def under(fixed: Plan) -> ReplayResult:
        # No demand and no floor: every hot adapter of the plan is protected.
        planning = ReplayPlanning(
            fleet=fleet,
            forecaster=_no_forecast,
            planner=fixed_planner(fixed),
            description=f"fixed plan {fixed.id}",
        )
        return run_policy("lorafleet", workload, fleet, settings=settings, planning=planning)

    def tenants(result: ReplayResult) -> tuple[TenantAttainment, ...]:
        target = settings.planner.gpu_residency_target
        return attainment_per_tenant(result.log, workload, catalog, gpu_target=target)

    after = under(plan)
    if against is not None:
        before, before_label = under(against), f"plan {against.id}"
    else:
        before = run_policy(BASELINE, workload, fleet, settings=settings)
        before_label = f"no plan ({BASELINE}, LRU)"
    return ReplayComparison(
        before_label=before_label,
        after_label=f"plan {plan.id}",
        before=before.metrics,
        after=after.metrics,
        requests=len(workload),
        span=f"{workload.start:%Y-%m-%d %H:%M} UTC + {workload.duration_s / 3600:.1f} h",
        before_tenants=tenants(before),
        after_tenants=tenants(after),
    )
