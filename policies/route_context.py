"""The vocabulary every router shares, and the rules each applies first.

Owns what a router reads of a pod (``PodLike``, ``PodSnapshot``), the request's
context (``RoutingContext``, with the victims' worth ``VictimWorth`` that only lorafleet
passes), the decision (``RouteDecision``, ``RouteReason``), and the rules every router
applies before scoring: drop unhealthy pods, memory pressure (no new loads above a soft
KV use on all candidates, reject above a hard one), and stampede coalescing (a request
for an adapter loading on a pod goes to that pod); with the two costs the affinity
routers weigh (``predicted_delay_s``, ``load_penalty_s``).

Pure and fast: no IO, no clock (``now_s`` is a field), plain Python loops. Thresholds
and costs arrive in the context without defaults: the caller takes them from its
settings. Must not import ``placement``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


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
    """What a load weighs its victim by (``policies.victims.victim_worth_s``): a load
    that evicts pays, besides its own cost, the chance that the victim is asked for
    again within ``victim_horizon_s`` times a reload: by its forecast rate, fading as
    the victim idles on its pod (when the caller's ``now_s`` says for how long).

    A victim's forecast rate is the lower of its forecast and its recent rate
    (``rate``): a forecast the traffic does not bear out (yesterday's pattern) protects
    nothing. The replay passes its last 20 minutes at each replan; the live router its
    own count of the requests it routed, read at each decision.

    Classes (``class_weight``): a victim's worth is scaled by its class's weight, so a
    load prefers the pod whose victim is of the lowest class; and a load never pushes
    out an adapter of a higher class while one of a lower class sits idle on that pod:
    the decision then names warm-ups (``RouteDecision.refresh``) that move the
    higher-class ones off the LRU victim's place first (``policies.victims``).
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
    #: Each adapter's class weight (the catalog ``class``: production 1.0, batch 0.5,
    #: experiment 0.1, the solver's); absent: 1.0. Empty: no classes.
    class_weight: Mapping[str, float] = field(default_factory=dict)
    #: RouterSettings.load_stall_weight: a load on a pod with requests queued also
    #: pays, for each, this weight times the load's time (the expected drain
    #: included): the pod admits none of them until it is in (the convoy). 0: not weighed.
    stall_weight: float = 0.0

    def weight(self, adapter: str) -> float:
        """``adapter``'s class weight (1.0 when the caller gave none)."""
        return self.class_weight.get(adapter, 1.0)

    def rate(self, adapter: str) -> float:
        """The rate ``adapter`` is weighed by: its forecast, capped by its recent rate."""
        forecast = self.forecast_rps.get(adapter, 0.0)
        recent = self.recent_rps
        if recent is None or forecast <= 0.0:
            return forecast
        return min(forecast, recent.get(adapter, 0.0))


def waits_for_slot(pod: PodLike) -> bool:
    """Whether a load on ``pod`` would wait for a GPU slot under vLLM's admission: no
    slot is free and every GPU adapter has requests running or queued there."""
    if pod.free_slots > 0:
        return False
    running, waiting = pod.running_adapters, pod.waiting_adapters
    return all(name in running or name in waiting for name in pod.gpu_adapters)


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
    #: Under an admission that drains nothing (vLLM's; the replay's ``load_admission``
    #: "vllm"): a load on a pod where it can take no GPU slot (``slot_taken``)
    #: waits this much for one besides ``warm_load_s`` or ``cold_load_s``, and a
    #: victim's reload is weighed with it. None: a load costs the same on every pod.
    slot_wait_s: float | None = None
    #: Whether a load on a pod waits for a GPU slot, as the caller reads its pods:
    #: ``waits_for_slot`` (the scrape's running and waiting adapters) by default; the
    #: live router passes its own, which counts its requests in flight and the slots of
    #: unloaded names' idle entries too.
    slot_taken: Callable[[PodLike], bool] = waits_for_slot


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
    #: Warm-ups to send to the pod before the request, in this order (lorafleet's
    #: classes): each refreshes an adapter's LRU place so the load evicts a lower class.
    refresh: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.pod_id is not None


# --- the rules every router applies first -------------------------------------------


def holds(pod: PodLike, adapter: str) -> bool:
    """Whether ``pod`` has the adapter on a GPU slot or is loading it."""
    return adapter in pod.gpu_adapters or adapter in pod.loading


def gate(
    ctx: RoutingContext, pods: Sequence[PodLike] | None = None
) -> tuple[list[PodLike], RouteDecision | None]:
    """Healthy candidates among ``pods`` (``ctx.pods`` unless given), or the decision
    that ends routing early.

    Above ``reject_kv_usage`` on every healthy pod: reject. Above ``no_load_kv_usage``
    on every healthy pod: only pods already holding the adapter may take it, and with
    none the request waits rather than forcing a load (the soft and critical tiers).
    """
    healthy = []
    least_kv = 2.0
    for pod in ctx.pods if pods is None else pods:
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
        holders = [pod for pod in healthy if holds(pod, ctx.adapter)]
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


def prelude(
    ctx: RoutingContext, pods: Sequence[PodLike] | None = None
) -> tuple[list[PodLike], RouteDecision | None]:
    """``gate``, then ``coalesce``: the candidates among ``pods`` (``ctx.pods`` unless
    given), or the decision that ends routing."""
    candidates, early = gate(ctx, pods)
    if early is not None:
        return candidates, early
    return candidates, coalesce(ctx, candidates)


# --- the costs affinity routers weigh ------------------------------------------------


def load_of(pod: PodLike) -> int:
    return pod.queue_depth + pod.running


def predicted_delay_s(pod: PodLike, ctx: RoutingContext) -> float:
    """Queue delay a new request would see: the queue ahead, plus what is left (half,
    on average) of a load in progress."""
    delay = pod.queue_depth * ctx.per_request_s
    if pod.loading and ctx.adapter not in pod.loading:
        delay += 0.5 * ctx.warm_load_s
    return delay


def slot_wait_s(pod: PodLike, ctx: RoutingContext) -> float:
    """The wait for a slot a load on ``pod`` adds (``RoutingContext.slot_wait_s``): 0
    without one, or where the load can take a slot now."""
    wait = ctx.slot_wait_s
    return 0.0 if wait is None or not ctx.slot_taken(pod) else wait


def load_penalty_s(pod: PodLike, ctx: RoutingContext) -> float:
    """What a load of the adapter on ``pod`` costs: 0 when it is on a GPU slot there."""
    if holds(pod, ctx.adapter):
        return 0.0
    load_s = ctx.warm_load_s if ctx.adapter in pod.registered else ctx.cold_load_s
    return (load_s + slot_wait_s(pod, ctx)) * ctx.load_penalty_factor
