"""The figures of issue 16: cold loads on the critical path (every policy), login
surges and their per-tenant TTFT p95, and the event figures by kind."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.domain import TenantId
from placement.forecast.event_preloads import Event, EventKind
from placement.settings import Settings
from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT, REJECTED, FleetReplay, SimLog
from placement.sim.events import SimEvent
from placement.sim.figures import (
    SURGE_GAP_S,
    SURGE_TAIL_S,
    compute_metrics,
    event_metrics,
    event_metrics_by_kind,
    login_surges,
    surge_ttft_p95_ms,
)
from placement.sim.pods import PodSpec
from placement.sim.routers import ReactiveRouter
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy
from tests.factories import event_workload

START = datetime(2026, 3, 10, 9, tzinfo=UTC)


def workload(rows: list[tuple[float, str, str | None]]) -> SimWorkload:
    return event_workload(rows, start=START)


def login(event_id: str, at_s: float, tenant: str = "acme") -> SimEvent:
    event = Event(kind=EventKind.LOGIN, id=event_id, tenant=TenantId(tenant))
    return SimEvent(at_s=at_s, event=event)


def pipeline(event_id: str, at_s: float) -> SimEvent:
    event = Event(kind=EventKind.PIPELINE, id=event_id, tenant=TenantId("acme"), trigger="t")
    return SimEvent(at_s=at_s, event=event)


def replayed(load: SimWorkload, events: list[SimEvent] | None = None) -> tuple[SimLog, FleetReplay]:
    """One vLLM pod with one GPU slot and a host cache of two, round-robin."""
    settings = Settings()
    spec = PodSpec(pod_id="pod-0", max_loras=1, max_cpu_loras=2)
    replay = FleetReplay(
        load, [spec], sim=settings.sim, load_cost=settings.load_cost, events=events
    )
    log = replay.run(ReactiveRouter("round-robin", replay, Settings(), EvictionPolicy.LRU))
    return log, replay


class TestColdLoadsOnTheCriticalPath:
    #: a and b come from storage; a again from host RAM (b took its slot); c from
    #: storage, with two more requests for c arriving while its load is in flight.
    LOAD = workload(
        [
            (0.0, "a", None),
            (10.0, "b", None),
            (20.0, "a", None),
            (30.0, "c", None),
            (30.001, "c", None),
            (30.002, "c", None),
            (40.0, "c", None),
        ]
    )

    def test_counts_the_requests_that_waited_for_a_storage_load(self) -> None:
        log, replay = replayed(self.LOAD)
        assert log.outcome == [
            COLD_LOAD,
            COLD_LOAD,
            CPU_HIT,
            COLD_LOAD,
            COLD_LOAD,
            COLD_LOAD,
            GPU_HIT,
        ]
        metrics = compute_metrics(log, replay.pods, self.LOAD.arrival_s, sim=Settings().sim)
        assert metrics["cold_loads_on_critical_path"] == 5
        # Three storage loads: the figure counts requests, not loads.
        assert metrics["cold_loads"] == 3

    def test_a_window_counts_its_own_requests(self) -> None:
        log, replay = replayed(self.LOAD)
        metrics = compute_metrics(
            log, replay.pods, self.LOAD.arrival_s, sim=Settings().sim, window=(15.0, 35.0)
        )
        assert metrics["cold_loads_on_critical_path"] == 3

    def test_event_caused_requests_alone_in_the_events_block(self) -> None:
        load = workload(
            [(0.0, "a", None), (10.0, "b", "e1"), (10.001, "b", "e1"), (20.0, "a", "e2")]
        )
        events = [login("e1", 9.0), pipeline("e2", 19.0)]
        log, _ = replayed(load, events)
        assert log.outcome == [COLD_LOAD, COLD_LOAD, COLD_LOAD, CPU_HIT]
        figures = event_metrics(log, load, events)
        assert figures["cold_loads_on_critical_path"] == 2
        by_kind = event_metrics_by_kind(log, load, events)
        assert by_kind["login"]["cold_loads_on_critical_path"] == 2
        assert by_kind["login"]["count"] == 1
        assert by_kind["pipeline"] == {
            "count": 1,
            "first_request_gpu_share": 0.0,
            "first_request_ttft_p95_ms": round(log.ttft_ms[3], 3),
            "cold_loads_on_critical_path": 0,
        }


class TestLoginSurges:
    def test_logins_less_than_the_gap_apart_are_one_surge(self) -> None:
        events = [
            login("1", 100.0),
            login("2", 100.0 + SURGE_GAP_S - 1),
            login("3", 100.0 + 2 * SURGE_GAP_S - 2),
            login("4", 10_000.0),
            login("5", 500.0, tenant="globex"),
            pipeline("p", 200.0),
        ]
        assert login_surges(events) == {
            "acme": [
                (100.0, 100.0 + 2 * SURGE_GAP_S - 2 + SURGE_TAIL_S),
                (10_000.0, 10_000.0 + SURGE_TAIL_S),
            ],
            "globex": [(500.0, 500.0 + SURGE_TAIL_S)],
        }

    def test_a_gap_of_exactly_the_limit_splits(self) -> None:
        spans = login_surges([login("1", 0.0), login("2", SURGE_GAP_S)])["acme"]
        assert len(spans) == 2

    @given(st.lists(st.integers(0, 50_000).map(float), min_size=1, max_size=40))
    def test_every_login_is_in_exactly_one_surge_and_surges_are_apart(
        self, times: list[float]
    ) -> None:
        spans = login_surges([login(str(k), at_s) for k, at_s in enumerate(times)])["acme"]
        for at_s in times:
            assert sum(start <= at_s <= end - SURGE_TAIL_S for start, end in spans) == 1
        for (_, end), (start, _) in pairwise(spans):
            assert start - (end - SURGE_TAIL_S) >= SURGE_GAP_S


class TestSurgeTTFT:
    def test_p95_of_the_tenants_requests_in_its_surges(self) -> None:
        rows: list[tuple[float, str, str | None]] = [
            (float(t), "acme-a" if t % 2 else "other", None) for t in range(0, 3000, 5)
        ]
        load = workload(rows)
        events = [login("1", 1000.0), login("2", 1100.0)]
        log, _ = replayed(load, events)
        tenants = {"acme-a": "acme"}
        figures = surge_ttft_p95_ms(log, load, events, adapter_tenants=tenants)
        arrivals = np.asarray(load.arrival_s)
        inside = (
            (arrivals >= 1000.0)
            & (arrivals <= 1100.0 + SURGE_TAIL_S)
            & (np.asarray(load.adapters) == "acme-a")
            & (np.asarray(log.outcome) != REJECTED)
        )
        expected = round(float(np.percentile(np.asarray(log.ttft_ms)[inside], 95)), 3)
        assert figures == {"acme": expected}
        assert expected > 0.0

    def test_a_tenant_with_no_request_in_a_surge_is_left_out(self) -> None:
        load = workload([(0.0, "acme-a", None), (5000.0, "acme-a", None)])
        events = [login("1", 1000.0), login("2", 2000.0, tenant="globex")]
        log, _ = replayed(load, events)
        assert surge_ttft_p95_ms(log, load, events, adapter_tenants={"acme-a": "acme"}) == {}

    @pytest.mark.parametrize(
        ("window", "tenants"), [((0.0, 500.0), set()), ((0.0, 5000.0), {"acme"})]
    )
    def test_a_window_restricts_the_requests(
        self, window: tuple[float, float], tenants: set[str]
    ) -> None:
        load = workload([(float(t), "acme-a", None) for t in range(0, 3000, 10)])
        events = [login("1", 1000.0)]
        log, _ = replayed(load, events)
        figures = surge_ttft_p95_ms(
            log, load, events, adapter_tenants={"acme-a": "acme"}, window=window
        )
        assert set(figures) == tenants
