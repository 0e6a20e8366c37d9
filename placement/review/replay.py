"""Hit rate before and after a plan: the last day of the request log replayed twice.

Owns the bridge from a fixed ``Plan`` to the replay simulator (``placement.sim``):
a planner that always answers with the plan's hot sets and weights, so that the
simulator's ``lorafleet`` policy routes and protects exactly what the plan says. The
"before" side replays the plan it is compared against, or, without one, the
reactive ``round-robin`` baseline (what a fleet without a plan does).

No IO; CPU only (a day of requests replays in seconds). Raises ``InputError`` when
the log and catalog cannot be replayed (unknown adapters, several pools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from placement.domain import Catalog, Fleet, PodId, Tier
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.plan import Plan
from placement.settings import Settings
from placement.sim.planning import History, Planner, PlanRequest, SimPlan
from placement.sim.replay import PlanningParts, pod_specs, run_policy
from placement.sim.workload import workload_from_log

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


def fixed_planner(plan: Plan, pod_ids: tuple[str, ...]) -> Planner:
    """A planner that ignores the forecast and answers with ``plan`` on these pods."""
    known = set(pod_ids)
    hot = {
        pod_id: frozenset(str(a) for a in plan.pods[PodId(pod_id)].hot)
        if pod_id in plan.pods
        else frozenset()
        for pod_id in pod_ids
    }
    weights: dict[str, dict[str, float]] = {}
    for adapter, entry in plan.adapters.items():
        if entry.tier is not Tier.HOT:
            continue
        shares = {str(pod): weight for pod, weight in entry.pods.items() if pod in known}
        if shares:
            weights[str(adapter)] = shares
    fixed = SimPlan(hot=hot, weights=weights, source="fixed")

    def planner(_: PlanRequest) -> SimPlan:
        return fixed

    return planner


def _no_forecast(_: History, __: float, ___: float) -> dict[str, float]:
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
    specs = pod_specs(fleet)
    pod_ids = tuple(spec.pod_id for spec in specs)

    def under(fixed: Plan) -> Mapping[str, float | int | bool]:
        parts = PlanningParts(
            forecaster=_no_forecast,
            planner=fixed_planner(fixed, pod_ids),
            description=f"fixed plan {fixed.id}",
        )
        return run_policy("lorafleet", workload, specs, settings=settings, parts=parts).metrics

    after = under(plan)
    if against is not None:
        before, before_label = under(against), f"plan {against.id}"
    else:
        before = run_policy(BASELINE, workload, specs, settings=settings).metrics
        before_label = f"no plan ({BASELINE}, LRU)"
    return ReplayComparison(
        before_label=before_label,
        after_label=f"plan {plan.id}",
        before=before,
        after=after,
        requests=len(workload),
        span=f"{workload.start:%Y-%m-%d %H:%M} UTC + {workload.duration_s / 3600:.1f} h",
    )
