"""Classes in lorafleet's routing (``route_plan`` with ``VictimWorth.class_weight``): a
load never pushes a higher class off a pod while a lower class sits idle there; the
warm-ups it names (``RouteDecision.refresh``) are what keeps it so on vLLM's LRU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from policies.routing import (
    PodSnapshot,
    RouteReason,
    VictimWorth,
    class_refresh,
    lru_victim,
    route_plan,
    victim_worth_s,
)
from tests.policies.test_routing_ahead import OTHERS, ROUTER, WANTED, context, fallback_for

PRODUCTION, BATCH, EXPERIMENT = 1.0, 0.5, 0.1


def classes(weights: Mapping[str, float], rates: Mapping[str, float] | None = None) -> VictimWorth:
    return VictimWorth(
        forecast_rps=rates or {},
        victim_horizon_s=ROUTER.victim_horizon_s,
        class_weight=weights,
    )


def refreshed(pod: PodSnapshot, refresh: Sequence[str]) -> PodSnapshot:
    """``pod`` after the warm-ups: each refreshed adapter moves to the LRU's fresh end."""
    kept = [name for name in pod.gpu_adapters if name not in refresh]
    return replace(pod, gpu_adapters=(*kept, *refresh))


def idle(pod: PodSnapshot) -> list[str]:
    busy = pod.running_adapters | pod.waiting_adapters
    return [name for name in pod.gpu_adapters if name not in busy]


@st.composite
def full_pods(draw: st.DrawFn) -> list[PodSnapshot]:
    result = []
    for i in range(draw(st.integers(1, 5))):
        slots = draw(st.integers(1, 4))
        held = draw(st.lists(st.sampled_from(OTHERS), unique=True, min_size=slots, max_size=slots))
        free = draw(st.booleans()) and i > 0
        if free:
            held = held[:-1]
        result.append(
            PodSnapshot(
                pod_id=f"pod-{i}",
                queue_depth=draw(st.integers(0, 6)),
                kv_usage=draw(st.floats(0.0, 0.9)),
                gpu_adapters=tuple(held),
                registered=frozenset(held),
                running_adapters=frozenset(draw(st.sets(st.sampled_from(held or ["-"])))),
                free_slots=slots - len(held),
                max_loras=slots,
                victim_last_used_s=draw(st.floats(0.0, 100.0)),
            )
        )
    return result


class_maps = st.dictionaries(
    st.sampled_from((WANTED, *OTHERS)), st.sampled_from((PRODUCTION, BATCH, EXPERIMENT))
)
rate_maps = st.dictionaries(st.sampled_from((WANTED, *OTHERS)), st.floats(0.0, 2.0))


@given(
    pods=full_pods(),
    weights=class_maps,
    rates=rate_maps,
    plan=st.dictionaries(st.sampled_from([f"pod-{i}" for i in range(5)]), st.floats(0.1, 1.0)),
    now_s=st.floats(0.0, 200.0),
)
def test_a_class_never_displaces_a_higher_class_while_a_lower_one_is_idle_there(
    pods: list[PodSnapshot],
    weights: dict[str, float],
    rates: dict[str, float],
    plan: dict[str, float],
    now_s: float,
) -> None:
    victims = classes(weights, rates)
    ctx = context(pods, victims=victims, now_s=now_s)
    decision = route_plan(ctx, plan or None, fallback=fallback_for(pods), tail=True)
    assert decision.pod_id is not None
    pod = next(p for p in pods if p.pod_id == decision.pod_id)
    assert set(decision.refresh) <= set(idle(pod))  # warm-ups only of idle residents
    if WANTED in pod.gpu_adapters or pod.free_slots > 0:
        assert decision.refresh == ()
        return
    after = refreshed(pod, decision.refresh)
    victim = lru_victim(after)
    if victim is not None and idle(after):
        assert victims.weight(victim) <= min(victims.weight(name) for name in idle(after))


def test_the_production_adapter_is_warmed_up_so_the_batch_one_goes() -> None:
    # One pod, full: "a" (production) is its LRU victim, "b" (batch) idles beside it.
    pod = PodSnapshot(pod_id="pod-0", gpu_adapters=("a", "b", "c"), max_loras=3)
    victims = classes({"b": BATCH})
    decision = route_plan(
        context([pod], victims=victims), None, fallback=fallback_for([pod]), tail=True
    )
    assert decision.refresh == ("a",)
    assert lru_victim(refreshed(pod, decision.refresh)) == "b"


def test_no_warm_up_when_the_victim_is_of_the_lowest_class_or_a_slot_is_free() -> None:
    lowest = PodSnapshot(pod_id="pod-0", gpu_adapters=("x", "a"), max_loras=2)
    free = PodSnapshot(pod_id="pod-1", gpu_adapters=("a",), max_loras=2, free_slots=1)
    victims = classes({"x": EXPERIMENT})
    assert class_refresh(lowest, victims) == ()
    assert class_refresh(free, victims) == ()
    assert class_refresh(lowest, None) == ()


def test_a_busy_lower_class_adapter_does_not_count() -> None:
    # "b" (batch) has a request running: the engine skips it, so "a" may go.
    pod = PodSnapshot(
        pod_id="pod-0", gpu_adapters=("a", "b"), max_loras=2, running_adapters=frozenset({"b"})
    )
    assert class_refresh(pod, classes({"b": BATCH})) == ()


def test_the_load_prefers_the_pod_whose_victim_is_of_a_lower_class() -> None:
    # Equal pods but for their victims' classes: the experiment's pod takes the load.
    prod = PodSnapshot(pod_id="pod-0", gpu_adapters=("p",), max_loras=1)
    trial = PodSnapshot(pod_id="pod-1", gpu_adapters=("e",), max_loras=1)
    victims = classes({"e": EXPERIMENT}, {"p": 0.01, "e": 0.01})
    ctx = context([prod, trial], victims=victims)
    assert victim_worth_s(trial, ctx) < victim_worth_s(prod, ctx)
    decision = route_plan(ctx, None, fallback=fallback_for([prod, trial]), tail=True)
    assert (decision.pod_id, decision.reason) == ("pod-1", RouteReason.GENERAL_POOL)
