"""Events in a replay: delivered in time order among the requests, met by lorafleet's
webhook path alone (reactive policies and the oracle send no event actions), their
figures, and a checked event log turned into the replay's events."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pandas as pd
import pytest

from placement.domain import (
    Action,
    ActionKind,
    AdapterId,
    Catalog,
    Fleet,
    Pipeline,
    Pipelines,
    PipelineStep,
    TenantId,
)
from placement.forecast.event_preloads import Event, EventKind
from placement.inputs.events import EVENT_COLUMNS, EventLog, load_events
from placement.settings import Settings
from placement.sim.engine import FleetReplay, SimRouter
from placement.sim.events import EventController, SimEvent, sim_events
from placement.sim.replay import ReplayResult, pod_specs, run_policy
from placement.sim.routers import REACTIVE, ReactiveRouter
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy
from policies.routing import RouteDecision
from tests import factories
from tests.factories import event_workload

GiB = 1 << 30
START = datetime(2026, 3, 10, 9, tzinfo=UTC)
MODEL = "llama-3.1-8b"
TENANT = TenantId("acme")


def workload(arrivals: list[tuple[float, str, str | None]]) -> SimWorkload:
    return event_workload(arrivals, start=START)


def fleet_of(count: int = 1) -> Fleet:
    return factories.replay_fleet(count)


def catalog_of(load: SimWorkload) -> Catalog:
    return factories.replay_catalog(
        load.size_bytes, tenant_of=lambda name: TENANT if name.startswith("acme") else None
    )


def login(event_id: str, at_s: float) -> SimEvent:
    return SimEvent(at_s=at_s, event=Event(kind=EventKind.LOGIN, id=event_id, tenant=TENANT))


#: Two busy adapters all along; acme logs in at 60 s and asks for its adapter at 100 s.
LOGIN_LOAD = workload(
    [(float(t), f"busy-{t % 2}", None) for t in range(0, 200)] + [(100.5, "acme-x", "e1")]
)


def replay_with_events(name: str, events: list[SimEvent]) -> ReplayResult:
    settings = Settings()
    fleet, catalog = fleet_of(), catalog_of(LOGIN_LOAD)
    planning = replay_planning(catalog, fleet, settings=settings, planner="greedy")
    controller = EventController.build(catalog, fleet, Pipelines(), max_loads=2)
    return run_policy(
        name,
        LOGIN_LOAD,
        fleet,
        settings=settings,
        planning=planning,
        events=events,
        controller=controller,
    )


class _Recording(ReactiveRouter):
    """Round-robin that notes what reaches it, in the order it does."""

    seen: list[str]

    def route(self, adapter: str, now_s: float) -> RouteDecision:
        self.seen.append(f"request {adapter} at {now_s:g}")
        return super().route(adapter, now_s)

    def on_event(self, event: Event, now_s: float, replay: FleetReplay) -> tuple[Action, ...]:
        self.seen.append(f"event {event.id} at {now_s:g}")
        return ()


class TestDelivery:
    def test_events_arrive_in_time_order_and_before_a_request_of_their_moment(self) -> None:
        load = workload([(0.0, "a", None), (5.0, "a", "e2"), (9.0, "a", None)])
        events = [login("e2", 5.0), login("e0", 0.0), login("e1", 2.5)]
        settings = Settings()
        replay = FleetReplay(
            load,
            pod_specs(fleet_of()),
            sim=settings.sim,
            load_cost=settings.load_cost,
            events=events,
        )
        router = _Recording("round-robin", replay, settings, EvictionPolicy.LRU)
        router.seen = []
        replay.run(router)
        assert router.seen == [
            "event e0 at 0",
            "request a at 0",
            "event e1 at 2.5",
            "event e2 at 5",
            "request a at 5",
            "request a at 9",
        ]
        assert replay.log.events == ["e0", "e1", "e2"]

    @pytest.mark.parametrize("epsilon", [1e-6, 1e-3, 0.5])
    def test_an_event_falls_between_the_requests_just_before_and_just_after_it(
        self, epsilon: float
    ) -> None:
        at_s = 50.0
        load = workload(
            [
                (0.0, "a", None),
                (at_s - epsilon, "a", None),
                (at_s, "b", None),
                (at_s + epsilon, "a", "e1"),
                (99.0, "a", None),
            ]
        )
        seen = _delivery_order(load, [login("e1", at_s)])
        assert seen[1:5] == [
            f"request a at {at_s - epsilon:g}",
            f"event e1 at {at_s:g}",
            f"request b at {at_s:g}",
            f"request a at {at_s + epsilon:g}",
        ]


def _delivery_order(load: SimWorkload, events: list[SimEvent]) -> list[str]:
    settings = Settings()
    replay = FleetReplay(
        load, pod_specs(fleet_of()), sim=settings.sim, load_cost=settings.load_cost, events=events
    )
    router = _Recording("round-robin", replay, settings, EvictionPolicy.LRU)
    router.seen = []
    replay.run(router)
    return router.seen


class _Sent:
    """A policy whose event actions are noted as they go to the engine."""

    def __init__(self, router: SimRouter, sent: list[Action]) -> None:
        self.router, self.sent = router, sent

    def on_event(self, event: Event, now_s: float, replay: FleetReplay) -> tuple[Action, ...]:
        actions = self.router.on_event(event, now_s, replay)
        self.sent.extend(actions)
        return actions


def _event_actions(name: str) -> list[Action]:
    """The actions policy ``name`` sends on a login of acme at 60 s."""
    sent: list[Action] = []

    class Listening(FleetReplay):
        def _event(self, router: SimRouter, k: int, now_s: float) -> None:
            super()._event(cast(SimRouter, _Sent(router, sent)), k, now_s)

    settings = Settings()
    fleet, catalog = fleet_of(), catalog_of(LOGIN_LOAD)
    run_policy(
        name,
        LOGIN_LOAD,
        fleet,
        settings=settings,
        planning=replay_planning(catalog, fleet, settings=settings, planner="greedy"),
        replay_type=Listening,
        events=[login("e1", 60.0)],
        controller=EventController.build(catalog, fleet, Pipelines(), max_loads=2),
    )
    return sent


class TestWhoActsOnEvents:
    @pytest.mark.parametrize("name", [*REACTIVE, "oracle"])
    def test_reactive_policies_and_the_oracle_send_no_event_actions(self, name: str) -> None:
        assert _event_actions(name) == []

    def test_lorafleet_sends_the_webhooks_preload(self) -> None:
        sent = _event_actions("lorafleet")
        assert [(a.kind, a.adapter) for a in sent if a.kind is ActionKind.WARMUP] == [
            (ActionKind.WARMUP, "acme-x")
        ]


class TestLorafleetPreloads:
    def test_lorafleet_preloads_on_a_login_and_reactive_policies_do_not(self) -> None:
        lorafleet = replay_with_events("lorafleet", [login("e1", 60.0)])
        epp = replay_with_events("epp", [login("e1", 60.0)])
        assert lorafleet.event_figures is not None
        assert epp.event_figures is not None
        figures = {
            key: lorafleet.event_figures[key]
            for key in ("count", "first_request_gpu_share", "preloads", "preloads_unused_share")
        }
        assert figures == {
            "count": 1,
            "first_request_gpu_share": 1.0,
            "preloads": 1,
            "preloads_unused_share": 0.0,
        }
        assert epp.event_figures["count"] == 1
        assert epp.event_figures["first_request_gpu_share"] == 0.0
        assert epp.event_figures["preloads"] == 0
        # The preloaded request skips the cold load EPP's first request waits for.
        assert (
            lorafleet.event_figures["first_request_ttft_p95_ms"]
            < epp.event_figures["first_request_ttft_p95_ms"]
        )

    def test_a_preload_no_request_reaches_is_unused(self) -> None:
        figures = replay_with_events("lorafleet", [login("e1", 60.0), login("e9", 150.0)])
        assert figures.event_figures is not None
        assert figures.event_figures["count"] == 2
        # e9's login finds acme-x on the GPU already: nothing to preload.
        assert figures.event_figures["preloads"] == 1

    def test_the_same_events_leave_the_replay_deterministic(self) -> None:
        first = replay_with_events("lorafleet", [login("e1", 60.0)])
        again = replay_with_events("lorafleet", [login("e1", 60.0)])
        assert first.metrics == again.metrics
        assert first.event_figures == again.event_figures


def _checked(tmp_path: Path, *rows: dict[str, str]) -> EventLog:
    path = tmp_path / "events.csv"
    pd.DataFrame(rows, columns=list(EVENT_COLUMNS)).to_csv(path, index=False)
    return load_events(path)


class TestSimEvents:
    """A checked event log on the replay's clock (the checks are ``inputs.events``')."""

    def convert(self, log: EventLog) -> list[SimEvent]:
        pipelines = Pipelines(
            pipelines=(
                Pipeline(
                    trigger="doc.uploaded", steps=(PipelineStep(adapter=AdapterId("acme-x")),)
                ),
            )
        )
        return sim_events(log, LOGIN_LOAD, catalog=catalog_of(LOGIN_LOAD), pipelines=pipelines)

    def test_events_inside_the_log_are_on_its_clock_in_order(self, tmp_path: Path) -> None:
        log = _checked(
            tmp_path,
            {"ts": "2026-03-10T09:01:00Z", "kind": "login", "tenant": "acme", "event_id": "e1"},
            {
                "ts": "2026-03-10T10:02:00+01:00",
                "kind": "pipeline",
                "trigger": "doc.uploaded",
                "event_id": "e2",
            },
        )
        events = self.convert(log)
        assert [(e.at_s, e.event.id, e.event.kind, e.event.tenant) for e in events] == [
            (60.0, "e1", EventKind.LOGIN, "acme"),
            # A pipeline event without a tenant: its first step's adapter's.
            (120.0, "e2", EventKind.PIPELINE, "acme"),
        ]
        assert events[1].event.trigger == "doc.uploaded"

    @pytest.mark.parametrize(
        "ts", ["2026-03-10T08:59:59Z", "2026-03-10T09:03:20.5Z"], ids=["before", "after"]
    )
    def test_an_event_outside_the_log_is_never_delivered(self, tmp_path: Path, ts: str) -> None:
        inside = {"ts": "2026-03-10T09:01:00Z", "kind": "login", "tenant": "acme"}
        outside = {"ts": ts, "kind": "login", "tenant": "acme", "event_id": "out"}
        rows = sorted([{**inside, "event_id": "in"}, outside], key=lambda row: row["ts"])
        assert [e.event.id for e in self.convert(_checked(tmp_path, *rows))] == ["in"]

    def test_the_log_ends_with_its_last_request(self, tmp_path: Path) -> None:
        last = {"ts": "2026-03-10T09:03:19Z", "kind": "login", "tenant": "acme", "event_id": "z"}
        assert [e.at_s for e in self.convert(_checked(tmp_path, last))] == [199.0]


def test_reactive_router_ignores_events() -> None:
    settings = Settings()
    replay = FleetReplay(
        LOGIN_LOAD, pod_specs(fleet_of()), sim=settings.sim, load_cost=settings.load_cost
    )
    router = ReactiveRouter("epp", replay, settings, EvictionPolicy.LRU)
    assert router.on_event(login("e1", 1.0).event, 1.0, replay) == ()
