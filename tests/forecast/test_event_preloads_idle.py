"""An event's preload never displaces an adapter a session is using.

Under the engine's LRU a preload that lands behind adapters in use is the next victim:
it leaves the GPU before its request comes (legal-research counted 3 of 12 such
preloads unused). ``PodView.idle_s`` says how long each adapter on a slot has been
idle; the displaced adapter is then taken as busy at one request per that time
(``MIN_WINDOW_S`` at least), against the traffic the event foresees for the incoming
one. Without ``idle_s`` the decision is the one it was.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from placement.domain import ActionKind, AdapterId, Fleet, PodId, TenantId
from placement.forecast.event_preloads import (
    MIN_WINDOW_S,
    Event,
    EventKind,
    PodView,
    Prediction,
    displaced_rps,
    event_preloads,
)
from tests.factories import adapter, catalog, fleet, pool

ACME = TenantId("acme")
LOGIN = Event(kind=EventKind.LOGIN, id="e1", tenant=ACME)
#: A login's adapter: surely asked for within five minutes (1/300 requests a second).
SOON = Prediction(adapter=AdapterId("acme-x"), probability=1.0, within_s=300.0)


def two_pods() -> Fleet:
    return fleet(pool("p", 2, max_loras=2, max_cpu_loras=4))


def full_view(fl: Fleet, index: int, idle_s: dict[str, float] | None) -> PodView:
    """Pod ``index`` with two adapters on its two slots, ``old`` its LRU victim."""
    pod = fl.pods[index]
    hot = (AdapterId(f"old-{index}"), AdapterId(f"new-{index}"))
    idle = {AdapterId(f"{k}-{index}"): s for k, s in (idle_s or {}).items()}
    return PodView(pod=pod, registered=frozenset(hot), hot=hot, idle_s=idle)


def decide(
    views: dict[PodId, PodView], prediction: Prediction = SOON, *, busy_rps: float = 0.0
) -> dict[str, str]:
    """Each Warmup's pod by adapter, and each skipped adapter's reason; ``busy_rps``
    is the incoming adapter's forecast traffic."""
    decision = event_preloads(
        LOGIN,
        (prediction,),
        catalog=catalog(adapter("acme-x", tenant="acme")),
        fleet=two_pods(),
        plan=None,
        views=views,
        busy_rps={AdapterId("acme-x"): busy_rps},
        max_loads=2,
    )
    placed = {str(a.adapter): str(a.pod) for a in decision.actions if a.kind is ActionKind.WARMUP}
    return placed | {str(name): why for name, why in decision.skipped.items()}


def test_a_pod_whose_victim_is_in_use_is_passed_over_for_one_whose_victim_is_idle() -> None:
    fl = two_pods()
    views = {
        fl.pods[0].name: full_view(fl, 0, {"old": 20.0, "new": 5.0}),  # a session's gap
        fl.pods[1].name: full_view(fl, 1, {"old": 900.0, "new": 5.0}),
    }
    assert decide(views) == {"acme-x": str(fl.pods[1].name)}


def test_no_preload_when_every_victim_is_in_use() -> None:
    fl = two_pods()
    views = {pod.name: full_view(fl, i, {"old": 30.0, "new": 1.0}) for i, pod in enumerate(fl.pods)}
    assert decide(views) == {"acme-x": "it would displace old-1, which is at least as busy"}


def test_a_busy_adapter_counts_as_used_within_the_minimum_window() -> None:
    # Idle 0 s (a request running) is one request per MIN_WINDOW_S, not infinitely busy:
    # an adapter whose forecast traffic is above that may still displace it.
    fl = two_pods()
    view = full_view(fl, 0, {"old": 0.0})
    assert displaced_rps(view, AdapterId("old-0"), 0.0) == 1.0 / MIN_WINDOW_S
    views = {fl.pods[0].name: view, fl.pods[1].name: full_view(fl, 1, {"old": 0.0})}
    assert decide(views) == {"acme-x": "it would displace old-1, which is at least as busy"}
    assert decide(views, busy_rps=0.1) == {"acme-x": str(fl.pods[0].name)}


def test_without_idle_times_the_decision_is_as_before() -> None:
    fl = two_pods()
    views = {pod.name: full_view(fl, i, None) for i, pod in enumerate(fl.pods)}
    assert decide(views) == {"acme-x": str(fl.pods[0].name)}


@given(
    idle=st.lists(
        st.one_of(st.none(), st.floats(min_value=0.0, max_value=7200.0)), min_size=4, max_size=4
    ),
    within_s=st.floats(min_value=0.0, max_value=3600.0),
    probability=st.floats(min_value=0.05, max_value=1.0),
)
def test_a_preload_never_displaces_an_adapter_used_more_often_than_it_is_expected(
    idle: list[float | None], within_s: float, probability: float
) -> None:
    fl = two_pods()
    views: dict[PodId, PodView] = {}
    for i, pod in enumerate(fl.pods):
        known = {
            k: s
            for k, s in zip(("old", "new"), idle[2 * i : 2 * i + 2], strict=True)
            if s is not None
        }
        views[pod.name] = full_view(fl, i, known)
    prediction = Prediction(adapter=AdapterId("acme-x"), probability=probability, within_s=within_s)
    placed = decide(views, prediction)
    pod_of = {str(view.pod.name): view for view in views.values()}
    if placed["acme-x"] in pod_of:
        view = pod_of[placed["acme-x"]]
        assert displaced_rps(view, view.hot[0], 0.0) < prediction.expected_rps
    else:
        for view in views.values():
            assert displaced_rps(view, view.hot[0], 0.0) >= prediction.expected_rps
