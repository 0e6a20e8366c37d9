"""lorafleet's routing (``route_plan``) at its interface: bounded affinity underneath,
the pressure line per pod, victims weighed by the forecast, the plan deciding loads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.settings import MB, LoadCostSettings, RouterSettings
from policies.hashing import build_ring
from policies.route_context import prelude
from policies.routing import (
    HashFallback,
    PodSnapshot,
    RouteReason,
    RoutingContext,
    VictimWorth,
    _bounded_best,
    below_pressure_line,
    route_bounded,
    route_hash,
    route_plan,
    victim_worth_s,
    weighs_cold_victims,
)

WANTED = "wanted"
OTHERS = ("a", "b", "c", "d", "e", "f")
ROUTER = RouterSettings()
_COST = LoadCostSettings()
_BASE = RoutingContext(
    adapter=WANTED,
    pods=(),
    per_request_s=ROUTER.per_request_s,
    warm_load_s=_COST.warm_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
    cold_load_s=_COST.cold_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
    no_load_kv_usage=ROUTER.no_load_kv_usage,
    reject_kv_usage=ROUTER.reject_kv_usage,
)


def context(pods: Sequence[PodSnapshot], **fields: Any) -> RoutingContext:
    return replace(_BASE, pods=pods, **fields)


def fallback_for(pods: Sequence[PodSnapshot]) -> HashFallback:
    names = [p.pod_id for p in pods]
    return HashFallback(
        ring=build_ring(names), replicas=ROUTER.hash_replicas, general_pool=frozenset(names)
    )


def worth(rates: dict[str, float]) -> VictimWorth:
    return VictimWorth(forecast_rps=rates, victim_horizon_s=ROUTER.victim_horizon_s)


@st.composite
def pod_lists(draw: st.DrawFn) -> list[PodSnapshot]:
    count = draw(st.integers(1, 6))
    result = []
    for i in range(count):
        slots = draw(st.integers(1, 4))
        held = draw(st.lists(st.sampled_from((WANTED, *OTHERS)), unique=True, max_size=slots))
        loading = draw(st.sampled_from((frozenset(), frozenset({WANTED}), frozenset({"z"}))))
        result.append(
            PodSnapshot(
                pod_id=f"pod-{i}",
                queue_depth=draw(st.integers(0, 20)),
                running=draw(st.integers(0, 32)),
                kv_usage=draw(st.floats(0.0, 0.94)),
                gpu_adapters=tuple(held),
                registered=frozenset(draw(st.lists(st.sampled_from((WANTED, *OTHERS))))),
                running_adapters=frozenset(held[:1]),
                loading=loading,
                free_slots=slots - len(held) - len(loading),
                max_loras=slots,
                victim_last_used_s=draw(st.floats(0.0, 100.0)),
                healthy=draw(st.booleans()) or i == 0,
            )
        )
    return result


def _holds(pod: PodSnapshot) -> bool:
    return WANTED in pod.gpu_adapters or WANTED in pod.loading


rates_strategy = st.dictionaries(
    st.sampled_from((WANTED, *OTHERS)), st.floats(0.0, 5.0), max_size=len(OTHERS) + 1
)


@given(
    pods=pod_lists(),
    weights=st.dictionaries(st.sampled_from([f"pod-{i}" for i in range(6)]), st.floats(0.1, 1.0)),
    rates=st.none() | rates_strategy,
    tail=st.booleans(),
)
def test_lorafleet_never_loads_on_a_pod_above_the_pressure_line(
    pods: list[PodSnapshot],
    weights: dict[str, float],
    rates: dict[str, float] | None,
    tail: bool,
) -> None:
    victims = None if rates is None else worth(rates)
    ctx = context(pods, victims=victims)
    decision = route_plan(ctx, weights or None, fallback=fallback_for(pods), tail=tail)
    if decision.pod_id is None:
        assert decision.reason in (RouteReason.PRESSURE_WAIT, RouteReason.REJECT)
        return
    chosen = next(p for p in pods if p.pod_id == decision.pod_id)
    assert chosen.healthy
    assert _holds(chosen) or chosen.kv_usage < ctx.no_load_kv_usage


@given(pods=pod_lists())
def test_without_a_plan_or_a_forecast_lorafleet_routes_as_bounded_affinity(
    pods: list[PodSnapshot],
) -> None:
    # Below the pressure line everywhere, an adapter the plan does not protect is
    # routed by bounded affinity, pod for pod.
    calm = [replace(p, kv_usage=min(p.kv_usage, 0.5)) for p in pods]
    ctx = context(calm)
    assert (
        route_plan(ctx, None, fallback=fallback_for(calm), tail=True).pod_id
        == route_bounded(ctx).pod_id
    )


@given(
    pods=pod_lists(),
    rates=st.none() | rates_strategy,
    slot_wait=st.none() | st.floats(0.0, 1.0),
    stall=st.sampled_from((0.0, 1.0)),
)
def test_the_scan_picks_the_first_cheapest_pod_by_each_pods_own_cost(
    pods: list[PodSnapshot],
    rates: dict[str, float] | None,
    slot_wait: float | None,
    stall: float,
) -> None:
    # The scan stops pricing a pod once its cost passes the best so far (the rest of
    # the price only adds); it must choose as pricing every pod alone would. Queues of
    # 0 or 1 make equal costs common, where the order of the other keys decides.
    pods = [replace(pod, queue_depth=pod.queue_depth % 2) for pod in pods]
    victims = None if rates is None else replace(worth(rates), stall_weight=stall)
    ctx = context(pods, victims=victims, slot_wait_s=slot_wait)
    chosen, key = _bounded_best(ctx, pods)
    alone = [_bounded_best(ctx, [pod])[1] for pod in pods]
    assert key == min(alone)
    assert chosen is pods[alone.index(min(alone))]


def test_an_unplanned_adapter_whose_only_holder_is_past_the_reject_line_is_rejected() -> None:
    # Every pod past the pressure line: only holders may take it, and its one holder is
    # past the reject line, so it is refused there rather than sent to a pod at 96%.
    pods = [
        PodSnapshot(pod_id="pod-0", kv_usage=0.90, gpu_adapters=("a",), max_loras=2),
        PodSnapshot(pod_id="pod-1", kv_usage=0.96, gpu_adapters=(WANTED,), max_loras=2),
    ]
    decision = route_plan(context(pods), None, fallback=fallback_for(pods))
    assert decision.pod_id is None
    assert decision.reason == RouteReason.REJECT


@settings(max_examples=1000)  # the case past both lines is rare among random fleets
@given(
    pods=pod_lists(),
    kv=st.lists(st.sampled_from((0.5, 0.84, 0.9, 0.95, 0.97)), min_size=6, max_size=6),
)
def test_an_unplanned_adapter_goes_where_route_hash_over_the_pods_below_the_line_sends_it(
    pods: list[PodSnapshot], kv: list[float]
) -> None:
    # route_plan hashes an adapter the plan does not name without building a context of
    # the allowed pods and running route_hash's prelude again; below, between and past
    # the pressure and reject lines (0.85, 0.95) it must decide as that did.
    pods = [replace(pod, kv_usage=usage) for pod, usage in zip(pods, kv, strict=False)]
    ctx = context(pods)
    fallback = fallback_for(pods)
    candidates, early = prelude(ctx)
    allowed = below_pressure_line(ctx, candidates)
    if early is not None:
        expected = early
    elif not allowed:
        expected = route_plan(ctx, None, fallback=fallback)
        assert expected.reason == RouteReason.PRESSURE_WAIT
    else:
        expected = route_hash(replace(ctx, pods=allowed), fallback.ring, replicas=fallback.replicas)
    decision = route_plan(ctx, None, fallback=fallback)
    assert (decision.pod_id, decision.reason) == (expected.pod_id, expected.reason)


def test_a_load_evicts_where_the_victim_is_forecast_to_be_asked_for_least() -> None:
    # Both pods full, same queue; pod-0's victim idled longer (bounded's pick) but the
    # forecast says it is busy, pod-1's victim is not asked for: load on pod-1.
    pods = [
        PodSnapshot(pod_id="pod-0", gpu_adapters=("hot", "x"), max_loras=2, victim_last_used_s=1.0),
        PodSnapshot(
            pod_id="pod-1", gpu_adapters=("cold", "y"), max_loras=2, victim_last_used_s=50.0
        ),
    ]
    assert route_bounded(context(pods)).pod_id == "pod-0"
    ctx = context(pods, victims=worth({"hot": 1.0, "cold": 0.0}))
    assert victim_worth_s(pods[0], ctx) > victim_worth_s(pods[1], ctx) == 0.0
    decision = route_plan(ctx, None, fallback=fallback_for(pods), tail=True)
    assert (decision.pod_id, decision.reason) == ("pod-1", RouteReason.GENERAL_POOL)


def _slow_storage(ctx: RoutingContext) -> RoutingContext:
    """``ctx`` with a read from storage adding twice a load from host RAM (object
    storage: 735 ms on 340)."""
    return replace(ctx, cold_load_s=3.0 * ctx.warm_load_s)


@pytest.mark.parametrize(
    ("slow", "in_host", "expected"),
    [
        (False, False, "pod-1"),
        (True, True, "pod-1"),
        (True, False, "pod-0"),
    ],
    ids=["fast-storage-weighed", "slow-storage-from-host-weighed", "slow-storage-cold-lru"],
)
def test_on_slow_storage_a_cold_load_keeps_bounded_affinitys_victim(
    slow: bool, in_host: bool, expected: str
) -> None:
    # pod-0's victim idled longer (bounded's pick), pod-1's is not forecast. A load read
    # from slow storage also pushes the pod's last victim out of its host cache, which
    # the GPU victim's worth cannot see: it goes where bounded affinity sends it.
    registered = frozenset({WANTED}) if in_host else frozenset()
    pods = [
        PodSnapshot(
            pod_id="pod-0",
            gpu_adapters=("hot", "x"),
            registered=registered,
            max_loras=2,
            victim_last_used_s=1.0,
        ),
        PodSnapshot(
            pod_id="pod-1",
            gpu_adapters=("cold", "y"),
            registered=registered,
            max_loras=2,
            victim_last_used_s=50.0,
        ),
    ]
    ctx = context(pods, victims=worth({"hot": 1.0, "cold": 0.0}))
    ctx = _slow_storage(ctx) if slow else ctx
    assert weighs_cold_victims(ctx) is not slow
    decision = route_plan(ctx, None, fallback=fallback_for(pods), tail=True)
    assert decision.pod_id == expected


def test_a_victim_held_on_several_pods_is_worth_a_share_of_its_rate() -> None:
    one = PodSnapshot(pod_id="pod-0", gpu_adapters=("shared",), max_loras=1)
    two = PodSnapshot(pod_id="pod-1", gpu_adapters=("shared",), max_loras=1)
    alone = context([one], victims=worth({"shared": 0.01}))
    both = context([one, two], victims=worth({"shared": 0.01}))
    assert 0.0 < victim_worth_s(one, both) < victim_worth_s(one, alone)


def test_a_free_slot_has_no_victim_to_weigh() -> None:
    free = PodSnapshot(pod_id="pod-0", gpu_adapters=("hot",), max_loras=2, free_slots=1)
    assert victim_worth_s(free, context([free], victims=worth({"hot": 9.0}))) == 0.0


def test_a_warm_pod_is_kept_rather_than_loading_on_the_planned_one() -> None:
    warm = PodSnapshot(pod_id="pod-0", gpu_adapters=(WANTED,), max_loras=4, free_slots=3)
    planned = PodSnapshot(pod_id="pod-1", max_loras=4, free_slots=4)
    decision = route_plan(
        context([warm, planned]), {"pod-1": 1.0}, fallback=fallback_for([warm, planned])
    )
    assert (decision.pod_id, decision.reason) == ("pod-0", RouteReason.AFFINITY)


def test_a_load_goes_to_the_planned_pod_when_it_costs_no_more() -> None:
    pods = [PodSnapshot(pod_id=f"pod-{i}", max_loras=4, free_slots=4) for i in range(3)]
    decision = route_plan(context(pods), {"pod-2": 1.0}, fallback=fallback_for(pods))
    assert (decision.pod_id, decision.reason) == ("pod-2", RouteReason.PLAN)


def test_above_the_line_everywhere_but_one_pod_the_load_goes_there() -> None:
    # The least-KV pod is at 40%: the gate lets loads through, but pod-0 at 92% must not
    # take one (the case: a pod at 92% still took a load while another sat at 40%).
    hot = PodSnapshot(pod_id="pod-0", kv_usage=0.92, max_loras=4, free_slots=4)
    calm = PodSnapshot(pod_id="pod-1", kv_usage=0.40, queue_depth=30, max_loras=4, free_slots=4)
    assert route_bounded(context([hot, calm])).pod_id == "pod-0"
    decision = route_plan(context([hot, calm]), None, fallback=fallback_for([hot, calm]), tail=True)
    assert decision.pod_id == "pod-1"
