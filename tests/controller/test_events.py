"""Events to preloads: bounded, never displacing pinned or busier adapters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from placement.domain import ActionKind, AdapterId, PodId, TenantId
from placement.forecast.event_preloads import (
    Event,
    EventKind,
    PodView,
    Prediction,
    event_preloads,
    pipeline_predictor,
)
from placement.plan import Plan
from tests.controller.controller_support import doc_catalog, doc_pipelines, make_fleet
from tests.factories import make_plan

CATALOG = doc_catalog()
FLEET = make_fleet(2, max_loras=2)
PODS = FLEET.pod_by_name()
UPLOAD = Event(
    kind=EventKind.PIPELINE, id="e1", tenant=TenantId("acme"), trigger="document.uploaded"
)
LOGIN = Event(kind=EventKind.LOGIN, id="e2", tenant=TenantId("acme"))


def views(**hot: tuple[str, ...]) -> dict[PodId, PodView]:
    out = {name: PodView(pod=pod) for name, pod in PODS.items()}
    for pod, names in hot.items():
        name = PodId(pod.replace("_", "-"))
        adapters = tuple(AdapterId(a) for a in names)
        pinned = frozenset(a for a in adapters if a == "pinned-one")
        out[name] = PodView(
            pod=PODS[name], registered=frozenset(adapters), hot=adapters, pinned=pinned
        )
    return out


def decide(
    event: Event,
    pod_views: Mapping[PodId, PodView],
    *,
    busy: Mapping[str, float] | None = None,
    max_loads: int = 2,
    plan: Plan | None = None,
) -> list[tuple[str, str, str]]:
    predict = pipeline_predictor(doc_pipelines(), CATALOG)
    decision = event_preloads(
        event,
        predict(event),
        catalog=CATALOG,
        fleet=FLEET,
        plan=plan,
        views=pod_views,
        busy_rps={AdapterId(k): v for k, v in (busy or {}).items()},
        max_loads=max_loads,
    )
    return [(a.kind.value, a.pod, a.adapter) for a in decision.actions]


def test_upload_preloads_the_likeliest_steps_together_within_k() -> None:
    assert decide(UPLOAD, views()) == [
        ("load", "pod-0", "doc-classifier"),
        ("warmup", "pod-0", "doc-classifier"),
        ("load", "pod-0", "legal-extract"),
        ("warmup", "pod-0", "legal-extract"),
    ]


def test_login_preloads_the_tenants_adapter_only() -> None:
    assert decide(LOGIN, views()) == [
        ("load", "pod-0", "acme-chat"),
        ("warmup", "pod-0", "acme-chat"),
    ]


def test_already_hot_adapter_needs_nothing_and_registered_one_needs_only_a_warmup() -> None:
    pod_views = views(pod_1=("acme-chat",))
    assert decide(LOGIN, pod_views) == []
    registered_only = dict(pod_views)
    registered_only[PodId("pod-1")] = PodView(
        pod=PODS[PodId("pod-1")], registered=frozenset({AdapterId("acme-chat")})
    )
    assert decide(LOGIN, registered_only, plan=make_plan(hot={"pod-1": ("acme-chat",)})) == [
        ("warmup", "pod-1", "acme-chat")
    ]


def test_the_plans_hot_pod_is_preferred() -> None:
    plan = make_plan(hot={"pod-1": ("doc-classifier",), "pod-0": ()})
    assert decide(UPLOAD, views(), plan=plan, max_loads=1) == [
        ("load", "pod-1", "doc-classifier"),
        ("warmup", "pod-1", "doc-classifier"),
    ]


def test_never_displaces_a_pinned_adapter() -> None:
    full = views(pod_0=("pinned-one", "pinned-one"), pod_1=("pinned-one", "pinned-one"))
    assert decide(LOGIN, full) == []


def test_never_displaces_a_busier_adapter_but_does_displace_an_idle_one() -> None:
    # the least recently used (first) is the one a new adapter would displace
    full = views(pod_0=("beta-chat", "busy-one"), pod_1=("beta-chat", "busy-one"))
    assert decide(LOGIN, full, busy={"busy-one": 5.0, "beta-chat": 5.0}) == []
    actions = decide(LOGIN, full, busy={"busy-one": 5.0, "beta-chat": 0.0})
    assert actions == [("load", "pod-0", "acme-chat"), ("warmup", "pod-0", "acme-chat")]


def test_a_later_step_never_pushes_off_a_likelier_step_of_the_same_event() -> None:
    # doc-classifier (p=1, due now) and legal-extract fill pod-0; medical-extract, less
    # likely, goes to pod-1 instead of pushing doc-classifier off pod-0
    assert decide(UPLOAD, views(), max_loads=3) == [
        ("load", "pod-0", "doc-classifier"),
        ("warmup", "pod-0", "doc-classifier"),
        ("load", "pod-0", "legal-extract"),
        ("warmup", "pod-0", "legal-extract"),
        ("load", "pod-1", "medical-extract"),
        ("warmup", "pod-1", "medical-extract"),
    ]


def test_events_cannot_reach_other_tenants_or_unknown_adapters() -> None:
    beta_login = Event(kind=EventKind.LOGIN, id="e3", tenant=TenantId("beta"))
    assert decide(beta_login, views()) == [
        ("load", "pod-0", "beta-chat"),
        ("warmup", "pod-0", "beta-chat"),
    ]
    decision = event_preloads(
        UPLOAD,
        (
            Prediction(adapter=AdapterId("../../etc/passwd"), probability=1.0, within_s=0),
            Prediction(adapter=AdapterId("beta-chat"), probability=1.0, within_s=0),
        ),
        catalog=CATALOG,
        fleet=FLEET,
        plan=None,
        views=views(),
        busy_rps={},
        max_loads=5,
    )
    assert decision.actions == ()
    assert set(decision.skipped) == {"../../etc/passwd", "beta-chat"}


def test_unknown_trigger_predicts_nothing() -> None:
    other = Event(kind=EventKind.PIPELINE, id="e4", tenant=TenantId("acme"), trigger="nope")
    assert decide(other, views()) == []


NAMES = sorted(str(a) for a in CATALOG.names())


@given(
    hot=st.lists(st.lists(st.sampled_from(NAMES), max_size=2, unique=True), min_size=2, max_size=2),
    busy=st.dictionaries(st.sampled_from(NAMES), st.floats(0, 10)),
    max_loads=st.integers(0, 4),
    login=st.booleans(),
)
# Two warmups on one pod: the second displaces what the pod holds after the first
# (acme-chat), not what it held before the event (doc-classifier).
@example(
    hot=[[], ["doc-classifier", "acme-chat"]],
    busy={"acme-chat": 0.0, "doc-classifier": 1.0, "legal-extract": 1.0},
    max_loads=2,
    login=False,
)
# medical-extract (0.0033 rps) once pushed off doc-classifier, this event's own step
# expected at 0.0167 rps, because only the incoming side counted the event's traffic.
@example(hot=[[], []], busy={}, max_loads=3, login=False)
def test_bounded_and_never_displacing_pinned_or_busier(
    hot: list[list[str]], busy: dict[str, float], max_loads: int, login: bool
) -> None:
    pod_views = views(pod_0=tuple(hot[0]), pod_1=tuple(hot[1]))
    event = LOGIN if login else UPLOAD
    predictions = pipeline_predictor(doc_pipelines(), CATALOG)(event)
    decision = event_preloads(
        event,
        predictions,
        catalog=CATALOG,
        fleet=FLEET,
        plan=None,
        views=pod_views,
        busy_rps={AdapterId(k): v for k, v in busy.items()},
        max_loads=max_loads,
    )
    warmups = [a for a in decision.actions if a.kind is ActionKind.WARMUP]
    assert len(warmups) <= max_loads
    assert all(a.adapter in CATALOG.names() for a in decision.actions)
    # traffic as the event foresees it: busy now plus what the event adds, on both sides
    foreseen = {AdapterId(k): v for k, v in busy.items()}
    for p in predictions:
        foreseen[p.adapter] = foreseen.get(p.adapter, 0.0) + p.expected_rps
    # walk the warmups in order: each one changes what the next would displace
    hot_now = {name: view.hot for name, view in pod_views.items()}
    for action in warmups:
        view = pod_views[action.pod]
        victim = None
        if len(hot_now[action.pod]) >= view.pod.max_loras:
            victim = next(a for a in hot_now[action.pod] if a not in view.pinned)
            assert foreseen.get(victim, 0.0) < foreseen[action.adapter]
        hot_now[action.pod] = tuple(
            a for a in (*hot_now[action.pod], action.adapter) if a != victim
        )


@dataclass(frozen=True)
class _Preload:
    adapter: str
    due_s: float
    probability: float


class _Learned:
    """A learned event model's answers, canned: legal-extract follows doc-classifier."""

    def after_request(
        self, *, tenant: str | None, adapter: str, at_s: float, min_probability: float = 0.3
    ) -> tuple[_Preload, ...]:
        if adapter == "doc-classifier":
            return (_Preload(adapter="medical-extract", due_s=at_s + 30, probability=0.9),)
        return ()

    def after_login(
        self, *, tenant: str, at_s: float, min_probability: float = 0.3
    ) -> tuple[_Preload, ...]:
        return (_Preload(adapter="busy-one", due_s=at_s + 600, probability=0.5),)


def test_learned_models_add_followers_and_login_habits_to_the_declared_ones() -> None:
    from placement.forecast.event_preloads import learned_predictor

    predict = learned_predictor(_Learned(), declared=pipeline_predictor(doc_pipelines(), CATALOG))
    upload = {p.adapter: (p.probability, p.within_s) for p in predict(UPLOAD)}
    login = {p.adapter: (p.probability, p.within_s) for p in predict(LOGIN)}
    assert upload[AdapterId("medical-extract")] == (0.9, 30.0)  # learned beats declared 0.4
    assert upload[AdapterId("legal-extract")] == (0.6, 120.0)
    assert login == {"acme-chat": (1.0, 300.0), "busy-one": (0.5, 600.0)}
