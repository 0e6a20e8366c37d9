"""Pipeline and login events in a replay, and the simulated controller that meets them.

``sim_events`` turns an event log (``ts``, ``kind`` pipeline|login, ``trigger``,
``tenant``, ``event_id``) into ``SimEvent`` values on the replay's seconds clock, with
one ``Problem`` per event out of time order (an error) or outside the request log's
span (a warning: never delivered). ``read_event_frame`` reads the file; it stands in
for ``placement.inputs.events`` until that reader is committed.

``EventController`` is what lorafleet's controller does on a webhook event
(``placement.controller.ticks.Controller.on_event``): the same ``event_preloads`` with
the same predictor, its views built from the simulated pods' engine models as the
controller builds them from its ledger's. The engine applies the Load/Warmup actions
it returns. Pure apart from ``read_event_frame``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from placement.domain import Action, AdapterId, Catalog, Fleet, Pipelines, PodId, TenantId
from placement.errors import InputError, Problem
from placement.forecast.event_preloads import (
    Event,
    EventKind,
    PodView,
    Predictor,
    event_preloads,
    pipeline_predictor,
)
from placement.plan import Plan
from placement.sim.pods import SimPod
from placement.sim.workload import SimWorkload

REQUIRED = ("ts", "kind", "event_id")


@dataclass(frozen=True, kw_only=True)
class SimEvent:
    at_s: float
    event: Event


def read_event_frame(path: Path) -> pd.DataFrame:
    """The raw rows of an event log (.parquet, .csv, .jsonl)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix == ".csv":
            return pd.read_csv(path, dtype=str)
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True, dtype=False)
    except FileNotFoundError:
        raise InputError([Problem(source=str(path), message="no such file")]) from None
    except Exception as exc:  # each reader raises its own types
        raise InputError([Problem(source=str(path), message=f"cannot read: {exc}")]) from None
    raise InputError(
        [Problem(source=str(path), message="unknown format: use .parquet, .csv or .jsonl")]
    )


def _text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return None
    text = str(value)
    return text or None


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
    frame: pd.DataFrame,
    workload: SimWorkload,
    *,
    source: str,
    catalog: Catalog,
    pipelines: Pipelines,
) -> tuple[list[SimEvent], list[Problem]]:
    """The events a replay delivers, in time order, and one problem per event that is
    out of order (error) or outside the request log's span (warning)."""
    missing = [column for column in REQUIRED if column not in frame.columns]
    if missing:
        columns = ", ".join(map(str, frame.columns))
        raise InputError(
            [
                Problem(source=source, field=c, message=f"missing column {c!r} ({columns})")
                for c in missing
            ]
        )
    stamps = pd.to_datetime(frame["ts"], utc=True, errors="coerce", format="ISO8601")
    origin = pd.Timestamp(workload.start)
    end_s = workload.duration_s
    events: list[SimEvent] = []
    problems: list[Problem] = []
    latest: pd.Timestamp | None = None
    rows = zip(stamps, frame["kind"], frame["event_id"], strict=True)
    for row, (stamp, kind, event_id) in enumerate(rows, start=2):
        entry = f"row {row} ({_text(event_id)})"
        if pd.isna(stamp) or _text(kind) not in ("pipeline", "login") or not _text(event_id):
            problems.append(
                Problem(source=source, entry=entry, message="needs a time, a kind and an id")
            )
            continue
        if latest is not None and stamp < latest:
            problems.append(
                Problem(
                    source=source,
                    entry=entry,
                    field="ts",
                    message=f"{stamp.isoformat()} is earlier than the event before it"
                    f" ({latest.isoformat()}): events must be in time order",
                )
            )
            continue
        latest = stamp
        at_s = (stamp - origin).total_seconds()
        if at_s < 0.0 or at_s > end_s:
            problems.append(
                Problem(
                    source=source,
                    entry=entry,
                    field="ts",
                    message=f"{stamp.isoformat()} is outside the request log"
                    f" ({origin.isoformat()} to"
                    f" {(origin + pd.Timedelta(seconds=end_s)).isoformat()}): not delivered",
                    severity="warning",
                )
            )
            continue
        events.append(SimEvent(at_s=at_s, event=_event(frame, row - 2, catalog, pipelines)))
    return events, problems


def _event(frame: pd.DataFrame, i: int, catalog: Catalog, pipelines: Pipelines) -> Event:
    record = frame.iloc[i]
    kind = EventKind(str(record["kind"]))
    trigger = _text(record.get("trigger"))
    tenant = _text(record.get("tenant"))
    if tenant is None:
        tenant = _tenant_of(trigger, pipelines, catalog) if kind is EventKind.PIPELINE else ""
    return Event(kind=kind, id=str(record["event_id"]), tenant=TenantId(tenant), trigger=trigger)


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
    ) -> tuple[Action, ...]:
        decision = event_preloads(
            event,
            self.predictor(event),
            catalog=self.catalog,
            fleet=self.fleet,
            plan=plan,
            views=self.views(pods),
            busy_rps={AdapterId(name): rps for name, rps in busy_rps.items()},
            max_loads=self.max_loads,
        )
        return decision.actions

    def views(self, pods: Sequence[SimPod]) -> dict[PodId, PodView]:
        """Each pod as its engine model has it, as the controller's ``_views`` reads its
        ledger: the names it lists, its GPU slots least recently used first (a slot an
        unloaded name's entry holds as ``?unloaded-N``) and its pins."""
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
            )
        return views
