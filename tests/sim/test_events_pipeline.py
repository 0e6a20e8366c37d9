"""In a replay, a pipeline trigger preloads another tenant's likely next step.

Two pods of two slots; the docs tenant's classifier is in use on one of them, three
adapters idle since the first ten minutes fill the other slots. ``doc.uploaded`` at
3,000 s leads to the classifier at once and to the law tenant's extractor (p=0.6) a
minute later. lorafleet's webhook path preloads the extractor on the classifier's pod
over the idle slot, and its request finds it on the GPU there; a step declared below
``MIN_STEP_PROBABILITY`` is not preloaded, and its request loads.
"""

from __future__ import annotations

from datetime import UTC, datetime

from placement.domain import AdapterId, Pipeline, Pipelines, PipelineStep, TenantId
from placement.forecast.event_preloads import MIN_STEP_PROBABILITY, Event, EventKind
from placement.settings import Settings
from placement.sim.engine import GPU_HIT
from placement.sim.events import EventController, SimEvent, learned_pipelines
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests import factories
from tests.factories import event_workload

START = datetime(2026, 3, 10, 9, tzinfo=UTC)
EVENT_S = 3000.0
TENANTS = {"classify": TenantId("docs"), "legal": TenantId("law")}
UPLOAD = Event(kind=EventKind.PIPELINE, id="e1", tenant=TENANTS["classify"], trigger="doc.uploaded")


def load() -> SimWorkload:
    rows: list[tuple[float, str, str | None]] = [
        (float(t), name, None) for t in range(0, 600, 30) for name in ("a", "b", "c")
    ]
    rows += [(float(t), "classify", None) for t in range(2880, 3200, 20)]
    rows += [(EVENT_S + 1.0, "classify", "e1"), (EVENT_S + 60.0, "legal", "e1")]
    return event_workload(rows, start=START)


def pipelines(probability: float) -> Pipelines:
    steps = (
        PipelineStep(adapter=AdapterId("classify"), probability=1.0, within_s=2),
        PipelineStep(
            adapter=AdapterId("legal"),
            after=AdapterId("classify"),
            probability=probability,
            within_s=120,
        ),
    )
    return Pipelines(pipelines=(Pipeline(trigger="doc.uploaded", steps=steps),))


def replay(probability: float) -> tuple[SimWorkload, ReplayResult]:
    settings = Settings()
    workload = load()
    fleet = factories.replay_fleet(2, max_loras=2)
    catalog = factories.replay_catalog(workload.size_bytes, tenant_of=TENANTS.get)
    result = run_policy(
        "lorafleet",
        workload,
        fleet,
        settings=settings,
        planning=replay_planning(catalog, fleet, settings=settings, planner="greedy"),
        events=[SimEvent(at_s=EVENT_S, event=UPLOAD)],
        controller=EventController.build(catalog, fleet, pipelines(probability), max_loads=2),
    )
    return workload, result


def step_request(workload: SimWorkload) -> int:
    return workload.adapters.index("legal")


def first_step_request(workload: SimWorkload) -> int:
    return next(
        r
        for r, (name, event_id) in enumerate(
            zip(workload.adapters, workload.event_ids, strict=True)
        )
        if name == "classify" and event_id == "e1"
    )


def test_the_next_step_of_another_tenant_is_preloaded_where_the_first_step_ran() -> None:
    workload, result = replay(0.6)
    assert result.event_figures is not None
    assert result.event_figures["preloads"] == 1
    assert result.event_figures["preloads_unused_share"] == 0.0
    step, first = step_request(workload), first_step_request(workload)
    assert result.log.outcome[step] == GPU_HIT
    assert result.log.pod[step] == result.log.pod[first]


def test_a_step_declared_below_the_threshold_is_not_preloaded() -> None:
    assert MIN_STEP_PROBABILITY > 0.3
    workload, result = replay(0.3)
    assert result.event_figures is not None
    assert result.event_figures["preloads"] == 0
    assert result.log.outcome[step_request(workload)] != GPU_HIT


def test_the_steps_probabilities_are_learned_from_the_events_and_their_requests() -> None:
    login = Event(kind=EventKind.LOGIN, id="e2", tenant=TENANTS["classify"])
    events = [SimEvent(at_s=EVENT_S, event=UPLOAD), SimEvent(at_s=EVENT_S, event=login)]
    learned = learned_pipelines(pipelines(0.6), events, load())
    (pipeline,) = learned.pipelines
    # The one upload reached both steps: each moves by one event in eleven.
    assert [s.probability for s in pipeline.steps] == [1.0, round((0.6 * 10 + 1) / 11, 6)]
