"""What a load's victim is worth (``policies.victims.victim_worth_s``): its forecast
rate, fading as it idles on its pod, times a reload and its class weight."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.routing import PodSnapshot, VictimWorth, victim_worth_s
from tests.policies.test_routing_ahead import ROUTER, context


def worth(rate_rps: float) -> VictimWorth:
    return VictimWorth(forecast_rps={"v": rate_rps}, victim_horizon_s=ROUTER.victim_horizon_s)


def full_pod(last_used_s: float) -> PodSnapshot:
    return PodSnapshot(
        pod_id="pod-0", gpu_adapters=("v",), max_loras=1, victim_last_used_s=last_used_s
    )


@given(
    rate_rps=st.floats(0.001, 10.0),
    idle_s=st.floats(0.0, 3600.0),
    longer_s=st.floats(1.0, 3600.0),
)
def test_a_victim_is_worth_less_the_longer_it_idles(
    rate_rps: float, idle_s: float, longer_s: float
) -> None:
    pod = full_pod(100.0)
    sooner = victim_worth_s(pod, context([pod], victims=worth(rate_rps), now_s=100.0 + idle_s))
    later = victim_worth_s(
        pod, context([pod], victims=worth(rate_rps), now_s=100.0 + idle_s + longer_s)
    )
    base = context([pod])
    assert 0.0 < later < sooner <= base.warm_load_s * base.load_penalty_factor


def test_a_victim_used_a_moment_ago_is_worth_what_its_forecast_says() -> None:
    # Idle 0 s: the chance of a request within the horizon is rate x H / (1 + rate x H).
    pod = full_pod(100.0)
    ctx = context([pod], victims=worth(0.01), now_s=100.0)
    reload_s = ctx.warm_load_s * ctx.load_penalty_factor
    rate_h = 0.01 * ROUTER.victim_horizon_s
    assert victim_worth_s(pod, ctx) == reload_s * rate_h / (1.0 + rate_h)


def test_without_the_callers_clock_the_forecast_alone_counts() -> None:
    # now_s 0 (the live router passes none): no idle time is known.
    pod = full_pod(100.0)
    assert victim_worth_s(pod, context([pod], victims=worth(0.01))) == victim_worth_s(
        pod, context([pod], victims=worth(0.01), now_s=100.0)
    )


def test_a_victim_nobody_forecasts_is_worth_nothing() -> None:
    pod = full_pod(100.0)
    assert victim_worth_s(pod, context([pod], victims=worth(0.0), now_s=500.0)) == 0.0
