"""Pipeline and login events in a replay, and the simulated controller that meets them.

The event log is read and checked by ``placement.inputs.events`` (``check_events``,
``load_events``: unknown kinds, triggers and tenants, repeated or bad ids, events out
of time order, events outside the request log's span), exactly as ``lorafleet
validate --events`` checks it. This module only turns a checked ``EventLog`` into
``SimEvent`` values on the replay's seconds clock (``sim_events``), leaving out the
events outside the request log's span, which the check reported as warnings and a
replay never delivers; ``learned_pipelines`` learns pipelines.yaml's step
probabilities from such events and the requests they caused.

``EventController`` is what lorafleet's controller does on a webhook event
(``placement.controller.ticks.Controller.on_event``): the same ``event_preloads`` with
the same predictor, its views built from the simulated pods' engine models as the
controller builds them from its ledger's. The engine applies the Load/Warmup actions
it returns. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from placement.domain import Action, AdapterId, Catalog, Fleet, Pipelines, PodId, TenantId
from placement.forecast.event_predictors import learned_steps
from placement.forecast.event_preloads import (
    Event,
    EventKind,
    PodView,
    Predictor,
    event_preloads,
    pipeline_predictor,
)
from placement.inputs.events import EventLog
from placement.plan import Plan
from placement.sim.pods import SimPod
from placement.sim.workload import SimWorkload


@dataclass(frozen=True, kw_only=True)
class SimEvent:
    at_s: float
    event: Event


def _tenant_of(trigger: str | None, pipelines: Pipelines, catalog: Catalog) -> str:
    """A pipeline event without a tenant: the tenant of its first step's adapter."""
    pipeline = pipelines.by_trigger().get(trigger or "")
    adapters = catalog.by_name()
    for step in pipeline.steps if pipeline is not None else ():
        adapter = adapters.get(step.adapter)
        if adapter is not None and adapter.tenant is not None:
            return str(adapter.tenant)
    return ""


def sim_events(
    log: EventLog, workload: SimWorkload, *, catalog: Catalog, pipelines: Pipelines
) -> list[SimEvent]:
    """The events of a checked log (``load_events``) that a replay delivers: those in
    the request log's span, on its seconds clock, in time order."""
    origin = pd.Timestamp(workload.start)
    end_s = workload.duration_s
    frame = log.frame
    columns = (frame[name] for name in ("ts", "kind", "trigger", "tenant", "event_id"))
    events: list[SimEvent] = []
    for stamp, kind, trigger, named, event_id in zip(*columns, strict=True):
        at_s = (stamp - origin).total_seconds()
        if at_s < 0.0 or at_s > end_s:
            continue  # a warning of the check: never delivered
        event_kind = EventKind(str(kind))
        tenant = named
        if tenant is None and event_kind is EventKind.PIPELINE:
            tenant = _tenant_of(trigger, pipelines, catalog)
        event = Event(
            kind=event_kind, id=str(event_id), tenant=TenantId(tenant or ""), trigger=trigger
        )
        events.append(SimEvent(at_s=at_s, event=event))
    return events


def learned_pipelines(
    pipelines: Pipelines, events: Sequence[SimEvent], workload: SimWorkload
) -> Pipelines:
    """pipelines.yaml with its steps' probabilities learned (``learned_steps``) from these
    pipeline events and the requests of ``workload`` they caused (its ``event_ids``): a
    history's, for a replay of a later window, since a replay that learns from its own
    requests knows its future."""
    triggers = {
        e.event.id: e.event.trigger
        for e in events
        if e.event.kind is EventKind.PIPELINE and e.event.trigger is not None
    }
    caused = (
        (event_id, adapter)
        for event_id, adapter in zip(workload.event_ids, workload.adapters, strict=False)
        if event_id is not None
    )
    return learned_steps(pipelines, triggers=triggers, caused=caused)


@dataclass(frozen=True, kw_only=True)
class EventController:
    """The controller's webhook path inside a replay (``Controller.on_event``)."""

    catalog: Catalog
    fleet: Fleet
    predictor: Predictor
    max_loads: int

    @classmethod
    def build(
        cls, catalog: Catalog, fleet: Fleet, pipelines: Pipelines, *, max_loads: int
    ) -> EventController:
        predictor = pipeline_predictor(pipelines, catalog)
        return cls(catalog=catalog, fleet=fleet, predictor=predictor, max_loads=max_loads)

    def decide(
        self,
        event: Event,
        pods: Sequence[SimPod],
        *,
        plan: Plan | None,
        busy_rps: Mapping[str, float],
        now_s: float | None = None,
    ) -> tuple[Action, ...]:
        """The event's Load/Warmup actions. ``now_s`` is the replay's moment; without it,
        the latest request any pod admitted stands for it (never later than the true
        moment, so no adapter looks idler than it is)."""
        decision = event_preloads(
            event,
            self.predictor(event),
            catalog=self.catalog,
            fleet=self.fleet,
            plan=plan,
            views=self.views(pods, now_s=now_s),
            busy_rps={AdapterId(name): rps for name, rps in busy_rps.items()},
            max_loads=self.max_loads,
        )
        return decision.actions

    def views(self, pods: Sequence[SimPod], *, now_s: float | None = None) -> dict[PodId, PodView]:
        """Each pod as its engine model has it, as the controller's ``_views`` reads its
        ledger: the names it lists, its GPU slots least recently used first (a slot an
        unloaded name's entry holds as ``?unloaded-N``) and its pins; and how long each
        adapter on a slot has been idle at ``now_s`` (0 while a request for it runs or
        waits), see ``decide``."""
        if now_s is None:
            now_s = max((s for pod in pods for s in pod.last_used.values()), default=0.0)
        by_name = {str(pod.name): pod for pod in self.fleet.pods}
        views: dict[PodId, PodView] = {}
        for sim_pod in pods:
            pod = by_name.get(sim_pod.pod_id)
            if pod is None:
                continue
            model = sim_pod.model
            hot = tuple(
                AdapterId(name if listed else f"?unloaded-{k}")
                for k, (name, listed) in enumerate(model.gpu_entries())
            )
            views[pod.name] = PodView(
                pod=pod,
                registered=frozenset(AdapterId(name) for name in model.listed),
                hot=hot,
                pinned=frozenset(AdapterId(name) for name in model.pinned),
                idle_s=_idle_s(sim_pod, now_s),
            )
        return views


def _idle_s(pod: SimPod, now_s: float) -> dict[AdapterId, float]:
    """Seconds since each adapter on the pod's GPU slots was last used or landed; 0 for
    one a request runs on or waits for, and for one still loading."""
    idle: dict[AdapterId, float] = {}
    for name, landed_s in pod.gpu_adapters.items():
        busy = name in pod.running_adapters or name in pod.waiting_adapters
        last_s = max(pod.last_used.get(name, landed_s), landed_s)
        idle[AdapterId(name)] = 0.0 if busy else max(0.0, now_s - last_s)
    for name in pod.loading:
        idle[AdapterId(name)] = 0.0
    return idle
