"""A pipeline trigger preloads its likely next steps, whatever tenant owns them.

pipelines.yaml is the operator's statement that step B follows step A: a declared step
of another tenant than the event's is preloaded (a login still never loads another
tenant's adapter, nor does a prediction no pipeline declares), at
``MIN_STEP_PROBABILITY`` or more, first on the pod the step it follows runs on, only
onto a free slot or over an adapter idle ``STEP_VICTIM_MIN_IDLE_S`` or more (never one in
use), and never more than ``max_loads`` per event.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from placement.domain import (
    ActionKind,
    AdapterId,
    Catalog,
    Fleet,
    Pipeline,
    Pipelines,
    PipelineStep,
    PodId,
    TenantId,
)
from placement.forecast.event_preloads import (
    MIN_STEP_PROBABILITY,
    STEP_VICTIM_MIN_IDLE_S,
    Event,
    EventDecision,
    EventKind,
    PodView,
    Prediction,
    event_preloads,
    pipeline_predictor,
    victim,
)
from tests.factories import adapter, catalog, fleet, pool

DOCS = TenantId("docs")
UPLOADED = Event(kind=EventKind.PIPELINE, id="e1", tenant=DOCS, trigger="doc.uploaded")


def doc_catalog() -> Catalog:
    """The classifier is the docs tenant's; the two extractors belong to others."""
    return catalog(
        adapter("classify", tenant="docs"),
        adapter("legal", tenant="law"),
        adapter("medical", tenant="clinic"),
        adapter("idle-a"),
        adapter("idle-b"),
        adapter("busy"),
    )


def doc_pipelines(legal_p: float = 0.6, medical_p: float = 0.4) -> Pipelines:
    return Pipelines(
        pipelines=(
            Pipeline(
                trigger="doc.uploaded",
                steps=(
                    PipelineStep(adapter=AdapterId("classify"), probability=1.0, within_s=2),
                    PipelineStep(
                        adapter=AdapterId("legal"),
                        after=AdapterId("classify"),
                        probability=legal_p,
                        within_s=120,
                    ),
                    PipelineStep(
                        adapter=AdapterId("medical"),
                        after=AdapterId("classify"),
                        probability=medical_p,
                        within_s=120,
                    ),
                ),
            ),
        ),
        logins={DOCS: (AdapterId("classify"),)},
    )


def three_pods() -> Fleet:
    return fleet(pool("p", 3, max_loras=2, max_cpu_loras=4))


def views_of(
    fl: Fleet, hot: Mapping[int, tuple[str, ...]], idle_s: float = 900.0
) -> dict[PodId, PodView]:
    """Each pod's GPU slots (least recently used first), every adapter idle ``idle_s``."""
    out: dict[PodId, PodView] = {}
    for i, pod in enumerate(fl.pods):
        names = tuple(AdapterId(a) for a in hot.get(i, ()))
        out[pod.name] = PodView(
            pod=pod,
            registered=frozenset(names),
            hot=names,
            idle_s=dict.fromkeys(names, idle_s),
        )
    return out


def decide(
    event: Event, views: dict[PodId, PodView], pipelines: Pipelines, *, max_loads: int = 2
) -> EventDecision:
    cat = doc_catalog()
    return event_preloads(
        event,
        pipeline_predictor(pipelines, cat)(event),
        catalog=cat,
        fleet=three_pods(),
        plan=None,
        views=views,
        busy_rps={},
        max_loads=max_loads,
    )


def warmed(decision: EventDecision) -> dict[str, str]:
    return {str(a.adapter): str(a.pod) for a in decision.actions if a.kind is ActionKind.WARMUP}


def test_another_tenants_likely_step_goes_to_the_pod_the_first_step_runs_on() -> None:
    fl = three_pods()
    # classify is hot on p-2; every pod has an idle slot's victim to give up.
    views = views_of(fl, {0: ("idle-a", "idle-b"), 1: ("idle-b", "idle-a"), 2: ("idle-a",)})
    views[fl.pods[2].name] = PodView(
        pod=fl.pods[2],
        registered=frozenset({AdapterId("idle-a"), AdapterId("classify")}),
        hot=(AdapterId("idle-a"), AdapterId("classify")),
        idle_s={AdapterId("idle-a"): 900.0, AdapterId("classify"): 30.0},
    )
    decision = decide(UPLOADED, views, doc_pipelines())
    assert warmed(decision) == {"legal": "p-2"}
    assert decision.skipped[AdapterId("classify")] == "already hot on p-2"
    assert decision.skipped[AdapterId("medical")] == (
        f"a step of tenant clinic at p=0.40, under {MIN_STEP_PROBABILITY:.2f}"
    )


def test_a_first_step_this_event_loads_draws_its_next_step_to_the_same_pod() -> None:
    fl = three_pods()
    views = views_of(fl, {0: ("idle-a", "idle-b"), 1: (), 2: ("idle-b",)})
    decision = decide(UPLOADED, views, doc_pipelines(legal_p=0.7, medical_p=0.6), max_loads=3)
    placed = warmed(decision)
    # classify goes where there is most room, legal after it; medical finds that pod
    # full of this event's own steps and takes the next one with a free slot.
    assert placed == {"classify": "p-1", "legal": "p-1", "medical": "p-2"}


def test_a_login_never_loads_another_tenants_adapter() -> None:
    fl = three_pods()
    login = Event(kind=EventKind.LOGIN, id="e2", tenant=DOCS)
    cat = doc_catalog()
    decision = event_preloads(
        login,
        (Prediction(adapter=AdapterId("legal"), probability=1.0, within_s=60.0),),
        catalog=cat,
        fleet=fl,
        plan=None,
        views=views_of(fl, {}),
        busy_rps={},
        max_loads=2,
    )
    assert decision.actions == ()
    assert decision.skipped == {"legal": "belongs to tenant law"}


def test_an_undeclared_prediction_of_another_tenant_is_not_loaded() -> None:
    fl = three_pods()
    learned = Prediction(
        adapter=AdapterId("legal"), probability=0.9, within_s=60.0, after=AdapterId("classify")
    )
    decision = event_preloads(
        UPLOADED,
        (learned,),
        catalog=doc_catalog(),
        fleet=fl,
        plan=None,
        views=views_of(fl, {}),
        busy_rps={},
        max_loads=2,
    )
    assert decision.skipped == {"legal": "belongs to tenant law"}


def test_another_tenants_step_displaces_only_an_adapter_idle_long_enough() -> None:
    fl = three_pods()
    full = {i: ("busy", "idle-a") for i in range(3)}
    for idle_s in (0.0, STEP_VICTIM_MIN_IDLE_S - 1.0):  # in use, or used a moment ago
        decision = decide(UPLOADED, views_of(fl, full, idle_s=idle_s), doc_pipelines(1.0))
        assert "legal" not in warmed(decision)
        assert decision.skipped[AdapterId("legal")] == (
            f"it would displace busy, not known idle {STEP_VICTIM_MIN_IDLE_S:.0f} s or more"
        )
    idle = views_of(fl, full, idle_s=STEP_VICTIM_MIN_IDLE_S)
    assert warmed(decide(UPLOADED, idle, doc_pipelines(1.0)))["legal"] == "p-0"


slots = st.lists(st.sampled_from(["idle-a", "idle-b", "busy", "classify"]), max_size=2, unique=True)


@given(
    hot=st.lists(slots, min_size=3, max_size=3),
    idle=st.lists(
        st.one_of(st.none(), st.sampled_from([0.0, 5.0, 120.0, STEP_VICTIM_MIN_IDLE_S, 3600.0])),
        min_size=3,
    ),
    legal_p=st.floats(min_value=0.0, max_value=1.0),
    medical_p=st.floats(min_value=0.0, max_value=1.0),
    max_loads=st.integers(min_value=0, max_value=3),
)
def test_never_more_than_the_bound_and_never_over_an_adapter_in_use_or_lately_used(
    hot: list[list[str]],
    idle: list[float | None],
    legal_p: float,
    medical_p: float,
    max_loads: int,
) -> None:
    fl = three_pods()
    views: dict[PodId, PodView] = {}
    for i, pod in enumerate(fl.pods):
        names = tuple(AdapterId(a) for a in hot[i])
        known = {a: s for a, s in zip(names, idle, strict=False) if s is not None}
        views[pod.name] = PodView(pod=pod, registered=frozenset(names), hot=names, idle_s=known)
    decision = decide(UPLOADED, views, doc_pipelines(legal_p, medical_p), max_loads=max_loads)
    warmups = [a for a in decision.actions if a.kind is ActionKind.WARMUP]
    assert len(warmups) <= max_loads
    tenants = {a.name: a.tenant for a in doc_catalog().adapters}
    probability = {"legal": legal_p, "medical": medical_p, "classify": 1.0}
    current = dict(views)
    for action in warmups:  # the engine's LRU, action by action
        view = current[action.pod]
        full = len(view.hot) >= view.pod.max_loras
        displaced = victim(view) if full else None
        if tenants[action.adapter] != DOCS:
            assert probability[str(action.adapter)] >= MIN_STEP_PROBABILITY
            idle_s = view.idle_s.get(displaced) if displaced is not None else None
            assert displaced is None or (idle_s is not None and idle_s >= STEP_VICTIM_MIN_IDLE_S)
        hot_now = tuple(a for a in (*view.hot, action.adapter) if a != displaced)
        idle_now = {a: s for a, s in view.idle_s.items() if a != displaced}
        if view.idle_s:  # as event_preloads marks its own preloads: in use
            idle_now[action.adapter] = 0.0
        current[action.pod] = PodView(
            pod=view.pod, registered=view.registered, hot=hot_now, idle_s=idle_now
        )
