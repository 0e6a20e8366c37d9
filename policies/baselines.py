"""The reactive baselines: round-robin, least-loaded, llm-d's EPP score and its
lora-affinity scorer, as the systems they stand for route.

Each takes a ``RoutingContext`` and returns a ``RouteDecision`` after the shared first
rules (``policies.route_context``); round-robin takes and returns its cursor, so nothing
here keeps state. Faithful to the originals, defects included (the EPP does not know a
pod is loading; llm-d's affinity reads activity, not residency): they are what
lorafleet is measured against, in the replay and behind the live router.

Pure and fast: no IO, no clock, loops inlined where a decision must stay within tens of
microseconds over 64 pods. Must not import ``placement``.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.route_context import (
    PodLike,
    RouteDecision,
    RouteReason,
    RoutingContext,
    gate,
    load_of,
    prelude,
)
from policies.saturation import REFERENCE_EPP, Criticality, SaturationThresholds, is_saturated


def route_round_robin(ctx: RoutingContext, *, cursor: int) -> tuple[RouteDecision, int]:
    """The next healthy pod after ``cursor``; returns the decision and the new cursor."""
    candidates, early = gate(ctx)
    if early is not None:
        return early, cursor
    pod = candidates[cursor % len(candidates)]
    return RouteDecision(pod.pod_id, RouteReason.ROUND_ROBIN), cursor + 1


def route_least_loaded(ctx: RoutingContext) -> RouteDecision:
    """The pod with the fewest queued plus running requests (first on ties)."""
    candidates, early = prelude(ctx)
    if early is not None:
        return early
    best = min(candidates, key=load_of)
    return RouteDecision(best.pod_id, RouteReason.LEAST_LOADED)


def epp_affinity(pod: PodLike, adapter: str) -> float:
    """The EPP's four affinity levels: active, cached on GPU, in host RAM, free slot."""
    if adapter in pod.running_adapters and adapter in pod.gpu_adapters:
        return 1.0
    if adapter in pod.gpu_adapters:
        return 0.8
    if adapter in pod.registered:
        return 0.4
    if pod.free_slots > 0:
        return 0.3
    return 0.0


def epp_score(pod: PodLike, adapter: str, *, max_queue_depth: int = 8) -> float:
    """0.50 affinity + 0.20 KV affinity + 0.15 queue headroom + 0.15 GPU headroom.

    KV-cache affinity is the pod's KV use while the adapter is on its GPU (its cached
    prefixes were built with that adapter), else 0, as in the EPP's worked example.
    """
    affinity = epp_affinity(pod, adapter)
    kv_affinity = pod.kv_usage if adapter in pod.gpu_adapters else 0.0
    queue_headroom = max(0.0, 1.0 - pod.queue_depth / max_queue_depth)
    return 0.5 * affinity + 0.2 * kv_affinity + 0.15 * queue_headroom + 0.15 * (1.0 - pod.gpu_util)


def route_epp(
    ctx: RoutingContext,
    *,
    max_queue_depth: int = 8,
    saturation: SaturationThresholds = REFERENCE_EPP,
    criticality: Criticality = Criticality.SHEDDABLE,
) -> RouteDecision:
    """llm-d's EPP: shed when saturated, filter pods at max queue depth, then best score.

    Saturated (``policies.saturation``: no pod with at most ``saturation.queue_depth``
    waiting requests and KV use at most ``saturation.kv_usage``; the reference EPP's 5
    and 0.8 by default), a sheddable request is shed: REJECT, a 503. The reference sheds
    only requests marked sheddable; the article's EPP drops pods at max queue depth
    before scoring and its pages fired on timeouts, so every request is sheddable by
    default here. ``Criticality.STANDARD`` (the reference's default priority 0) is never
    shed: with every pod at max depth it is scored over all of them, queues unbounded.

    The loop inlines ``epp_score`` (same arithmetic) to stay within the latency budget.
    """
    candidates, early = prelude(ctx)
    if early is not None:
        return early
    if criticality is Criticality.SHEDDABLE and is_saturated(candidates, saturation):
        return RouteDecision(None, RouteReason.REJECT)
    open_pods = [pod for pod in candidates if pod.queue_depth < max_queue_depth] or candidates
    adapter = ctx.adapter
    best, best_score = open_pods[0], -1.0
    for pod in open_pods:
        if adapter in pod.gpu_adapters:
            affinity = 1.0 if adapter in pod.running_adapters else 0.8
            kv_affinity = pod.kv_usage
        else:
            kv_affinity = 0.0
            affinity = 0.4 if adapter in pod.registered else 0.3 if pod.free_slots > 0 else 0.0
        queue_headroom = 1.0 - pod.queue_depth / max_queue_depth
        score = (
            0.5 * affinity
            + 0.2 * kv_affinity
            + 0.15 * (queue_headroom if queue_headroom > 0.0 else 0.0)
            + 0.15 * (1.0 - pod.gpu_util)
        )
        if score > best_score:
            best, best_score = pod, score
    return RouteDecision(best.pod_id, RouteReason.SCORE)


def llmd_affinity(pod: PodLike, adapter: str) -> float:
    """llm-d's lora-affinity scorer: active 1.0, free slot 0.8, waiting 0.6, else 0.

    Faithful to its defect: "active" and "waiting" are in-flight activity, not
    residency, so an idle resident adapter scores like a free slot or nothing.
    """
    if adapter in pod.running_adapters:
        return 1.0
    busy = len(pod.running_adapters) + len(pod.waiting_adapters)
    if busy < pod.max_loras:
        return 0.8
    if adapter in pod.waiting_adapters:
        return 0.6
    return 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LlmdWeights:
    affinity: float = 1.0
    queue: float = 2.0
    kv: float = 2.0


def route_llmd(ctx: RoutingContext, *, weights: LlmdWeights = LlmdWeights()) -> RouteDecision:
    """Weighted sum of lora-affinity, queue ((max-q)/(max-min)) and KV (1-use) scorers."""
    candidates, early = prelude(ctx)
    if early is not None:
        return early
    depths = [pod.queue_depth for pod in candidates]
    low, high = min(depths), max(depths)
    span = high - low
    adapter = ctx.adapter
    w_affinity, w_queue, w_kv = weights.affinity, weights.queue, weights.kv
    best, best_score = candidates[0], -1.0
    for pod in candidates:
        # llmd_affinity, inlined for speed.
        running = pod.running_adapters
        if adapter in running:
            affinity = 1.0
        elif len(running) + len(pod.waiting_adapters) < pod.max_loras:
            affinity = 0.8
        elif adapter in pod.waiting_adapters:
            affinity = 0.6
        else:
            affinity = 0.0
        queue = 1.0 if span == 0 else (high - pod.queue_depth) / span
        score = w_affinity * affinity + w_queue * queue + w_kv * (1.0 - pod.kv_usage)
        if score > best_score:
            best, best_score = pod, score
    return RouteDecision(best.pod_id, RouteReason.SCORE)
