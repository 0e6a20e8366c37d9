"""In a replay, lorafleet's event preloads leave the adapters sessions are using alone.

On a two-slot pod with two sessions (one request every 20 s each), a login's preload
would push one of them off; the session's next request pushes the unused preload off
in turn (under vLLM's LRU it is the victim), so the preload is wasted and a load is
added. The controller's views carry each slot's idle time (``EventController.views``),
and ``event_preloads`` declines. With one adapter in use and the other slot idle for
40 minutes, the same login is preloaded there and its first request finds its adapter
on the GPU.
"""

from __future__ import annotations

from datetime import UTC, datetime

from placement.domain import Pipelines, TenantId
from placement.forecast.event_preloads import Event, EventKind
from placement.settings import Settings
from placement.sim.events import EventController, SimEvent
from placement.sim.pods import SimPod
from placement.sim.replay import pod_specs, run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests import factories
from tests.factories import event_workload

MB = 1_000_000
START = datetime(2026, 3, 10, 9, tzinfo=UTC)
TENANT = TenantId("acme")
LOGIN_S = 3000.0


def sessions_and_login(*, sessions: tuple[int, int], other: tuple[int, int]) -> SimWorkload:
    """Two sessions every 20 s over ``sessions`` (start, end s), a third adapter every
    20 s over ``other``; acme's login at 3,000 s and its request 40 s later."""
    rows: list[tuple[float, str, str | None]] = [
        (float(t), f"session-{k}", None) for t in range(*sessions, 20) for k in (0, 1)
    ]
    rows += [(float(t), "other", None) for t in range(*other, 20)]
    rows += [(LOGIN_S + 40.0, "acme-x", "e1")]
    return event_workload(rows, start=START)


def event_figures(load: SimWorkload) -> dict[str, float | int | bool]:
    settings = Settings()
    fleet = factories.replay_fleet(1, max_loras=2)
    catalog = factories.replay_catalog(
        load.size_bytes, tenant_of=lambda name: TENANT if name.startswith("acme") else None
    )
    result = run_policy(
        "lorafleet",
        load,
        fleet,
        settings=settings,
        planning=replay_planning(catalog, fleet, settings=settings, planner="greedy"),
        events=[SimEvent(at_s=LOGIN_S, event=Event(kind=EventKind.LOGIN, id="e1", tenant=TENANT))],
        controller=EventController.build(catalog, fleet, Pipelines(), max_loads=2),
    )
    assert result.event_figures is not None
    return result.event_figures


def test_a_login_during_two_sessions_on_a_two_slot_pod_preloads_nothing() -> None:
    # The sessions began after the last plan (2,700 s): the forecast knows nothing of
    # them, only their idle times do.
    figures = event_figures(sessions_and_login(sessions=(2880, 4000), other=(0, 0)))
    assert (figures["preloads"], figures["first_request_gpu_share"]) == (0, 0.0)


def test_the_same_login_beside_one_session_is_preloaded_over_the_idle_slot() -> None:
    figures = event_figures(sessions_and_login(sessions=(0, 600), other=(2880, 4000)))
    assert figures["preloads"] == 1
    assert figures["preloads_unused_share"] == 0.0
    assert figures["first_request_gpu_share"] == 1.0


def test_the_views_say_how_long_each_slot_has_been_idle() -> None:
    settings = Settings()
    fleet = factories.replay_fleet(1, max_loras=2)
    catalog = factories.replay_catalog({"a": 50 * MB, "b": 50 * MB})
    (spec,) = pod_specs(fleet)
    pod = SimPod(spec)
    for name, at_s in (("a", 10.0), ("b", 20.0)):
        pod.fetch(name, busy=(), now_s=at_s)
        pod.land(name, at_s)
        pod.last_used[name] = at_s
    pod.running_adapters["b"] = 1  # a request for b is running
    controller = EventController.build(catalog, fleet, Pipelines(), max_loads=2)
    (view,) = controller.views([pod], now_s=100.0).values()
    assert dict(view.idle_s) == {"a": 90.0, "b": 0.0}
    # Without the moment, the latest use on any pod stands for it (never later).
    (view,) = controller.views([pod]).values()
    assert dict(view.idle_s) == {"a": 10.0, "b": 0.0}
    assert settings.sim.preload_min_idle_s > 0  # the plan's preloads have their own rule
