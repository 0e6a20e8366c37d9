"""Routing decisions: which pod serves a request for an adapter, given live pod state.

Owns the scorers (round-robin, least-loaded, the EPP score, llm-d's
lora-affinity scorer, consistent hashing with a general pool, bounded affinity,
plan-aware routing) and the rules every router applies first: drop unhealthy pods,
memory pressure (no new loads above a soft KV use on all candidates, reject above a
hard one; lorafleet's ``route_plan`` also keeps loads off each pod above the soft line),
and stampede coalescing (a request for an adapter loading on a pod goes to that pod).
Shared by the live router and the replay simulator. Thresholds and costs arrive in the
context without defaults: the caller takes them from its settings.

Pure and fast: no IO, no clock (``now_s`` is a field), no hidden state (round-robin
takes and returns its cursor), plain Python loops because a decision must stay within
tens of microseconds over 64 pods. Must not import ``placement``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from policies.hashing import HashRing
from policies.saturation import REFERENCE_EPP, Criticality, SaturationThresholds, is_saturated


class PodLike(Protocol):
    """What a router reads about one pod. ``PodSnapshot`` is the frozen implementation;
    the simulator's mutable pod state satisfies it too, to avoid a copy per request."""

    @property
    def pod_id(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def gpu_util(self) -> float: ...
    #: Adapters on GPU slots, least recently used first.
    @property
    def gpu_adapters(self) -> Collection[str]: ...
    #: Adapters registered in host RAM (vLLM's CPU LRU); includes the GPU ones.
    @property
    def registered(self) -> Collection[str]: ...
    #: Adapters with requests in the running batch (vLLM ``running_lora_adapters``).
    @property
    def running_adapters(self) -> Collection[str]: ...
    #: Adapters with requests waiting (vLLM ``waiting_lora_adapters``).
    @property
    def waiting_adapters(self) -> Collection[str]: ...
    #: Adapters being loaded onto this pod right now.
    @property
    def loading(self) -> Collection[str]: ...
    @property
    def free_slots(self) -> int: ...
    @property
    def max_loras(self) -> int: ...
    #: When the adapter this pod would evict next was last used (seconds on the
    #: caller's clock); lower is a cheaper eviction. Ignored with a free slot.
    @property
    def victim_last_used_s(self) -> float: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class PodSnapshot:
    """A snapshot of one pod, as the live router scrapes it."""

    pod_id: str
    queue_depth: int = 0
    running: int = 0
    kv_usage: float = 0.0
    gpu_util: float = 0.0
    gpu_adapters: tuple[str, ...] = ()
    registered: frozenset[str] = frozenset()
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    loading: frozenset[str] = frozenset()
    free_slots: int = 0
    max_loras: int = 1
    victim_last_used_s: float = 0.0
    healthy: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class VictimWorth:
    """The forecast a load weighs its victim by: a load that evicts pays, besides its
    own cost, the chance that the victim is asked for again within ``victim_horizon_s``
    (by its rate, shared among the pods holding it) times a reload.

    A victim's rate is the lower of its forecast and its recent rate (``rate``): a
    forecast the traffic does not bear out (yesterday's pattern) protects nothing. The
    replay passes its last 20 minutes at each replan; the live router its own count of
    the requests it routed, read at each decision.
    """

    #: Each adapter's forecast request rate over the fleet (req/s); absent: 0.
    forecast_rps: Mapping[str, float]
    #: RouterSettings.victim_horizon_s.
    victim_horizon_s: float
    #: Each adapter's recent request rate over the fleet (req/s); absent: 0. None: the
    #: forecast alone.
    recent_rps: Mapping[str, float] | None = None
    #: The adapter a load on a pod would evict (None: none worth anything), when the
    #: caller models the engine better than the LRU order of ``gpu_adapters`` does (the
    #: live router's ledger knows pins, ghost slots and its requests in flight).
    #: None: ``lru_victim``.
    victim_of: Callable[[PodLike], str | None] | None = None

    def rate(self, adapter: str) -> float:
        """The rate ``adapter`` is weighed by: its forecast, capped by its recent rate."""
        forecast = self.forecast_rps.get(adapter, 0.0)
        recent = self.recent_rps
        if recent is None or forecast <= 0.0:
            return forecast
        return min(forecast, recent.get(adapter, 0.0))


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingContext:
    """One request to place, the pods to choose from, and the costs to weigh."""

    adapter: str
    pods: Sequence[PodLike]
    now_s: float = 0.0
    #: Seconds one queued request adds to the wait of those behind it on a pod
    #: (RouterSettings.per_request_s; the caller passes it, there is no default here).
    per_request_s: float
    #: Seconds to load an adapter held in the pod's host RAM, and from storage
    #: (LoadCostSettings.warm_load_ms / cold_load_ms with the expected drain).
    warm_load_s: float
    cold_load_s: float
    #: The memory-pressure tiers (RouterSettings.no_load_kv_usage, reject_kv_usage).
    no_load_kv_usage: float
    reject_kv_usage: float
    #: Requests for an adapter loading on a pod go to that pod (one load, not a stampede).
    coalesce: bool = True
    #: A load costs more than its own wait: its batch drain stalls every request on
    #: that pod (a swap costs 2-10x what a longer queue does).
    load_penalty_factor: float = 2.0
    #: lorafleet only (None: not weighed): what a load's LRU victim is worth.
    victims: VictimWorth | None = None


class RouteReason(enum.StrEnum):
    AFFINITY = "affinity"  # the adapter is on a GPU slot there
    COALESCE = "coalesce"  # the adapter is loading there
    LOAD = "load"  # no warm pod worth its queue: pay a load
    SCORE = "score"  # highest composite score (EPP, llm-d)
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    HASH = "hash"  # an owner on the hash ring
    GENERAL_POOL = "general-pool"  # long-tail adapter, shared pool
    PLAN = "plan"  # a hot pod of the plan
    SPILL = "spill"  # the plan's pods are too busy: bounded affinity elsewhere
    PRESSURE_WAIT = "pressure-wait"  # every pod above no-load KV use and none holds it
    REJECT = "reject"  # answer 503: every pod above the reject KV use, or EPP saturated
    NO_POD = "no-pod"  # no healthy pod


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The chosen pod (``None`` when the request must wait or be rejected) and why."""

    pod_id: str | None
    reason: RouteReason

    @property
    def accepted(self) -> bool:
        return self.pod_id is not None


# --- the rules every router applies first -------------------------------------------


def _holds(pod: PodLike, adapter: str) -> bool:
    return adapter in pod.gpu_adapters or adapter in pod.loading


def gate(ctx: RoutingContext) -> tuple[list[PodLike], RouteDecision | None]:
    """Healthy candidates, or the decision that ends routing early.

    Above ``reject_kv_usage`` on every healthy pod: reject. Above ``no_load_kv_usage``
    on every healthy pod: only pods already holding the adapter may take it, and with
    none the request waits rather than forcing a load (the soft and critical tiers).
    """
    healthy = []
    least_kv = 2.0
    for pod in ctx.pods:
        if pod.healthy:
            healthy.append(pod)
            kv = pod.kv_usage
            if kv < least_kv:  # noqa: PLR1730  (min() per pod costs microseconds)
                least_kv = kv
    if not healthy:
        return [], RouteDecision(None, RouteReason.NO_POD)
    if least_kv >= ctx.reject_kv_usage:
        return [], RouteDecision(None, RouteReason.REJECT)
    if least_kv >= ctx.no_load_kv_usage:
        holders = [pod for pod in healthy if _holds(pod, ctx.adapter)]
        if not holders:
            return [], RouteDecision(None, RouteReason.PRESSURE_WAIT)
        return holders, None
    return healthy, None


def coalesce(ctx: RoutingContext, candidates: Sequence[PodLike]) -> RouteDecision | None:
    """The least-queued candidate already loading the adapter, if any."""
    if not ctx.coalesce:
        return None
    adapter = ctx.adapter
    best: PodLike | None = None
    for pod in candidates:
        if (
            pod.loading
            and adapter in pod.loading
            and (best is None or pod.queue_depth < best.queue_depth)
        ):
            best = pod
    return None if best is None else RouteDecision(best.pod_id, RouteReason.COALESCE)


def _prelude(ctx: RoutingContext) -> tuple[list[PodLike], RouteDecision | None]:
    candidates, early = gate(ctx)
    if early is not None:
        return candidates, early
    return candidates, coalesce(ctx, candidates)


# --- reactive baselines ---------------------------------------------------------------


def route_round_robin(ctx: RoutingContext, *, cursor: int) -> tuple[RouteDecision, int]:
    """The next healthy pod after ``cursor``; returns the decision and the new cursor."""
    candidates, early = gate(ctx)
    if early is not None:
        return early, cursor
    pod = candidates[cursor % len(candidates)]
    return RouteDecision(pod.pod_id, RouteReason.ROUND_ROBIN), cursor + 1


def load_of(pod: PodLike) -> int:
    return pod.queue_depth + pod.running


def route_least_loaded(ctx: RoutingContext) -> RouteDecision:
    """The pod with the fewest queued plus running requests (first on ties)."""
    candidates, early = _prelude(ctx)
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
    candidates, early = _prelude(ctx)
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
    candidates, early = _prelude(ctx)
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


# --- affinity with bounds -------------------------------------------------------------


def predicted_delay_s(pod: PodLike, ctx: RoutingContext) -> float:
    """Queue delay a new request would see: the queue ahead, plus what is left (half,
    on average) of a load in progress."""
    delay = pod.queue_depth * ctx.per_request_s
    if pod.loading and ctx.adapter not in pod.loading:
        delay += 0.5 * ctx.warm_load_s
    return delay


def load_penalty_s(pod: PodLike, ctx: RoutingContext) -> float:
    """What a load of the adapter on ``pod`` costs: 0 when it is on a GPU slot there."""
    if _holds(pod, ctx.adapter):
        return 0.0
    load_s = ctx.warm_load_s if ctx.adapter in pod.registered else ctx.cold_load_s
    return load_s * ctx.load_penalty_factor


def lru_victim(pod: PodLike) -> str | None:
    """The adapter the engine's LRU evicts next on ``pod``: the least recently used
    with no request running or queued, else the least recently used."""
    first: str | None = None
    for name in pod.gpu_adapters:
        if name not in pod.running_adapters and name not in pod.waiting_adapters:
            return name
        if first is None:
            first = name
    return first


def victim_worth_s(pod: PodLike, ctx: RoutingContext) -> float:
    """What evicting ``pod``'s next LRU victim is expected to cost: the chance, by its
    rate (``VictimWorth.rate``), that it is asked for within ``victim_horizon_s``, times
    a reload from host RAM (its load penalty). 0 with a free slot or without a forecast."""
    victims = ctx.victims
    if victims is None or pod.free_slots > 0:
        return 0.0
    victim = lru_victim(pod) if victims.victim_of is None else victims.victim_of(pod)
    rate = victims.rate(victim) if victim is not None else 0.0
    if rate <= 0.0:
        return 0.0
    # Its requests are shared by the pods holding it: losing one copy of several
    # costs that copy's share.
    copies = sum(1 for other in ctx.pods if victim in other.gpu_adapters)
    share = rate / max(1, copies)
    reuse = -math.expm1(-share * victims.victim_horizon_s)
    return reuse * ctx.warm_load_s * ctx.load_penalty_factor


_Key = tuple[float, int, float, int]


def _bounded_best(ctx: RoutingContext, candidates: Sequence[PodLike]) -> tuple[PodLike, _Key]:
    """Cheapest pod by predicted delay plus load penalty, and its sort key (its first
    item the cost in seconds, its second 0 when the pod is warm).

    On equal cost a warm pod wins (staying put keeps residency long), then a pod with a
    free slot (no eviction), then the pod whose next victim has been idle longest (so
    the fleet's slots act as one LRU cache), then the one with the fewest running.
    With a forecast in the context a load that evicts also pays its victim's worth
    (``victim_worth_s``). The loop inlines ``predicted_delay_s`` and ``load_penalty_s``
    for speed.
    """
    adapter = ctx.adapter
    per_request_s = ctx.per_request_s
    busy_s = 0.5 * ctx.warm_load_s
    warm_load_s = ctx.warm_load_s * ctx.load_penalty_factor
    cold_load_s = ctx.cold_load_s * ctx.load_penalty_factor
    weigh_victims = ctx.victims is not None
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
            delay += warm_load_s if adapter in pod.registered else cold_load_s
            if pod.free_slots > 0:
                key = (delay, 1, 0.0, pod.running)
            else:
                if weigh_victims and delay <= best_key[0]:  # worth >= 0: skip hopeless pods
                    delay += victim_worth_s(pod, ctx)
                key = (delay, 2, pod.victim_last_used_s, pod.running)
        if key < best_key:
            best, best_key = pod, key
    return best, best_key


def _bounded_pick(ctx: RoutingContext, candidates: Sequence[PodLike]) -> tuple[PodLike, bool]:
    """``_bounded_best``'s pod, and True when it is warm."""
    pod, key = _bounded_best(ctx, candidates)
    return pod, key[1] == 0


def route_bounded(ctx: RoutingContext) -> RouteDecision:
    """Bounded affinity: a warm pod while its predicted queue delay stays
    below the delay plus load penalty of the best pod elsewhere."""
    candidates, early = _prelude(ctx)
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
    candidates, early = _prelude(ctx)
    if early is not None:
        return early
    if tail and general_pool:
        pool = [pod for pod in candidates if pod.pod_id in general_pool]
        if pool:
            return RouteDecision(_bounded_pick(ctx, pool)[0].pod_id, RouteReason.GENERAL_POOL)
    owners = ring.replicas(ctx.adapter, replicas)
    chosen = [pod for pod in candidates if pod.pod_id in owners or _holds(pod, ctx.adapter)]
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
    return [pod for pod in candidates if pod.kv_usage < line or _holds(pod, ctx.adapter)]


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
        if weight > 0.0 and _holds(pod, ctx.adapter) and predicted_delay_s(pod, ctx) <= cost_s:
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
    by bounded cost) unless a pod elsewhere is cheaper by more than one warm load.
    Adapters absent from the plan: bounded affinity over the general pool (``tail``),
    else the hash ring's owners.
    """
    candidates, early = _prelude(ctx)
    if early is not None:
        return early
    allowed = below_pressure_line(ctx, candidates)
    if not allowed:
        return RouteDecision(None, RouteReason.PRESSURE_WAIT)
    if not pod_weights and not (tail and fallback.general_pool):
        return route_hash(replace(ctx, pods=allowed), fallback.ring, replicas=fallback.replicas)
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
