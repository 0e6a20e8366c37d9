"""placement.metrics: the families exist on the injected registry and move as documented."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from placement.actuation.executor import ActionResult, ApplyReport, Status
from placement.domain import AdapterId, Load, PodId, Unload, Warmup
from placement.forecast.scoring import ForecastScore
from placement.metrics import (
    ControllerMetrics,
    FleetMetrics,
    forecast_error_ratio,
    render,
)
from placement.plan import Plan, SolverReport
from placement.router.metrics import RouterMetrics
from tests import factories


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    value = registry.get_sample_value(name, labels)
    return value


def test_every_process_can_share_one_registry() -> None:
    # Duplicate names raise in prometheus_client: this is the no-clash check with the router.
    registry = CollectorRegistry()
    RouterMetrics(registry)
    FleetMetrics(registry)
    ControllerMetrics(registry)
    names = {family.name for family in registry.collect()}
    assert all(name.startswith("lorafleet_") for name in names)


def test_registries_are_independent() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    FleetMetrics(first).load_queue_depth("pod-0", depth=3)
    FleetMetrics(second)
    assert sample(first, "lorafleet_load_queue_depth", pod="pod-0") == 3
    assert sample(second, "lorafleet_load_queue_depth", pod="pod-0") is None


def test_residency_is_observed_from_activation_to_eviction() -> None:
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    fleet.pod_slots("pod-0", slots=4)
    fleet.activated("pod-0", "legal-v2", now_s=100.0)
    fleet.activated("pod-0", "legal-v2", now_s=150.0)  # a hit: the stay goes on
    fleet.activated("pod-0", "finance-v3", now_s=120.0)
    assert sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-0") == 2
    fleet.evicted("pod-0", "legal-v2", now_s=140.0)
    fleet.evicted("pod-0", "never-seen", now_s=141.0)  # unknown: nothing observed
    assert sample(registry, "lorafleet_adapter_residency_seconds_count", pod="pod-0") == 1
    assert sample(registry, "lorafleet_adapter_residency_seconds_sum", pod="pod-0") == 40.0
    assert (
        sample(registry, "lorafleet_adapter_residency_seconds_bucket", pod="pod-0", le="30.0") == 0
    )
    assert (
        sample(registry, "lorafleet_adapter_residency_seconds_bucket", pod="pod-0", le="60.0") == 1
    )
    assert sample(registry, "lorafleet_adapter_evictions_total", pod="pod-0") == 1
    assert sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-0") == 1
    assert sample(registry, "lorafleet_pod_gpu_slots", pod="pod-0") == 4


def test_a_pod_that_empties_ends_every_stay() -> None:
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    for adapter in ("a", "b", "c"):
        fleet.activated("pod-1", adapter, now_s=0.0)
    fleet.activated("pod-2", "a", now_s=0.0)
    fleet.pod_emptied("pod-1", now_s=600.0)
    assert sample(registry, "lorafleet_adapter_residency_seconds_count", pod="pod-1") == 3
    assert sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-1") == 0
    assert sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-2") == 1


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.booleans(), st.floats(0, 1e4)),
        max_size=60,
    )
)
def test_gpu_adapters_gauge_counts_resident_adapters(
    events: list[tuple[str, bool, float]],
) -> None:
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    resident: set[str] = set()
    for adapter, arrives, now_s in events:
        if arrives:
            fleet.activated("pod-0", adapter, now_s=now_s)
            resident.add(adapter)
        else:
            fleet.evicted("pod-0", adapter, now_s=now_s)
            resident.discard(adapter)
    gauge = sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-0") or 0.0
    assert gauge == len(resident)
    observed = sample(registry, "lorafleet_adapter_residency_seconds_sum", pod="pod-0") or 0.0
    assert observed >= 0.0


def test_pool_activity_sets_active_adapters_and_slots() -> None:
    registry = CollectorRegistry()
    FleetMetrics(registry).pool_activity("llama-70b", active_adapters=60, slots=32)
    assert sample(registry, "lorafleet_active_adapters", pool="llama-70b") == 60
    assert sample(registry, "lorafleet_slot_capacity", pool="llama-70b") == 32


def plan_at(created: datetime, *, gap: float, wall_s: float, status: str = "FEASIBLE") -> Plan:
    return Plan(
        id="plan-1",
        created_at=created,
        valid_from=created,
        valid_until=created + timedelta(minutes=30),
        pods=MappingProxyType({}),
        adapters=MappingProxyType({}),
        predicted=MappingProxyType({"gpu_hit_rate": 0.93}),
        solver=SolverReport(status=status, objective=10.0, bound=9.0, gap=gap, wall_s=wall_s),
    )


def test_plan_published_sets_age_solver_quality_and_prediction() -> None:
    registry = CollectorRegistry()
    controller = ControllerMetrics(registry)
    created = datetime(2026, 3, 12, 10, 0, tzinfo=UTC)
    controller.plan_published(plan_at(created, gap=0.1, wall_s=1.5), period_s=300)
    assert sample(registry, "lorafleet_plan_created_timestamp_seconds") == created.timestamp()
    assert sample(registry, "lorafleet_plan_period_seconds") == 300
    assert sample(registry, "lorafleet_solver_gap_ratio") == pytest.approx(0.1)
    assert sample(registry, "lorafleet_solver_duration_seconds_sum") == 1.5
    assert sample(registry, "lorafleet_plans_total", status="FEASIBLE") == 1
    assert sample(registry, "lorafleet_plan_predicted_hit_ratio") == pytest.approx(0.93)
    # A greedy fallback has no bound: the gap keeps its last finite value.
    controller.plan_published(
        plan_at(created, gap=math.nan, wall_s=0.2, status="FALLBACK_GREEDY"), period_s=300
    )
    assert sample(registry, "lorafleet_solver_gap_ratio") == pytest.approx(0.1)
    assert sample(registry, "lorafleet_plans_total", status="FALLBACK_GREEDY") == 1


def test_planning_period_is_set_before_any_plan() -> None:
    registry = CollectorRegistry()
    ControllerMetrics(registry).planning_period(300)
    assert sample(registry, "lorafleet_plan_period_seconds") == 300
    assert sample(registry, "lorafleet_plan_created_timestamp_seconds") == 0


def test_actions_jobs_and_forecast_error() -> None:
    registry = CollectorRegistry()
    controller = ControllerMetrics(registry)
    controller.action_done("load", "pod-0", ok=True)
    controller.action_done("load", "pod-0", ok=False)
    controller.action_done("load", "pod-0", ok=False)
    controller.job_failed("plan")
    controller.forecast_scored(_score(error_ratio=0.25, yesterday=None))
    labels = {"kind": "load", "pod": "pod-0"}
    assert sample(registry, "lorafleet_controller_actions_total", **labels, result="ok") == 1
    assert sample(registry, "lorafleet_controller_actions_total", **labels, result="failed") == 2
    assert sample(registry, "lorafleet_controller_job_failures_total", job="plan") == 1
    assert sample(registry, "lorafleet_forecast_error_ratio") == 0.25


def _score(*, error_ratio: float, yesterday: float | None) -> ForecastScore:
    start = datetime(2026, 11, 30, 12, tzinfo=UTC)
    return ForecastScore(
        start=start,
        end=start + timedelta(hours=1),
        adapters=3,
        actual_requests=900.0,
        model_mae_rps=0.5,
        persistence_mae_rps=0.75,
        yesterday_mae_rps=yesterday,
        error_ratio=error_ratio,
    )


def test_forecast_scored_sets_each_forecasts_mae_and_counts_the_window() -> None:
    registry = CollectorRegistry()
    controller = ControllerMetrics(registry)
    controller.forecast_scored(_score(error_ratio=0.1, yesterday=None))
    assert sample(registry, "lorafleet_forecast_mae_rps", forecast="model") == 0.5
    assert sample(registry, "lorafleet_forecast_mae_rps", forecast="persistence") == 0.75
    # No day of history yet: no yesterday series, rather than a forecast of nothing.
    assert sample(registry, "lorafleet_forecast_mae_rps", forecast="yesterday") is None
    controller.forecast_scored(_score(error_ratio=0.2, yesterday=1.25))
    assert sample(registry, "lorafleet_forecast_mae_rps", forecast="yesterday") == 1.25
    assert sample(registry, "lorafleet_forecast_scores_total") == 2
    assert sample(registry, "lorafleet_forecast_error_ratio") == 0.2


def test_adapter_tenants_follow_the_catalog() -> None:
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    catalog = factories.catalog(
        factories.adapter("a", tenant="acme"),
        factories.adapter("b", tenant="acme"),
        factories.adapter("c"),
    )
    fleet.adapter_tenants(catalog)
    info = "lorafleet_adapter_tenant_info"
    assert sample(registry, info, adapter="a", tenant="acme") == 1
    assert sample(registry, info, adapter="b", tenant="acme") == 1
    assert not [s for f in registry.collect() for s in f.samples if s.labels.get("adapter") == "c"]
    # b moves to another tenant and a leaves the catalog: their old series go.
    fleet.adapter_tenants(factories.catalog(factories.adapter("b", tenant="globex")))
    assert sample(registry, info, adapter="a", tenant="acme") is None
    assert sample(registry, info, adapter="b", tenant="acme") is None
    assert sample(registry, info, adapter="b", tenant="globex") == 1


def test_router_load_and_queue_histograms() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    metrics.adapter_loaded(source="storage", queued_s=10.0, started_s=10.002, finished_s=10.3)
    metrics.adapter_loaded(source="host", queued_s=5.0, started_s=5.0, finished_s=5.004)
    metrics.request_queued("load", 0.31)
    metrics.request_queued("none", 0.0004)
    metrics.request_queued("none", -0.1)  # a clock step back counts as no wait
    name = "lorafleet_adapter_load_seconds"
    for stage, seconds in [("queued", 0.002), ("loading", 0.298), ("total", 0.3)]:
        got = sample(registry, f"{name}_sum", source="storage", stage=stage)
        assert got == pytest.approx(seconds)
    assert sample(registry, f"{name}_count", source="host", stage="total") == 1
    assert sample(registry, f"{name}_bucket", source="storage", stage="total", le="0.2") == 0
    assert sample(registry, f"{name}_bucket", source="storage", stage="total", le="0.4") == 1
    queue = "lorafleet_request_queue_seconds"
    assert sample(registry, f"{queue}_count", cause="none") == 2
    assert sample(registry, f"{queue}_bucket", cause="none", le="0.001") == 2
    assert sample(registry, f"{queue}_bucket", cause="load", le="0.2") == 0


@pytest.mark.parametrize(
    ("forecast", "actual", "expected"),
    [
        ({"a": 10.0, "b": 5.0}, {"a": 10.0, "b": 5.0}, 0.0),
        ({"a": 12.0}, {"a": 10.0, "b": 10.0}, (2.0 + 10.0) / 20.0),
        ({"a": 3.0}, {}, 1.0),
        ({}, {}, 0.0),
    ],
    ids=["exact", "missed-adapter", "nothing-came", "nothing-at-all"],
)
def test_forecast_error_ratio(
    forecast: dict[str, float], actual: dict[str, float], expected: float
) -> None:
    assert forecast_error_ratio(forecast, actual) == pytest.approx(expected)


def test_render_is_prometheus_text() -> None:
    registry = CollectorRegistry()
    FleetMetrics(registry).load_queue_depth("pod-3", depth=2)
    families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
    (value,) = families["lorafleet_load_queue_depth"].samples
    assert value.labels == {"pod": "pod-3"} and value.value == 2


def test_apply_report_counts_actions_by_kind_pod_and_result() -> None:
    pod0, pod1 = PodId("pod-0"), PodId("pod-1")
    results = (
        ActionResult(
            action=Load(pod=pod0, adapter=AdapterId("a"), reason="plan"), status=Status.DONE
        ),
        ActionResult(
            action=Load(pod=pod0, adapter=AdapterId("b"), reason="plan"), status=Status.UNCHANGED
        ),
        ActionResult(
            action=Warmup(pod=pod1, adapter=AdapterId("a"), reason="plan"), status=Status.FAILED
        ),
        ActionResult(
            action=Unload(pod=pod1, adapter=AdapterId("c"), reason="plan"), status=Status.SKIPPED
        ),
    )
    registry = CollectorRegistry()
    ControllerMetrics(registry).apply_reported(ApplyReport(results=results))

    def count(kind: str, pod: str, result: str) -> float | None:
        return sample(
            registry, "lorafleet_controller_actions_total", kind=kind, pod=pod, result=result
        )

    assert count("load", "pod-0", "ok") == 1
    assert count("load", "pod-0", "unchanged") == 1
    assert count("warmup", "pod-1", "failed") == 1
    assert count("unload", "pod-1", "skipped") == 1


def test_fleet_activity_counts_distinct_recent_adapters_per_pool() -> None:
    adapters = factories.catalog(*map(factories.adapter, ["a", "b", "c", "d"]))
    pods = factories.fleet(factories.pool("base", 3, pod_prefix="pod", max_loras=4))
    now = datetime(2026, 3, 12, 12, 0, tzinfo=UTC)
    counts = pd.DataFrame(
        {
            "ts": pd.to_datetime(
                [now - timedelta(hours=3), now - timedelta(minutes=30), now - timedelta(minutes=5)]
                * 2,
                utc=True,
            ),
            "adapter": ["a", "b", "c", "d", "unknown", "b"],
            "requests": [5, 1, 2, 0, 9, 3],
        }
    )
    registry = CollectorRegistry()
    FleetMetrics(registry).fleet_activity(
        counts,
        catalog=adapters,
        fleet=pods,
        since=now - timedelta(hours=1),
        ready=[PodId("pod-0"), PodId("pod-1")],
    )
    # b and c had requests in the last hour; a is older, d had none, unknown is not ours.
    assert sample(registry, "lorafleet_active_adapters", pool="base") == 2
    assert sample(registry, "lorafleet_slot_capacity", pool="base") == 8


def test_gpu_snapshots_start_and_end_stays() -> None:
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    fleet.observe_gpu("pod-0", ["a", "b"], now_s=0.0)
    fleet.observe_gpu("pod-0", ["a", "b"], now_s=10.0)
    fleet.observe_gpu("pod-0", ["a", "c"], now_s=20.0)  # b evicted by c
    fleet.observe_gpu("pod-1", ["b"], now_s=20.0)
    fleet.observe_gpu("pod-0", ["c"], now_s=50.0)  # a evicted
    assert sample(registry, "lorafleet_adapter_residency_seconds_count", pod="pod-0") == 2
    assert sample(registry, "lorafleet_adapter_residency_seconds_sum", pod="pod-0") == 20.0 + 50.0
    assert sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-0") == 1
    assert sample(registry, "lorafleet_pod_gpu_adapters", pod="pod-1") == 1
