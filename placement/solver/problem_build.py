"""Builds the placement problem from catalog, fleet and demand (``build_problem``).

Owns the translation from domain values (adapters, pools, pods, a forecast per adapter,
the placement in force) into the solver inputs of ``placement.solver.problem``: pods
grouped into classes, each adapter's candidate with its costs and replica rules, the
tail reserve, and the pins that cannot hold. Decides nothing and does no IO.

Cost model, in one unit (milliseconds of request delay per second of traffic):
a request for a warm adapter waits ``warm_load_ms`` (host-to-GPU copy, init, warm-up),
one for a cold adapter ``cold_load_ms`` (storage fetch first); a load the plan
itself needs costs its milliseconds once, with the expected drain of a busy pod,
spread over the plan's validity.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import datetime
from types import MappingProxyType

from placement.domain import Adapter, AdapterId, Catalog, Fleet, Pod, PodId, Pool, PoolId, Tier
from placement.settings import PlannerSettings, Settings
from placement.solver.problem import (
    Candidate,
    Current,
    Demand,
    PlacementProblem,
    PodClass,
    PoolProblem,
)
from placement.solver.reserve import choose_reserve, reserve_cap
from policies.tiering import ProposedTier, TieringRule, TierProposal, propose_tiers


def build_problem(
    catalog: Catalog,
    fleet: Fleet,
    demand: Mapping[AdapterId, Demand],
    *,
    settings: Settings,
    valid_from: datetime,
    current: Current | None = None,
    ready: Collection[PodId] | None = None,
) -> PlacementProblem:
    """Translate domain values into solver inputs; adapters without demand have rate 0."""
    ready_set = frozenset(ready) if ready is not None else frozenset(p.name for p in fleet.pods)
    full_demand = {
        a.name: demand.get(a.name, Demand(mean_rps=0.0, q90_rps=0.0)) for a in catalog.adapters
    }
    total_rps = sum(d.mean_rps for d in full_demand.values())
    by_pool, fixed_cold, broken = _split_by_pool(catalog, fleet)
    pools = []
    for pool in fleet.pools:
        members = set(by_pool[pool.name])
        pool_problem, pool_broken = _pool_problem(
            pool,
            [a for a in catalog.adapters if a.name in members],
            full_demand,
            total_rps=total_rps,
            settings=settings,
            current=current or {},
            ready=ready_set,
            churn=current is not None,
        )
        broken.extend(pool_broken)
        planned = {c.name for c in pool_problem.candidates}
        fixed_cold.update(
            {name: "no forecast traffic" for name in by_pool[pool.name] if name not in planned}
        )
        pools.append(pool_problem)
    return PlacementProblem(
        pools=tuple(pools),
        fixed_cold=MappingProxyType(fixed_cold),
        demand=MappingProxyType(full_demand),
        valid_from=valid_from,
        settings=settings,
        broken_pins=tuple(broken),
        fleet_pods=tuple(p.name for p in fleet.pods),
    )


def _split_by_pool(
    catalog: Catalog, fleet: Fleet
) -> tuple[dict[PoolId, list[AdapterId]], dict[AdapterId, str], list[str]]:
    """Adapters per pool of their base model; those with no pool are cold, with why."""
    fixed_cold: dict[AdapterId, str] = {}
    broken: list[str] = []
    by_pool: dict[PoolId, list[AdapterId]] = {pool.name: [] for pool in fleet.pools}
    for adapter in catalog.adapters:
        pool = fleet.pool_for_base(adapter.base_model)
        if pool is not None:
            by_pool[pool.name].append(adapter.name)
            continue
        fixed_cold[adapter.name] = f"no pool serves base model {adapter.base_model}"
        if adapter.is_pinned:
            broken.append(
                f"{adapter.name} is pinned but no pool serves its base model {adapter.base_model}"
            )
    return by_pool, fixed_cold, broken


def _current_pairs(
    current: Current, pods: set[PodId], names: set[AdapterId]
) -> tuple[frozenset[tuple[AdapterId, PodId]], frozenset[tuple[AdapterId, PodId]]]:
    """(adapter, pod) pairs in force on ready pods of the pool: hot, and registered."""
    hot = frozenset(
        (a, p)
        for p, tiers in current.items()
        if p in pods
        for a, tier in tiers.items()
        if a in names and tier is Tier.HOT
    )
    registered = frozenset(
        (a, p) for p, tiers in current.items() if p in pods for a in tiers if a in names
    )
    return hot, registered


def _headroom(classes: tuple[PodClass, ...], configured: float, q90_total_rps: float) -> float:
    """The configured headroom, raised to what the traffic needs when the pool is short:
    a placement cannot add capacity, so it spreads the overload evenly and says so."""
    capacity = sum(cls.capacity_rps * cls.size for cls in classes)
    if capacity <= 0 or q90_total_rps <= capacity * configured:
        return configured
    return q90_total_rps / capacity


def pooled_q90_rps(demands: Collection[Demand]) -> float:
    """The q90 of a sum of independent adapters' traffic: the means add, and so do the
    squares of the q90-minus-mean spreads (a sum of q90s would plan for every adapter
    peaking at once)."""
    spread_sq = sum(max(0.0, d.q90_rps - d.mean_rps) ** 2 for d in demands)
    return sum(d.mean_rps for d in demands) + math.sqrt(spread_sq)


def pod_classes(pods: Collection[Pod]) -> tuple[PodClass, ...]:
    """Group pods with identical limits, in the order their first pod appears."""
    groups: dict[tuple[int, int, int, int, int, float], list[PodId]] = {}
    for pod in pods:
        key = (
            pod.max_loras,
            pod.max_cpu_loras,
            pod.max_lora_rank,
            pod.hbm_adapter_bytes,
            pod.host_adapter_bytes,
            pod.capacity_rps,
        )
        groups.setdefault(key, []).append(pod.name)
    return tuple(
        PodClass(
            key=f"c{index}",
            pods=tuple(names),
            max_loras=key[0],
            max_cpu_loras=key[1],
            max_lora_rank=key[2],
            hbm_bytes=key[3],
            host_bytes=key[4],
            capacity_rps=key[5],
        )
        for index, (key, names) in enumerate(groups.items())
    )


def _pool_problem(
    pool: Pool,
    adapters: list[Adapter],
    demand: Mapping[AdapterId, Demand],
    *,
    total_rps: float,
    settings: Settings,
    current: Current,
    ready: frozenset[PodId],
    churn: bool,
) -> tuple[PoolProblem, list[str]]:
    ready_pods = [pod for pod in pool.pods if pod.name in ready]
    classes = pod_classes(ready_pods)
    pod_names = {pod.name for pod in ready_pods}
    cur_hot, cur_reg = _current_pairs(current, pod_names, {a.name for a in adapters})
    rates: dict[str, float] = {a.name: demand[a.name].mean_rps for a in adapters}
    proposals = propose_tiers(
        rates,
        _previous_tiers(cur_hot, cur_reg),
        rule=_tiering_rule(classes, settings),
    )
    placed_now = {a for a, _ in cur_reg}
    q90_total = pooled_q90_rps([demand[a.name] for a in adapters])
    headroom = _headroom(classes, settings.planner.capacity_headroom, q90_total)
    candidates = []
    broken: list[str] = []
    for adapter in adapters:
        idle = demand[adapter.name].mean_rps <= 0 and not adapter.is_pinned
        if idle and adapter.name not in placed_now:
            continue
        candidate = _candidate(
            adapter,
            demand[adapter.name],
            proposals[str(adapter.name)],
            classes=classes,
            total_rps=total_rps,
            settings=settings,
            headroom=headroom,
        )
        broken.extend(_named_pin_problems(adapter.name, adapter.pinned_pods, pool, pod_names))
        candidates.append(candidate)
    problem = PoolProblem(
        pool=pool.name,
        classes=_reserve_tail(classes, candidates, settings=settings),
        candidates=tuple(candidates),
        current_hot=cur_hot,
        current_registered=cur_reg,
        churn_limit=settings.planner.max_loads_per_pod if churn else None,
        validity_s=float(settings.planner.validity_s),
        imbalance_weight=settings.planner.imbalance_weight,
        headroom=headroom,
        q90_total_rps=q90_total,
        stability=1.0 - settings.planner.demote_factor if churn else 0.0,
        unready_pods=tuple(pod.name for pod in pool.pods if pod.name not in ready),
        zones=MappingProxyType({pod.name: pod.zone for pod in ready_pods if pod.zone}),
    )
    return problem, broken


def _reserve_tail(
    classes: tuple[PodClass, ...], candidates: list[Candidate], *, settings: Settings
) -> tuple[PodClass, ...]:
    """The classes less the slots per pod the tail reserve keeps for the dynamic cache
    (none when ``tail_reserve_max_slots`` is 0)."""
    limit = settings.planner.tail_reserve_max_slots
    if limit <= 0 or not candidates:
        return classes
    named = _named_pins_per_pod(classes, candidates)
    choice = choose_reserve(classes, candidates, limit=limit, named_pins=named)
    reserved = []
    for cls in classes:
        kept = min(
            choice.slots_per_pod,
            reserve_cap(cls, named_pins=named.get(cls.key, 0), limit=limit),
        )
        reserved.append(replace(cls, max_loras=cls.max_loras - kept, reserved_slots=kept))
    return tuple(reserved)


def _named_pins_per_pod(
    classes: tuple[PodClass, ...], candidates: list[Candidate]
) -> dict[str, int]:
    """Per class key, the most adapters pinned by name to one of its pods."""
    per_pod: dict[PodId, int] = {}
    for candidate in candidates:
        for pod in candidate.pinned_pods:
            per_pod[pod] = per_pod.get(pod, 0) + 1
    return {cls.key: max((per_pod.get(p, 0) for p in cls.pods), default=0) for cls in classes}


def _named_pin_problems(
    name: AdapterId, pinned_pods: tuple[PodId, ...], pool: Pool, ready: set[PodId]
) -> list[str]:
    in_pool = {pod.name for pod in pool.pods}
    problems = []
    for pod in pinned_pods:
        if pod not in in_pool:
            problems.append(f"{name} is pinned to {pod}, which is not a pod of pool {pool.name}")
        elif pod not in ready:
            problems.append(f"{name} is pinned to {pod}, which is not ready")
    return problems


def _previous_tiers(
    hot: frozenset[tuple[AdapterId, PodId]], registered: frozenset[tuple[AdapterId, PodId]]
) -> dict[str, ProposedTier]:
    previous = {str(a): ProposedTier.WARM for a, _ in registered}
    previous.update({str(a): ProposedTier.HOT for a, _ in hot})
    return previous


def _tiering_rule(classes: tuple[PodClass, ...], settings: Settings) -> TieringRule:
    slots = sum(cls.max_loras * cls.size for cls in classes)
    host = sum(cls.max_cpu_loras * cls.size for cls in classes)
    replicas = max(1, settings.planner.default_hot_replicas)
    return TieringRule(
        hot_places=max(1, slots // replicas) if slots else 0,
        warm_places=host,
        promote_factor=settings.planner.promote_factor,
        demote_factor=settings.planner.demote_factor,
    )


def slo_weight(slo_ttft_ms: float | None, settings: PlannerSettings) -> float:
    """The weight of an adapter's GPU residency by its tenant's TTFT SLO: the reference
    SLO over its own, clipped to ``[slo_weight_min, slo_weight_max]``; 1 without one.

    A request that finds its adapter off the GPU waits a load (85 ms from host RAM to
    seconds from storage); against a 300 ms SLO that wait spends most of the budget,
    against a 3 s one a little of it, so a tight SLO makes a GPU slot worth more.
    """
    if slo_ttft_ms is None or slo_ttft_ms <= 0:
        return 1.0
    ratio = settings.slo_reference_ttft_ms / slo_ttft_ms
    return min(settings.slo_weight_max, max(settings.slo_weight_min, ratio))


def _candidate(
    adapter: Adapter,
    demand: Demand,
    proposal: TierProposal,
    *,
    classes: tuple[PodClass, ...],
    total_rps: float,
    settings: Settings,
    headroom: float,
) -> Candidate:
    cost = settings.load_cost
    planner = settings.planner
    size = adapter.size_bytes
    cold_ms = cost.cold_load_ms(size)
    warm_ms = cost.warm_load_ms(size)
    drain = cost.expected_drain_ms
    pods = sum(cls.size for cls in classes)
    max_hot = min(adapter.max_replicas, pods)
    share = demand.mean_rps / total_rps if total_rps > 0 else 0.0
    by_share = planner.default_hot_replicas if share >= planner.replicate_share else 1
    by_share = max(1, min(by_share, max_hot))
    capacity = max((cls.capacity_rps for cls in classes), default=0.0) * headroom
    by_capacity = math.ceil(demand.q90_rps / capacity - 1e-9) if capacity > 0 else pods + 1
    # An adapter busier than its allowed replicas can carry is still best hot on all of
    # them (each then has a pod to itself, see placement.solver.packing); never warm for it.
    by_capacity = min(by_capacity, max_hot)
    min_hot = max(adapter.min_replicas, len(adapter.pinned_pods), by_share, by_capacity, 1)
    return Candidate(
        name=adapter.name,
        size_bytes=size,
        rank=adapter.rank,
        mean_rps=demand.mean_rps,
        q90_rps=demand.q90_rps,
        warm_miss_ms=warm_ms,
        cold_miss_ms=cold_ms,
        activate_ms=cost.warm_load_ms(size, drain_ms=drain),
        fetch_ms=cold_ms - warm_ms,
        pinned=adapter.is_pinned,
        pinned_pods=adapter.pinned_pods,
        min_hot=min_hot,
        max_hot=max_hot,
        group=adapter.group,
        proposal=proposal,
        adapter_class=adapter.adapter_class,
        slo_weight=slo_weight(adapter.slo_ttft_ms, planner),
    )
