"""From a pipeline or login event to the preloads it is worth: pure decision code.

An event (``document.uploaded`` for tenant acme, or acme logging in) predicts
adapters likely to be requested soon (``placement.forecast.event_predictors``, whose
names this module re-exports). ``event_preloads`` turns those predictions
into at most ``max_loads`` Load/Warmup actions on the pods the plan would send the
traffic to, at a bounded cost: it never displaces a pinned adapter, nor one busier
than the adapter it brings (both counting the traffic this event foresees for them,
and the displaced one its recent use: an adapter last asked for ``idle_s`` ago is
taken as busy at one request per that time, ``MIN_WINDOW_S`` at least). Under the
engine's LRU a preload behind adapters in use is the next victim, evicted before its
request comes: the replays of legal-research counted such preloads unused.
Adapters come only from the catalog, through pipelines.yaml or an event model, never
from the event itself, and only the event's tenant's (or no tenant's) but for a step
pipelines.yaml declares: the operator's statement that it follows the trigger whoever
owns it. Such a step of another tenant is preloaded only at ``MIN_STEP_PROBABILITY`` or
more, and only onto a free GPU slot or over an adapter idle ``STEP_VICTIM_MIN_IDLE_S``
or more (``idle_for``; never one in use, nor one whose idle time the view does not
know). A login's preloads go first to its tenant's zone, when it has one: the one zone
of the pods its adapters are pinned to (``tenant_zone``); a step that follows another
goes first to the pod that step runs on (where it is hot, or where this event loads it).

No IO, no clock, no logging: the webhook parses the event, the controller runs the
actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from placement.domain import (
    Action,
    Adapter,
    AdapterId,
    Catalog,
    Fleet,
    Load,
    Pod,
    PodId,
    TenantId,
    Warmup,
)
from placement.forecast.event_predictors import (
    LOGIN_WITHIN_S,
    MIN_WINDOW_S,
    Event,
    EventKind,
    EventModel,
    LearnedPreload,
    Prediction,
    Predictor,
    learned_predictor,
    pipeline_predictor,
)
from placement.plan import Plan

__all__ = [
    "LOGIN_WITHIN_S",
    "MIN_STEP_PROBABILITY",
    "MIN_WINDOW_S",
    "STEP_VICTIM_MIN_IDLE_S",
    "Event",
    "EventDecision",
    "EventKind",
    "EventModel",
    "LearnedPreload",
    "PodView",
    "Prediction",
    "Predictor",
    "displaced_rps",
    "event_preloads",
    "idle_for",
    "learned_predictor",
    "pipeline_predictor",
    "tenant_zone",
    "victim",
]

#: The least probability at which a declared step of another tenant is preloaded: below
#: it, the step more often goes unused than used.
MIN_STEP_PROBABILITY = 0.5
#: How long an adapter must have been idle for another tenant's step to displace it. In
#: a fleet that thrashes (the war story's Thursday: residency p50 6 s) none is, and the
#: looser rules measured there (only a victim worth less than the step) cost up to
#: 0.06 points of GPU hits: a preload there only moves the next eviction to another.
STEP_VICTIM_MIN_IDLE_S = 300.0


@dataclass(frozen=True, kw_only=True)
class PodView:
    """What a pod holds now, as far as lorafleet knows (its ledger and registrations)."""

    pod: Pod
    registered: frozenset[AdapterId] = frozenset()
    #: Adapters on GPU slots, least recently used first (the one a new one displaces).
    hot: tuple[AdapterId, ...] = ()
    pinned: frozenset[AdapterId] = frozenset()
    #: Seconds since each adapter on a GPU slot was last asked for (or landed), where
    #: the caller knows it; an adapter absent is judged by ``busy_rps`` alone.
    idle_s: Mapping[AdapterId, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EventDecision:
    actions: tuple[Action, ...]
    #: Per predicted adapter left out, why (already hot, no pod would take it, over K).
    skipped: Mapping[AdapterId, str] = field(default_factory=dict)


def _ranked(
    predictions: tuple[Prediction, ...], *, catalog: Catalog, tenant: TenantId
) -> tuple[tuple[Prediction, ...], dict[AdapterId, str]]:
    """Catalog adapters of this tenant (or of none, or declared steps likely enough),
    most likely and soonest first."""
    adapters = catalog.by_name()
    best: dict[AdapterId, Prediction] = {}
    skipped: dict[AdapterId, str] = {}
    for p in predictions:
        adapter = adapters.get(p.adapter)
        if adapter is None:
            skipped[p.adapter] = "not in the catalog"
        elif adapter.tenant is not None and adapter.tenant != tenant and not p.declared_step:
            skipped[p.adapter] = f"belongs to tenant {adapter.tenant}"
        elif (
            adapter.tenant is not None
            and adapter.tenant != tenant
            and (p.probability < MIN_STEP_PROBABILITY)
        ):
            skipped[p.adapter] = (
                f"a step of tenant {adapter.tenant} at p={p.probability:.2f}, "
                f"under {MIN_STEP_PROBABILITY:.2f}"
            )
        elif p.probability > 0 and (
            p.adapter not in best or p.expected_rps > best[p.adapter].expected_rps
        ):
            best[p.adapter] = p
    ranked = sorted(best.values(), key=lambda p: (-p.probability, p.within_s, p.adapter))
    return tuple(ranked), skipped


def _preference(
    view: PodView,
    adapter: AdapterId,
    *,
    plan: Plan | None,
    chosen: set[PodId],
    group_pods: set[PodId],
) -> tuple[float, ...]:
    """Lower sorts first: where the plan routes it, this event's pods, its group, room."""
    name = view.pod.name
    pod_plan = plan.pods.get(name) if plan is not None else None
    hot_weight = plan.hot_pods(adapter).get(name, 0.0) if plan is not None else 0.0
    warm = pod_plan is not None and adapter in pod_plan.warm
    return (
        -hot_weight,
        0.0 if warm else 1.0,
        0.0 if name in chosen else 1.0,
        0.0 if name in group_pods else 1.0,
        -float(view.pod.max_loras - len(view.hot)),
    )


def victim(view: PodView) -> AdapterId | None:
    """The adapter a new one would push off a full GPU: the least recently used unpinned."""
    return next((a for a in view.hot if a not in view.pinned), None)


def _has_free_slot(view: PodView) -> bool:
    return len(view.hot) < view.pod.max_loras


def idle_for(view: PodView, adapter: AdapterId, seconds: float) -> bool:
    """Whether ``adapter`` is known to have been idle there ``seconds`` or more (not in
    use: a request running on or waiting for it is idle 0 s)."""
    idle_s = view.idle_s.get(adapter)
    return idle_s is not None and idle_s >= seconds


def displaced_rps(view: PodView, adapter: AdapterId, expected_rps: float) -> float:
    """What displacing ``adapter`` from ``view`` gives up: its expected traffic, or its
    recent use (one request per ``idle_s``, ``MIN_WINDOW_S`` at least), the higher."""
    idle_s = view.idle_s.get(adapter)
    if idle_s is None:
        return expected_rps
    return max(expected_rps, 1.0 / max(idle_s, MIN_WINDOW_S))


def _expected_rps(
    ranked: tuple[Prediction, ...], busy_rps: Mapping[AdapterId, float]
) -> dict[AdapterId, float]:
    """Each adapter's traffic as this event foresees it: what it serves now plus what the
    event adds. Both sides of a displacement are weighed with it; weighing only the incoming
    side let a less likely step push off this event's own likeliest one."""
    expected = dict(busy_rps)
    for p in ranked:
        expected[p.adapter] = expected.get(p.adapter, 0.0) + p.expected_rps
    return expected


def _place(
    prediction: Prediction,
    views: list[PodView],
    *,
    expected_rps: Mapping[AdapterId, float],
    foreign: bool = False,
) -> tuple[PodView | None, str]:
    """The first pod (in preference order) that already holds it or may take it; a
    ``foreign`` one (another tenant's step) displaces only an adapter idle
    ``STEP_VICTIM_MIN_IDLE_S`` or more."""
    incoming_rps = expected_rps.get(prediction.adapter, 0.0)
    why = "no ready pod serves its base model"
    holder = next((v for v in views if prediction.adapter in v.hot), None)
    if holder is not None:
        return None, f"already hot on {holder.pod.name}"
    for view in views:
        if _has_free_slot(view):
            return view, ""
        displaced = victim(view)
        if displaced is None:
            why = "every candidate pod's GPU slots hold pinned adapters"
        elif foreign and not idle_for(view, displaced, STEP_VICTIM_MIN_IDLE_S):
            why = (
                f"it would displace {displaced}, "
                f"not known idle {STEP_VICTIM_MIN_IDLE_S:.0f} s or more"
            )
        elif displaced_rps(view, displaced, expected_rps.get(displaced, 0.0)) >= incoming_rps:
            why = f"it would displace {displaced}, which is at least as busy"
        else:
            return view, ""
    return None, why


def _group_pods(
    adapter: Adapter, views: Mapping[PodId, PodView], adapters: Mapping[AdapterId, Adapter]
) -> set[PodId]:
    """Pods already holding an adapter of the same pipeline group (co-location)."""
    if adapter.group is None:
        return set()
    return {
        name
        for name, view in views.items()
        if any(a in adapters and adapters[a].group == adapter.group for a in view.hot)
    }


def tenant_zone(tenant: TenantId, catalog: Catalog, fleet: Fleet) -> str | None:
    """The zone of the pods the tenant's adapters are pinned to, when that is one zone."""
    zone_of = {pod.name: pod.zone for pod in fleet.pods}
    zones = {
        zone_of.get(pod) for a in catalog.adapters if a.tenant == tenant for pod in a.pinned_pods
    }
    return next(iter(zones)) if len(zones) == 1 else None


def event_preloads(
    event: Event,
    predictions: tuple[Prediction, ...],
    *,
    catalog: Catalog,
    fleet: Fleet,
    plan: Plan | None,
    views: Mapping[PodId, PodView],
    busy_rps: Mapping[AdapterId, float],
    max_loads: int,
) -> EventDecision:
    """At most ``max_loads`` adapters brought onto a pod's GPU for this event."""
    ranked, skipped = _ranked(predictions, catalog=catalog, tenant=event.tenant)
    adapters = catalog.by_name()
    expected_rps = _expected_rps(ranked, busy_rps)
    current = dict(views)
    zone = tenant_zone(event.tenant, catalog, fleet) if event.kind is EventKind.LOGIN else None
    chosen: set[PodId] = set()
    #: The pod each predicted adapter runs on: where it is hot, or where this event loads it.
    runs_on: dict[AdapterId, PodId] = {}
    actions: list[Action] = []
    loads = 0
    for prediction in ranked:
        if loads >= max_loads:
            skipped[prediction.adapter] = f"over the limit of {max_loads} loads per event"
            continue
        adapter = adapters[prediction.adapter]
        pool = fleet.pool_for_base(adapter.base_model)
        pool_pods = {p.name for p in pool.pods} if pool is not None else set()
        group_pods = _group_pods(adapter, current, adapters)
        anchor = _anchor(prediction.after, runs_on, current)
        candidates = sorted(
            (v for name, v in current.items() if name in pool_pods),
            key=lambda v: (
                zone is not None and v.pod.zone != zone,
                anchor is not None and v.pod.name != anchor,
                _preference(v, adapter.name, plan=plan, chosen=chosen, group_pods=group_pods),
                v.pod.name,
            ),
        )
        foreign = adapter.tenant is not None and adapter.tenant != event.tenant
        view, why = _place(prediction, candidates, expected_rps=expected_rps, foreign=foreign)
        if view is None:
            holder = next((v.pod.name for v in candidates if adapter.name in v.hot), None)
            if holder is not None:
                runs_on[adapter.name] = holder
            skipped[prediction.adapter] = why
            continue
        reason = (
            f"event {event.describe()}: p={prediction.probability:.2f} "
            f"within {prediction.within_s:.0f}s"
        )
        if adapter.name not in view.registered:
            actions.append(Load(pod=view.pod.name, adapter=adapter.name, reason=reason))
        actions.append(Warmup(pod=view.pod.name, adapter=adapter.name, reason=reason))
        current[view.pod.name] = _after_warmup(view, adapter.name)
        chosen.add(view.pod.name)
        runs_on[adapter.name] = view.pod.name
        loads += 1
    return EventDecision(actions=tuple(actions), skipped=skipped)


def _anchor(
    after: AdapterId | None, runs_on: Mapping[AdapterId, PodId], views: Mapping[PodId, PodView]
) -> PodId | None:
    """The pod the step ``after`` runs on: where this event placed or found it, else the
    first pod (by name) holding it hot; None when it follows nothing or runs nowhere yet."""
    if after is None:
        return None
    if after in runs_on:
        return runs_on[after]
    return next((name for name, v in sorted(views.items()) if after in v.hot), None)


def _after_warmup(view: PodView, adapter: AdapterId) -> PodView:
    displaced = None if _has_free_slot(view) else victim(view)
    hot = tuple(a for a in (*view.hot, adapter) if a != displaced)
    idle_s = {a: s for a, s in view.idle_s.items() if a != displaced}
    if view.idle_s:
        idle_s[adapter] = 0.0  # loading for this event: as busy as an adapter gets
    return PodView(
        pod=view.pod,
        registered=view.registered | {adapter},
        hot=hot,
        pinned=view.pinned,
        idle_s=idle_s,
    )
