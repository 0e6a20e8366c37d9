"""What a pipeline or login event makes likely: the events and their predictors.

An event (``document.uploaded`` for tenant acme, or acme logging in) predicts adapters
likely to be requested soon, each with a probability and a delay (``Prediction``).
``pipeline_predictor`` reads them from pipelines.yaml: a trigger's declared steps (each
marked ``declared_step``, with the step it follows), or a login's adapters;
``learned_predictor`` adds what a learned event model knows (a login's usual adapters,
the likely followers of each step); ``learned_steps`` learns the declared steps'
probabilities from an event log (which events caused which requests), whatever tenant
owns them. ``placement.forecast.event_preloads`` decides which
of them are worth a preload.

No IO, no clock, no logging.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from placement.domain import AdapterId, Catalog, Pipelines, PipelineStep, TenantId

#: A prediction due "now" still spreads its one expected request over this window.
MIN_WINDOW_S = 60.0
#: How soon a login's adapters are expected, when pipelines.yaml says nothing finer.
LOGIN_WITHIN_S = 300.0


class EventKind(enum.StrEnum):
    PIPELINE = "pipeline"
    LOGIN = "login"


@dataclass(frozen=True, kw_only=True)
class Event:
    """A webhook event, already parsed and authenticated."""

    kind: EventKind
    id: str
    tenant: TenantId
    trigger: str | None = None

    def describe(self) -> str:
        what = self.trigger if self.kind is EventKind.PIPELINE else "login"
        return f"{what} for {self.tenant} ({self.id})"


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """An adapter the event makes likely: with this probability, within this delay."""

    adapter: AdapterId
    probability: float
    within_s: float
    #: The step this one follows: its preload goes first to the pod that step runs on.
    after: AdapterId | None = None
    #: A step pipelines.yaml declares: preloaded whatever tenant owns it.
    declared_step: bool = False

    @property
    def expected_rps(self) -> float:
        return self.probability / max(self.within_s, MIN_WINDOW_S)


#: What an event makes likely; pipelines.yaml gives one, a learned event model another.
Predictor = Callable[[Event], tuple[Prediction, ...]]


def pipeline_predictor(pipelines: Pipelines, catalog: Catalog) -> Predictor:
    """Predictions from pipelines.yaml: a trigger's steps, or a tenant's login adapters."""
    by_trigger = pipelines.by_trigger()
    by_tenant: dict[TenantId, list[AdapterId]] = {}
    for adapter in catalog.adapters:
        if adapter.tenant is not None:
            by_tenant.setdefault(adapter.tenant, []).append(adapter.name)

    def predict(event: Event) -> tuple[Prediction, ...]:
        if event.kind is EventKind.PIPELINE:
            pipeline = by_trigger.get(event.trigger or "")
            steps = pipeline.steps if pipeline is not None else ()
            return tuple(
                Prediction(
                    adapter=s.adapter,
                    probability=s.probability,
                    within_s=s.within_s,
                    after=s.after,
                    declared_step=True,
                )
                for s in steps
            )
        names = pipelines.logins.get(event.tenant) or tuple(by_tenant.get(event.tenant, ()))
        return tuple(
            Prediction(adapter=name, probability=1.0, within_s=LOGIN_WITHIN_S) for name in names
        )

    return predict


class LearnedPreload(Protocol):
    """One preload a learned event model proposes (``models.events.EventPreload``)."""

    @property
    def adapter(self) -> str: ...

    @property
    def due_s(self) -> float: ...

    @property
    def probability(self) -> float: ...


class EventModel(Protocol):
    """Transitions and login affinities learned from the log (``placement.forecast.forecaster``)."""

    def after_request(
        self, *, tenant: str | None, adapter: str, at_s: float, min_probability: float = 0.3
    ) -> Sequence[LearnedPreload]: ...

    def after_login(
        self, *, tenant: str, at_s: float, min_probability: float = 0.3
    ) -> Sequence[LearnedPreload]: ...


def _merged(predictions: list[Prediction]) -> tuple[Prediction, ...]:
    """The likeliest prediction per adapter, a declared step if any of them is one."""
    best: dict[AdapterId, Prediction] = {}
    declared = {p.adapter for p in predictions if p.declared_step}
    for p in predictions:
        if p.adapter not in best or p.probability > best[p.adapter].probability:
            best[p.adapter] = p
    return tuple(replace(p, declared_step=p.adapter in declared) for p in best.values())


def learned_predictor(model: EventModel, *, declared: Predictor) -> Predictor:
    """pipelines.yaml's predictions, plus what the learned model adds: a login's usual
    adapters, and the likely followers of each adapter a trigger leads to (their chance
    multiplied, their delays added)."""

    def predict(event: Event) -> tuple[Prediction, ...]:
        found = list(declared(event))
        if event.kind is EventKind.LOGIN:
            found += [
                Prediction(
                    adapter=AdapterId(p.adapter),
                    probability=p.probability,
                    within_s=max(0.0, p.due_s),
                )
                for p in model.after_login(tenant=event.tenant, at_s=0.0)
            ]
            return _merged(found)
        for step in tuple(found):
            found += [
                Prediction(
                    adapter=AdapterId(p.adapter),
                    probability=step.probability * p.probability,
                    within_s=step.within_s + max(0.0, p.due_s),
                    after=step.adapter,
                )
                for p in model.after_request(tenant=event.tenant, adapter=step.adapter, at_s=0.0)
            ]
        return _merged(found)

    return predict


def learned_steps(
    pipelines: Pipelines,
    *,
    triggers: Mapping[str, str],
    caused: Iterable[tuple[str, str]],
    prior_weight: float = 10.0,
) -> Pipelines:
    """pipelines.yaml with each declared step's probability learned from an event log:
    the share of its trigger's events (``triggers``: event id to trigger) that caused a
    request for the step's adapter (``caused``: event id and adapter, a pair per request),
    the declared probability counting as ``prior_weight`` events. A trigger no event
    names keeps its declared steps."""
    events_of: dict[str, int] = {}
    for trigger in triggers.values():
        events_of[trigger] = events_of.get(trigger, 0) + 1
    hits: dict[tuple[str, str], int] = {}
    for event_id, adapter in {(e, a) for e, a in caused if e in triggers}:
        key = (triggers[event_id], adapter)
        hits[key] = hits.get(key, 0) + 1

    def learned(trigger: str, step: PipelineStep) -> PipelineStep:
        seen = events_of.get(trigger, 0)
        if not seen:
            return step
        reached = hits.get((trigger, str(step.adapter)), 0)
        probability = (step.probability * prior_weight + reached) / (prior_weight + seen)
        return replace(step, probability=round(probability, 6))

    return replace(
        pipelines,
        pipelines=tuple(
            replace(pipeline, steps=tuple(learned(pipeline.trigger, s) for s in pipeline.steps))
            for pipeline in pipelines.pipelines
        ),
    )
