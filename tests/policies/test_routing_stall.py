"""What a load stalls (``VictimWorth.stall_weight``, RouterSettings.load_stall_weight): the
pod admits nothing while it drains and loads, so lorafleet prices the wait of the
requests queued there; bounded affinity, without victims, does not."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from policies.routing import (
    PodSnapshot,
    RouteReason,
    VictimWorth,
    route_bounded,
    route_plan,
    victim_worth_s,
)
from tests.policies.test_routing_ahead import ROUTER, WANTED, context, fallback_for, pod_lists

#: Two full pods, the wanted adapter in both host caches. ``hot`` carries a stream (two
#: requests queued behind its batch) and an idle victim worth nothing; ``idle`` has no
#: queue but evicts an adapter asked for often.
HOT = PodSnapshot(
    pod_id="hot",
    queue_depth=2,
    running=24,
    gpu_adapters=("cold-victim", "stream"),
    registered=frozenset({WANTED, "cold-victim", "stream"}),
    running_adapters=frozenset({"stream"}),
    waiting_adapters=frozenset({"stream"}),
    max_loras=2,
)
IDLE = PodSnapshot(
    pod_id="idle",
    gpu_adapters=("busy-victim", "other"),
    registered=frozenset({WANTED, "busy-victim", "other"}),
    max_loras=2,
)
PODS = (HOT, IDLE)


def worth(stall_weight: float) -> VictimWorth:
    return VictimWorth(
        forecast_rps={"busy-victim": 1.0},
        victim_horizon_s=ROUTER.victim_horizon_s,
        stall_weight=stall_weight,
    )


#: The weight the tests turn on (the shipped default is 0: off; docs/benchmarks.md, "Convoys").
WEIGHT = 1.0


def test_the_setting_is_off_by_default() -> None:
    assert ROUTER.load_stall_weight == 0.0


def test_a_load_leaves_the_pod_with_a_queue_when_its_stall_outweighs_the_rest() -> None:
    ctx = context(PODS)
    victims = worth(WEIGHT)
    # The idle pod's victim is worth less than the queue's wait for a load on the hot pod.
    stall_s = WEIGHT * HOT.queue_depth * ctx.warm_load_s
    own_s = HOT.queue_depth * ctx.per_request_s
    assert own_s < victim_worth_s(IDLE, replace(ctx, victims=victims)) < own_s + stall_s
    fallback = fallback_for(PODS)
    unweighed = route_plan(replace(ctx, victims=worth(0.0)), None, fallback=fallback, tail=True)
    weighed = route_plan(replace(ctx, victims=victims), None, fallback=fallback, tail=True)
    assert unweighed.pod_id == "hot"
    assert weighed == replace(unweighed, pod_id="idle")
    assert weighed.reason is RouteReason.GENERAL_POOL


def test_no_queue_no_stall() -> None:
    """With nothing queued on the hot pod the stall adds nothing: its cheaper victim wins."""
    pods = (replace(HOT, queue_depth=0), IDLE)
    ctx = context(pods, victims=worth(WEIGHT))
    assert route_plan(ctx, None, fallback=fallback_for(pods), tail=True).pod_id == "hot"


def test_bounded_affinity_does_not_weigh_it() -> None:
    """Bounded affinity has no victims in its context: the queue's wait is not its cost.
    Beside a pod with a load in flight (half a load's wait) and no queue, it keeps the
    hot pod's shorter wait; lorafleet, weighing the stall, takes the other."""
    busy = replace(IDLE, pod_id="busy", loading=frozenset({"z"}), gpu_adapters=("z",))
    pods = (HOT, busy)
    assert route_bounded(context(pods)).pod_id == "hot"
    for weight, expected in ((0.0, "hot"), (WEIGHT, "busy")):
        ctx = context(pods, victims=worth(weight))
        assert route_plan(ctx, None, fallback=fallback_for(pods), tail=True).pod_id == expected


@given(pod_lists(), st.floats(0.0, 4.0))
def test_the_weight_moves_no_warm_request(pods: list[PodSnapshot], weight: float) -> None:
    """A request whose adapter is on a GPU slot of its pod stays there whatever the weight:
    the stall is a load's cost only."""
    fallback = fallback_for(pods)
    without = route_plan(context(pods, victims=worth(0.0)), None, fallback=fallback, tail=True)
    chosen = route_plan(context(pods, victims=worth(weight)), None, fallback=fallback, tail=True)
    if without.reason in {RouteReason.AFFINITY, RouteReason.COALESCE}:
        assert chosen == without
