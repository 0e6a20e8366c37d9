"""The candidate pre-filter: a decision over the candidates equals the full scan's
whenever the full scan's pod is a candidate (and always when it refuses)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.settings import MB, LoadCostSettings, RouterSettings
from policies.candidates import candidates, holder_positions, least_kv, least_queued
from policies.hashing import build_ring
from policies.routing import (
    HashFallback,
    PodSnapshot,
    RouteDecision,
    RoutingContext,
    route_plan,
)

ROUTER = RouterSettings()
_COST = LoadCostSettings()
ADAPTERS = ("a", "b", "c", "d", "e")
WANTED = "a"


@st.composite
def pods(draw: st.DrawFn) -> list[PodSnapshot]:
    count = draw(st.integers(min_value=1, max_value=14))
    made = []
    for i in range(count):
        registered = draw(st.frozensets(st.sampled_from(ADAPTERS), max_size=4))
        gpu = tuple(sorted(draw(st.frozensets(st.sampled_from(sorted(registered) or ["x"])))))
        gpu = tuple(a for a in gpu if a in registered)
        made.append(
            PodSnapshot(
                pod_id=f"pod-{i}",
                healthy=draw(st.sampled_from((True, True, True, False))),
                queue_depth=draw(st.integers(0, 6)),
                running=draw(st.integers(0, 4)),
                kv_usage=draw(st.sampled_from((0.1, 0.5, 0.86, 0.9, 0.96))),
                gpu_adapters=gpu,
                registered=registered,
                loading=draw(st.frozensets(st.sampled_from(ADAPTERS), max_size=1)),
                free_slots=draw(st.integers(0, 2)),
                max_loras=2,
                victim_last_used_s=draw(st.sampled_from((0.0, 5.0, 10.0))),
            )
        )
    return made


def _context(pod_list: Sequence[PodSnapshot]) -> RoutingContext:
    return RoutingContext(
        adapter=WANTED,
        pods=pod_list,
        per_request_s=ROUTER.per_request_s,
        warm_load_s=_COST.warm_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
        cold_load_s=_COST.cold_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
        no_load_kv_usage=ROUTER.no_load_kv_usage,
        reject_kv_usage=ROUTER.reject_kv_usage,
    )


def _both(
    pod_list: list[PodSnapshot], weights: Mapping[str, float] | None, *, width: int, tail: bool
) -> tuple[RouteDecision, RouteDecision, set[str]]:
    """The full scan's decision, the pre-filtered one, and the candidates' ids."""
    ring = build_ring(p.pod_id for p in pod_list)
    fallback = HashFallback(
        ring=ring, replicas=2, general_pool=frozenset(p.pod_id for p in pod_list)
    )
    named = weights.keys() if weights else ring.replicas(WANTED, 2)
    chosen = candidates(
        pod_list,
        holders=holder_positions(pod_list, WANTED),
        least_queued=least_queued(pod_list, count=width),
        least_kv=least_kv(pod_list),
        named=named,
        positions={p.pod_id: i for i, p in enumerate(pod_list)},
    )
    full = route_plan(_context(pod_list), weights, fallback=fallback, tail=tail)
    fewer = route_plan(_context(chosen), weights, fallback=fallback, tail=tail)
    return full, fewer, {p.pod_id for p in chosen}


@settings(max_examples=400)
@given(
    pod_list=pods(),
    plan=st.dictionaries(st.integers(0, 13), st.sampled_from((0.5, 1.0)), max_size=3),
    planned=st.booleans(),
    tail=st.booleans(),
    width=st.integers(1, 4),
)
def test_prefiltered_decision_equals_the_full_scan_when_its_pod_is_a_candidate(
    pod_list: list[PodSnapshot], plan: dict[int, float], planned: bool, tail: bool, width: int
) -> None:
    weights = {f"pod-{i}": w for i, w in plan.items()} if planned else None
    full, fewer, ids = _both(pod_list, weights, width=width, tail=tail and not planned)
    if full.pod_id is None or full.pod_id in ids:
        assert fewer == full


@given(pod_list=pods(), width=st.integers(1, 4))
def test_candidates_keep_pool_order_and_every_holder(
    pod_list: list[PodSnapshot], width: int
) -> None:
    positions = {p.pod_id: i for i, p in enumerate(pod_list)}
    chosen = candidates(
        pod_list,
        holders=holder_positions(pod_list, WANTED),
        least_queued=least_queued(pod_list, count=width),
        least_kv=least_kv(pod_list),
        positions=positions,
    )
    order = [positions[p.pod_id] for p in chosen]
    assert order == sorted(set(order))
    holding = [p for p in pod_list if WANTED in p.registered or WANTED in p.loading]
    assert all(p in chosen for p in holding)
    assert len(chosen) <= len(holding) + width + 1


def test_a_pool_of_256_yields_a_handful_of_candidates() -> None:
    pod_list = [
        PodSnapshot(pod_id=f"pod-{i}", queue_depth=i % 7, registered=frozenset({f"x{i}"}))
        for i in range(256)
    ]
    pod_list[200] = PodSnapshot(pod_id="pod-200", queue_depth=5, registered=frozenset({WANTED}))
    chosen = candidates(
        pod_list,
        holders=holder_positions(pod_list, WANTED),
        least_queued=least_queued(pod_list, count=4),
        least_kv=least_kv(pod_list),
        named=("pod-9", "pod-not-in-pool"),
        positions={p.pod_id: i for i, p in enumerate(pod_list)},
    )
    assert [p.pod_id for p in chosen] == ["pod-0", "pod-7", "pod-9", "pod-14", "pod-21", "pod-200"]


def test_the_least_kv_pod_keeps_the_pressure_tiers_of_the_full_scan() -> None:
    """Without the least-KV pod the candidates alone would all look pressed (a wait)."""
    pod_list = [
        PodSnapshot(pod_id="busy", kv_usage=0.9, queue_depth=0),
        PodSnapshot(pod_id="roomy", kv_usage=0.1, queue_depth=5),
    ]
    full, fewer, ids = _both(pod_list, {"busy": 1.0}, width=1, tail=False)
    assert ids == {"busy", "roomy"}
    assert fewer == full
    assert full.accepted  # alone, "busy" would make the request wait (PRESSURE_WAIT)


@settings(max_examples=300)
@given(
    victims=st.lists(st.sampled_from((0.0, 5.0, 10.0, 20.0)), min_size=2, max_size=14),
    free=st.lists(st.integers(0, 1), min_size=14, max_size=14),
    width=st.integers(1, 4),
)
def test_a_quiet_fleet_offers_the_load_where_bounded_affinity_would_put_it(
    victims: list[float], free: list[int], width: int
) -> None:
    """Every queue empty, no pod loading, nobody holding the adapter: the full scan puts
    the load on a free slot, else on the pod whose victim idled longest, wherever it is
    in pool order, and the pre-filter must offer that pod (a rank by queue and pool order
    alone offered the first ``width`` pods for every load)."""
    pod_list = [
        PodSnapshot(
            pod_id=f"pod-{i}",
            registered=frozenset({"x"}),
            gpu_adapters=("x",),
            free_slots=free[i],
            max_loras=2,
            victim_last_used_s=last,
        )
        for i, last in enumerate(victims)
    ]
    full, fewer, ids = _both(pod_list, None, width=width, tail=True)
    assert full.pod_id in ids
    assert fewer == full


def test_the_oldest_victim_last_in_pool_order_is_a_candidate() -> None:
    pod_list = [
        PodSnapshot(pod_id=f"pod-{i}", registered=frozenset({"x"}), victim_last_used_s=50.0 - i)
        for i in range(8)
    ]
    assert least_queued(pod_list, count=2) == (7, 6)
