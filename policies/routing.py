"""lorafleet's routing and the affinity baselines it builds on.

Owns bounded affinity (a warm pod while its queue costs less than a load elsewhere),
consistent hashing with a general pool for the long tail, and plan-aware routing
(``route_plan``): bounded affinity with the plan deciding where a due load goes, no
load on a pod above the memory-pressure line, each load's victim weighed by the
forecast and its class (``policies.victims``), and the warm-ups that keep a higher
class from being evicted while a lower one is idle beside it (``RouteDecision.refresh``).
Shared by the live router and the replay simulator.

The shared vocabulary and first rules are ``policies.route_context``, the industry's
baselines ``policies.baselines``; both are re-exported here, so callers import routing
from one place.

Pure and fast: no IO, no clock (``now_s`` is a field), no hidden state, plain Python
loops because a decision must stay within tens of microseconds over 64 pods. Must not
import ``placement``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from policies.baselines import (
    LlmdWeights,
    epp_affinity,
    epp_score,
    llmd_affinity,
    route_epp,
    route_least_loaded,
    route_llmd,
    route_round_robin,
)
from policies.hashing import HashRing
from policies.route_context import (
    PodLike,
    PodSnapshot,
    RouteDecision,
    RouteReason,
    RoutingContext,
    VictimWorth,
    coalesce,
    gate,
    holds,
    load_of,
    load_penalty_s,
    predicted_delay_s,
    prelude,
)
from policies.victims import class_refresh, lru_victim, victim_worth_s

__all__ = [
    "HashFallback",
    "LlmdWeights",
    "PodLike",
    "PodSnapshot",
    "RouteDecision",
    "RouteReason",
    "RoutingContext",
    "VictimWorth",
    "below_pressure_line",
    "class_refresh",
    "coalesce",
    "epp_affinity",
    "epp_score",
    "gate",
    "llmd_affinity",
    "load_of",
    "load_penalty_s",
    "lru_victim",
    "predicted_delay_s",
    "route_bounded",
    "route_epp",
    "route_hash",
    "route_least_loaded",
    "route_llmd",
    "route_plan",
    "route_round_robin",
    "victim_worth_s",
    "weighs_cold_victims",
]


# --- affinity with bounds -------------------------------------------------------------


_Key = tuple[float, int, float, int]


def _bounded_best(ctx: RoutingContext, candidates: Sequence[PodLike]) -> tuple[PodLike, _Key]:
    """Cheapest pod by predicted delay plus load penalty, and its sort key (its first
    item the cost in seconds, its second 0 when the pod is warm).

    On equal cost a warm pod wins (staying put keeps residency long), then a pod with a
    free slot (no eviction), then the pod whose next victim has been idle longest (so
    the fleet's slots act as one LRU cache), then the one with the fewest running.
    With a forecast in the context a load that evicts also pays its victim's worth
    (``victim_worth_s``), after the warm-ups its classes call for (``class_refresh``),
    each costing a queued request; and, with ``VictimWorth.stall_weight``, what it
    stalls: the pod admits nothing while it drains and loads, so each request queued
    there waits the load's time too (the convoy). Under vLLM's admission
    (``RoutingContext.slot_wait_s``) a load on a pod where it can take no GPU slot also
    pays the wait for one (``RoutingContext.slot_taken``). The loop inlines
    ``predicted_delay_s`` and ``load_penalty_s`` for speed.

    A read from storage is weighed by its victim only where storage is fast
    (``weighs_cold_victims``). On slow storage a cold load also pushes the pod's last
    GPU victim out of its host cache, which the GPU victim's worth (at most a reload
    from host) does not see; those loads keep bounded affinity's order, the pod whose
    victim has idled longest, which keeps the host caches in LRU order too.
    """
    adapter = ctx.adapter
    per_request_s = ctx.per_request_s
    busy_s = 0.5 * ctx.warm_load_s
    warm_load_s = ctx.warm_load_s * ctx.load_penalty_factor
    cold_load_s = ctx.cold_load_s * ctx.load_penalty_factor
    victims = ctx.victims
    stall_weight = 0.0 if victims is None else victims.stall_weight
    weigh_cold = weighs_cold_victims(ctx)
    slot_wait, slot_taken = ctx.slot_wait_s, ctx.slot_taken
    best: PodLike = candidates[0]
    best_key: _Key = (math.inf, 2, 0.0, 0)
    for pod in candidates:
        loading = pod.loading
        delay = pod.queue_depth * per_request_s
        key: _Key
        if loading and adapter in loading:
            key = (delay, 0, 0.0, pod.running)
        elif adapter in pod.gpu_adapters:
            key = (delay + busy_s if loading else delay, 0, 0.0, pod.running)
        else:
            if loading:
                delay += busy_s
            warm = adapter in pod.registered
            delay += warm_load_s if warm else cold_load_s
            if delay > best_key[0]:
                continue  # what follows only adds: this pod cannot win
            wait_s = 0.0 if slot_wait is None or not slot_taken(pod) else slot_wait
            delay += wait_s * ctx.load_penalty_factor
            queued = pod.queue_depth
            if queued and stall_weight > 0.0:  # the queue behind it waits for the load
                load_s = ctx.warm_load_s if warm else ctx.cold_load_s
                delay += stall_weight * queued * (load_s + wait_s)
            if pod.free_slots > 0:
                key = (delay, 1, 0.0, pod.running)
            else:
                weigh = victims is not None and (warm or weigh_cold)
                if weigh and delay <= best_key[0]:  # skip hopeless pods
                    refresh = class_refresh(pod, victims)
                    delay += victim_worth_s(pod, ctx, refresh=refresh)
                    delay += len(refresh) * per_request_s
                key = (delay, 2, pod.victim_last_used_s, pod.running)
        if key < best_key:
            best, best_key = pod, key
    return best, best_key


def weighs_cold_victims(ctx: RoutingContext) -> bool:
    """Whether a load read from storage pays its victim's worth: only where the read
    adds no more than a load from host RAM itself costs (NVMe adds 5-13 ms to 336 ms).
    On object storage (legal-research: 735 ms more) weighing the GPU victim alone sent
    those loads where the host cache lost an adapter soon read again: 7,470 loads
    against bounded affinity's 7,296, and 7,211 with those loads left unweighed
    (docs/benchmarks.md, "Reads from slow storage")."""
    return ctx.cold_load_s - ctx.warm_load_s <= ctx.warm_load_s


def _bounded_pick(ctx: RoutingContext, candidates: Sequence[PodLike]) -> tuple[PodLike, bool]:
    """``_bounded_best``'s pod, and True when it is warm."""
    pod, key = _bounded_best(ctx, candidates)
    return pod, key[1] == 0


def route_bounded(ctx: RoutingContext) -> RouteDecision:
    """Bounded affinity: a warm pod while its predicted queue delay stays
    below the delay plus load penalty of the best pod elsewhere."""
    candidates, early = prelude(ctx)
    if early is not None:
        return early
    pod, warm = _bounded_pick(ctx, candidates)
    return RouteDecision(pod.pod_id, RouteReason.AFFINITY if warm else RouteReason.LOAD)


# --- hashing and plans ----------------------------------------------------------------


def route_hash(
    ctx: RoutingContext,
    ring: HashRing,
    *,
    replicas: int,
    tail: bool = False,
    general_pool: Collection[str] = (),
) -> RouteDecision:
    """Consistent hashing: the adapter's ``replicas`` owners on the ring, or a pod already holding
    it, whichever costs least (delay plus load penalty); a long-tail adapter (``tail``)
    goes to the general pool by bounded affinity."""
    return _hash_over(ctx, ctx.pods, ring, replicas=replicas, tail=tail, general_pool=general_pool)


def _hash_over(
    ctx: RoutingContext,
    pods: Sequence[PodLike],
    ring: HashRing,
    *,
    replicas: int,
    tail: bool = False,
    general_pool: Collection[str] = (),
) -> RouteDecision:
    """``route_hash`` over ``pods`` rather than ``ctx.pods`` (no context rebuilt)."""
    candidates, early = prelude(ctx, pods)
    if early is not None:
        return early
    if tail and general_pool:
        pool = [pod for pod in candidates if pod.pod_id in general_pool]
        if pool:
            return RouteDecision(_bounded_pick(ctx, pool)[0].pod_id, RouteReason.GENERAL_POOL)
    owners = ring.replicas(ctx.adapter, replicas)
    chosen = [pod for pod in candidates if pod.pod_id in owners or holds(pod, ctx.adapter)]
    if not chosen:
        # Every owner is down or saturated: widen to the next pods on the ring.
        wider = ring.replicas(ctx.adapter, len(ring.pod_ids))
        chosen = [pod for pod in candidates if pod.pod_id in wider] or candidates
    best = min(chosen, key=lambda pod: predicted_delay_s(pod, ctx) + load_penalty_s(pod, ctx))
    return RouteDecision(best.pod_id, RouteReason.HASH)


@dataclass(frozen=True, kw_only=True, slots=True)
class HashFallback:
    """How plan-aware routing treats adapters the plan does not mention."""

    ring: HashRing
    #: Ring owners per adapter (RouterSettings.hash_replicas).
    replicas: int
    general_pool: frozenset[str] = field(default_factory=frozenset)


def below_pressure_line(ctx: RoutingContext, candidates: Sequence[PodLike]) -> list[PodLike]:
    """The candidates that may take this request under memory pressure, pod by pod:
    those holding (or loading) the adapter, and those below ``no_load_kv_usage`` (a load
    there is safe). A pod above the line takes no new load, whatever the others' use."""
    line = ctx.no_load_kv_usage
    return [pod for pod in candidates if pod.kv_usage < line or holds(pod, ctx.adapter)]


def _weighted_warm(
    ctx: RoutingContext,
    candidates: Sequence[PodLike],
    pod_weights: Mapping[str, float],
    *,
    cost_s: float,
) -> PodLike | None:
    """Of the plan's pods holding the adapter at the cheapest delay ``cost_s``, the
    least loaded relative to its weight: the plan's shares split the warm traffic."""
    best: PodLike | None = None
    best_load = math.inf
    for pod in candidates:
        weight = pod_weights.get(pod.pod_id, 0.0)
        if weight > 0.0 and holds(pod, ctx.adapter) and predicted_delay_s(pod, ctx) <= cost_s:
            load = (load_of(pod) + 1) / weight
            if load < best_load:
                best, best_load = pod, load
    return best


def route_plan(
    ctx: RoutingContext,
    pod_weights: Mapping[str, float] | None,
    *,
    fallback: HashFallback,
    tail: bool = False,
) -> RouteDecision:
    """lorafleet's routing: bounded affinity, the plan deciding where loads go.

    No pod above the pressure line takes a load (``below_pressure_line``; with none
    left the request waits). A warm pod that bounded affinity would pick is kept:
    moving an adapter the plan placed elsewhere costs a load for nothing. When a load
    is due, it goes to the plan's pods for this adapter (``{pod_id: share}``, the best
    by bounded cost) when it costs no more there than on the best pod elsewhere.
    Adapters absent from the plan: bounded affinity over the general pool (``tail``),
    else the hash ring's owners. A load on a full pod names the warm-ups its classes
    call for (``class_refresh``), to be sent there first.
    """
    decision = _plan_pod(ctx, pod_weights, fallback=fallback, tail=tail)
    victims = ctx.victims
    if decision.pod_id is None or victims is None or not victims.class_weight:
        return decision
    pod = next(pod for pod in ctx.pods if pod.pod_id == decision.pod_id)
    if holds(pod, ctx.adapter):
        return decision
    refresh = class_refresh(pod, victims)
    return replace(decision, refresh=refresh) if refresh else decision


def _plan_pod(
    ctx: RoutingContext,
    pod_weights: Mapping[str, float] | None,
    *,
    fallback: HashFallback,
    tail: bool,
) -> RouteDecision:
    """``route_plan``'s pod and reason, before the warm-ups."""
    candidates, early = prelude(ctx)
    if early is not None:
        return early
    allowed = below_pressure_line(ctx, candidates)
    if not allowed:
        return RouteDecision(None, RouteReason.PRESSURE_WAIT)
    if not pod_weights and not (tail and fallback.general_pool):
        return _hash_over(ctx, allowed, fallback.ring, replicas=fallback.replicas)
    if not pod_weights:
        pool = [pod for pod in allowed if pod.pod_id in fallback.general_pool]
        pod, key = _bounded_best(ctx, pool or allowed)
        warm = key[1] == 0
        return RouteDecision(pod.pod_id, RouteReason.AFFINITY if warm else RouteReason.GENERAL_POOL)
    pod, key = _bounded_best(ctx, allowed)
    if key[1] == 0:
        shared = _weighted_warm(ctx, allowed, pod_weights, cost_s=key[0])
        if shared is not None:
            return RouteDecision(shared.pod_id, RouteReason.PLAN)
        return RouteDecision(pod.pod_id, RouteReason.AFFINITY)
    planned = [other for other in allowed if pod_weights.get(other.pod_id, 0.0) > 0.0]
    if planned:
        chosen, planned_key = _bounded_best(ctx, planned)
        if planned_key[0] <= key[0]:
            return RouteDecision(chosen.pod_id, RouteReason.PLAN)
    return RouteDecision(pod.pod_id, RouteReason.SPILL if planned else RouteReason.LOAD)
