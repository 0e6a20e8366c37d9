"""Routing scorers and rules: the EPP's worked example, llm-d's levels, hashing, plans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.settings import MB, LoadCostSettings, RouterSettings
from policies.hashing import build_ring
from policies.routing import (
    HashFallback,
    PodSnapshot,
    RouteReason,
    RoutingContext,
    epp_affinity,
    epp_score,
    llmd_affinity,
    route_bounded,
    route_epp,
    route_hash,
    route_least_loaded,
    route_llmd,
    route_plan,
    route_round_robin,
)

MED = "medical-qa-hipaa"
#: The contexts carry the settings tree's thresholds and costs: the policies have none.
ROUTER = RouterSettings()
_COST = LoadCostSettings()
#: A rank-16 adapter of about 50 MB, on a busy pod (the expected drain).
_BASE = RoutingContext(
    adapter=MED,
    pods=(),
    per_request_s=ROUTER.per_request_s,
    warm_load_s=_COST.warm_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
    cold_load_s=_COST.cold_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
    no_load_kv_usage=ROUTER.no_load_kv_usage,
    reject_kv_usage=ROUTER.reject_kv_usage,
)


def context(pods: Sequence[PodSnapshot], **fields: Any) -> RoutingContext:
    """A request for MED over ``pods``; ``fields`` replace the settings' values."""
    return replace(_BASE, pods=pods, **fields)


def pod(name: str, **fields: Any) -> PodSnapshot:
    return PodSnapshot(pod_id=name, **fields)


POD_02 = pod(
    "pod-02",
    queue_depth=3,
    gpu_util=0.45,
    kv_usage=0.6,
    gpu_adapters=(MED,),
    registered=frozenset({MED}),
    running_adapters=frozenset({MED}),
    max_loras=4,
)
POD_05 = pod("pod-05", queue_depth=0, gpu_util=0.12, kv_usage=0.0, max_loras=4, free_slots=0)


def test_epp_worked_example() -> None:
    # The published example rounds each term to three places (0.094 + 0.083); exactly
    # it is 0.79625.
    assert epp_score(POD_02, MED) == pytest.approx(0.500 + 0.120 + 0.09375 + 0.0825)
    assert epp_score(POD_02, MED) == pytest.approx(0.797, abs=1e-3)
    assert epp_score(POD_05, MED) == pytest.approx(0.282)
    decision = route_epp(context([POD_05, POD_02]))
    assert decision.pod_id == "pod-02"


@pytest.mark.parametrize(
    ("view", "level"),
    [
        (pod("p", gpu_adapters=(MED,), running_adapters=frozenset({MED})), 1.0),
        (pod("p", gpu_adapters=(MED,)), 0.8),
        (pod("p", registered=frozenset({MED})), 0.4),
        (pod("p", free_slots=1), 0.3),
        (pod("p"), 0.0),
    ],
    ids=["active", "cached-gpu", "host", "free-slot", "none"],
)
def test_epp_affinity_levels(view: PodSnapshot, level: float) -> None:
    assert epp_affinity(view, MED) == level


@pytest.mark.parametrize(
    ("view", "level"),
    [
        (pod("p", running_adapters=frozenset({MED}), max_loras=1), 1.0),
        (pod("p", running_adapters=frozenset({"a"}), max_loras=2), 0.8),
        (
            pod(
                "p",
                running_adapters=frozenset({"a"}),
                waiting_adapters=frozenset({MED}),
                max_loras=2,
            ),
            0.6,
        ),
        (pod("p", running_adapters=frozenset({"a", "b"}), max_loras=2), 0.0),
        # The known defect: an idle resident adapter is invisible to the scorer.
        (
            pod("p", gpu_adapters=(MED, "a"), running_adapters=frozenset({"a", "b"}), max_loras=2),
            0.0,
        ),
    ],
    ids=["active", "free-slot", "waiting", "none", "idle-resident-invisible"],
)
def test_llmd_affinity_levels(view: PodSnapshot, level: float) -> None:
    assert llmd_affinity(view, MED) == level


def test_llmd_queue_and_kv_weights_outvote_affinity() -> None:
    busy_with_it = pod(
        "a", queue_depth=10, kv_usage=0.9, running_adapters=frozenset({MED}), max_loras=4
    )
    idle = pod(
        "b",
        queue_depth=0,
        kv_usage=0.1,
        running_adapters=frozenset({"x", "y", "z", "w"}),
        max_loras=4,
    )
    assert route_llmd(context([busy_with_it, idle])).pod_id == "b"


def test_round_robin_cycles_and_returns_cursor() -> None:
    pods = [pod("a"), pod("b"), pod("c")]
    cursor = 0
    chosen = []
    for _ in range(4):
        decision, cursor = route_round_robin(context(pods), cursor=cursor)
        chosen.append(decision.pod_id)
    assert chosen == ["a", "b", "c", "a"]


def test_least_loaded_counts_queue_and_running() -> None:
    pods = [
        pod("a", queue_depth=2, running=1),
        pod("b", running=2),
        pod("c", queue_depth=1, running=3),
    ]
    assert route_least_loaded(context(pods)).pod_id == "b"


def test_stampede_coalesces_on_the_loading_pod() -> None:
    loading = pod("a", queue_depth=6, loading=frozenset({MED}))
    idle = pod("b", free_slots=3)
    ctx = context([loading, idle])
    assert route_least_loaded(ctx).reason is RouteReason.COALESCE
    assert route_least_loaded(ctx).pod_id == "a"
    uncoalesced = context([loading, idle], coalesce=False)
    assert route_least_loaded(uncoalesced).pod_id == "b"


@pytest.mark.parametrize(
    ("kv_a", "kv_b", "holder", "reason", "pod_id"),
    [
        (0.5, 0.9, "b", RouteReason.LEAST_LOADED, "a"),
        (0.9, 0.88, "b", RouteReason.LEAST_LOADED, "b"),
        (0.9, 0.88, None, RouteReason.PRESSURE_WAIT, None),
        (0.96, 0.99, "a", RouteReason.REJECT, None),
    ],
    ids=["no-pressure", "soft-pressure-holder", "soft-pressure-wait", "hard-pressure-reject"],
)
def test_memory_pressure_tiers(
    kv_a: float, kv_b: float, holder: str | None, reason: RouteReason, pod_id: str | None
) -> None:
    pods = [
        pod(
            name,
            kv_usage=kv,
            gpu_adapters=(MED,) if name == holder else (),
            running=5 if name == "b" else 0,
        )
        for name, kv in (("a", kv_a), ("b", kv_b))
    ]
    decision = route_least_loaded(context(pods, coalesce=False))
    assert (decision.reason, decision.pod_id) == (reason, pod_id)


def test_unhealthy_pods_are_never_chosen() -> None:
    pods = [pod("a", healthy=False, gpu_adapters=(MED,)), pod("b", queue_depth=5)]
    assert route_bounded(context(pods)).pod_id == "b"
    assert route_epp(context([pods[0]])).reason is RouteReason.NO_POD


@pytest.mark.parametrize(
    ("warm_queue", "expected"),
    [(2, "warm"), (20, "cold")],
    ids=["short-queue-stays", "long-queue-spills"],
)
def test_bounded_affinity_stays_until_queue_beats_load(warm_queue: int, expected: str) -> None:
    warm = pod("warm", queue_depth=warm_queue, gpu_adapters=(MED,))
    cold = pod("cold", free_slots=2)
    ctx = context([warm, cold], per_request_s=0.05, cold_load_s=0.4)
    assert route_bounded(ctx).pod_id == expected


def test_hash_uses_two_stable_owners_and_general_pool_for_tail() -> None:
    names = [f"pod-{i}" for i in range(8)]
    ring = build_ring(names)
    owners = ring.replicas(MED, 2)
    assert len(set(owners)) == 2
    pods = [pod(name) for name in names]
    assert route_hash(context(pods), ring, replicas=ROUTER.hash_replicas).pod_id in owners
    tail = route_hash(
        context(pods), ring, replicas=ROUTER.hash_replicas, tail=True, general_pool={"pod-7"}
    )
    assert (tail.pod_id, tail.reason) == ("pod-7", RouteReason.GENERAL_POOL)


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40, unique=True))
def test_adding_a_pod_moves_few_adapters(adapters: list[str]) -> None:
    before = build_ring([f"pod-{i}" for i in range(8)])
    after = build_ring([f"pod-{i}" for i in range(9)])
    for adapter in adapters:
        old, new = before.replicas(adapter, 1)[0], after.replicas(adapter, 1)[0]
        assert new in (old, "pod-8")


def test_plan_weights_are_followed_and_absent_adapters_hashed() -> None:
    names = [f"pod-{i}" for i in range(4)]
    pods = [pod(name, gpu_adapters=(MED,) if name == "pod-3" else ()) for name in names]
    fallback = HashFallback(ring=build_ring(names), replicas=ROUTER.hash_replicas)
    ctx = context(pods)
    planned = route_plan(ctx, {"pod-3": 1.0}, fallback=fallback)
    assert (planned.pod_id, planned.reason) == ("pod-3", RouteReason.PLAN)
    assert route_plan(ctx, None, fallback=fallback).reason is RouteReason.HASH


def test_plan_spills_when_the_planned_pod_queue_outweighs_a_load() -> None:
    busy = pod("a", queue_depth=40, gpu_adapters=(MED,))
    idle = pod("b", free_slots=1)
    ctx = context([busy, idle], per_request_s=0.05, cold_load_s=0.4)
    fallback = HashFallback(ring=build_ring(["a", "b"]), replicas=ROUTER.hash_replicas)
    decision = route_plan(ctx, {"a": 1.0}, fallback=fallback)
    assert (decision.pod_id, decision.reason) == ("b", RouteReason.SPILL)


def test_plan_weights_split_traffic_in_proportion() -> None:
    counts = {"a": 0, "b": 0}
    running = {"a": 0, "b": 0}
    fallback = HashFallback(ring=build_ring(["a", "b"]), replicas=ROUTER.hash_replicas)
    for _ in range(100):
        pods = [pod(name, running=running[name], gpu_adapters=(MED,)) for name in ("a", "b")]
        ctx = context(pods, per_request_s=0.0)
        chosen = route_plan(ctx, {"a": 0.75, "b": 0.25}, fallback=fallback).pod_id
        assert chosen is not None
        counts[chosen] += 1
        running[chosen] += 1
    assert counts == {"a": 75, "b": 25}


def test_bounded_loads_where_the_eviction_is_cheapest() -> None:
    # No pod holds the adapter: free slot first, else the pod whose victim idled longest.
    fresh = pod("fresh", victim_last_used_s=90.0)
    stale = pod("stale", victim_last_used_s=10.0)
    free = pod("free", free_slots=1, running=5)
    assert route_bounded(context([fresh, stale])).pod_id == "stale"
    assert route_bounded(context([fresh, stale, free])).pod_id == "free"
