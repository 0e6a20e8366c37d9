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
    controller.forecast_scored(error_ratio=0.25)
    labels = {"kind": "load", "pod": "pod-0"}
    assert sample(registry, "lorafleet_controller_actions_total", **labels, result="ok") == 1
    assert sample(registry, "lorafleet_controller_actions_total", **labels, result="failed") == 2
    assert sample(registry, "lorafleet_controller_job_failures_total", job="plan") == 1
    assert sample(registry, "lorafleet_forecast_error_ratio") == 0.25


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
