"""What a load's victim is worth (``policies.victims.victim_worth_s``): its forecast
rate, fading as it idles on its pod, times a reload and its class weight."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.routing import PodSnapshot, VictimWorth, victim_worth_s
from policies.victims import estimate_refresh, victim_after
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


@given(
    values=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=6),
    running=st.sets(st.integers(0, 5), max_size=2),
    margin_s=st.floats(0.0, 2.0),
    warmup_s=st.floats(0.0, 0.5),
)
def test_warm_ups_by_estimate_make_the_least_valued_the_lru_victim_when_they_pay(
    values: list[float], running: set[int], margin_s: float, warmup_s: float
) -> None:
    names = tuple(f"a{i}" for i in range(len(values)))
    busy = frozenset(names[i] for i in running if i < len(names))
    pod = PodSnapshot(
        pod_id="pod-0", gpu_adapters=names, running_adapters=busy, max_loras=len(names)
    )
    value = dict(zip(names, values, strict=True))
    refresh = estimate_refresh(pod, value.__getitem__, warmup_s=warmup_s, margin_s=margin_s)
    idle = [name for name in names if name not in busy]
    least = min(value[name] for name in idle) if idle else 0.0
    if not refresh:  # none sent: LRU's victim is the least valued, or the case is weak
        assert len(idle) < 2 or value[idle[0]] - least <= margin_s + warmup_s * (
            idle.index(next(n for n in idle if value[n] == least))
        )
        return
    assert list(refresh) == idle[: len(refresh)]  # warmed in LRU order
    victim = victim_after(pod, worth(0.0), refresh)
    assert victim is not None and value[victim] == least
    assert value[idle[0]] - least > margin_s + warmup_s * len(refresh)


def test_no_warm_ups_by_estimate_with_a_free_slot() -> None:
    pod = PodSnapshot(pod_id="pod-0", gpu_adapters=("a", "b"), max_loras=3, free_slots=1)
    value = {"a": 5.0, "b": 0.0}
    assert estimate_refresh(pod, value.__getitem__, warmup_s=0.0, margin_s=0.0) == ()
