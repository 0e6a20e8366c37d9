"""Which pod serves a request: the router's side of ``policies.routing.route_plan``.

The rules themselves are pure and shared with the replay simulator
(``policies/routing.py``): health, memory pressure (no new loads above 0.85 KV use on
every candidate, 503 above 0.95), stampede coalescing (a request for an adapter
loading on a pod goes to that pod), the plan's pods weighted by the plan, bounded
affinity, and consistent hashing with replication 2 for adapters the plan does not
place. This module only finds the request's pool, hands the live ``LivePod`` objects
to the policy as they are (they satisfy its ``PodLike``), and turns the decision into
a ``Choice`` with the ledger's outcome.

Under the plan policy a load's LRU victim is weighed as the replay weighs it
(``VictimWorth``): by the plan's forecast rate of the victim (the plan records the
forecast it was solved from), capped by the rate the router sent it lately
(``Topology.recent``), the victim being the one the pod's ledger (the engine model)
would evict: pins, ghost slots and requests in flight as the engine has them. A plan
without forecast rates weighs no victim. With the catalog's classes
(``adapter_classes``) the victim's worth is scaled by its class, and a load on a full
pod whose victim is of a higher class than an adapter idle beside it names the
warm-ups (``Choice.refresh``) that the proxy sends there first, each a short request
that refreshes its adapter's LRU place (and is applied to the ledger as one).

Under the plan policy the policy sees only the candidates of the pool's index
(``policies.candidates``: the plan's pods or the ring's owners, the pods holding or
loading the adapter, the least-queued few and the least-KV pod), so a decision costs
the same at 8 pods and at 256; ``prefilter=False`` hands it the whole pool (the
benchmark's "before"). The reactive baselines always see the whole pool, as the
systems they stand for do.

With ``RouterSettings.price_slot_wait`` a load on a pod where it can take no GPU slot
(``policies.route_context.waits_for_slot``) costs ``LoadCostSettings.expected_drain_ms``
more (``RoutingContext.slot_wait_s``), as in the replay under vLLM's admission: the
engines drain nothing for a load. "Running" is the last scrape's (vLLM's
``lora_requests_info``, up to a scrape interval old, less the adapters whose request
of the router's there ended since, ``LivePod.ended_since_scrape``) together with the
router's own requests in flight (``LivePod.busy``), and a slot held by an unloaded
name's idle entry (the ledger's vLLM ghost) takes a load now: the policy asks ``slot_taken``
(``RoutingContext.slot_taken``), not the scrape alone.

No IO, no clock, no await.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from placement.domain import AdapterId, Outcome, PodId, PoolId
from placement.residency import Entry
from placement.router.state import LivePod, PoolView, Topology
from placement.settings import LoadCostSettings, RouterSettings
from policies.route_context import waits_for_slot
from policies.routing import (
    HashFallback,
    PodLike,
    RouteDecision,
    RouteReason,
    RoutingContext,
    VictimWorth,
    lru_victim,
    route_epp,
    route_least_loaded,
    route_llmd,
    route_plan,
    route_round_robin,
)

#: The routing policies the router can run; all but ``plan`` are reactive baselines.
POLICIES = ("plan", "round-robin", "least-loaded", "epp", "llm-d")

#: Size assumed for an adapter the catalog does not size (a typical rank-16 adapter).
DEFAULT_ADAPTER_BYTES = 50_000_000


class Reject:
    NO_POD = "no_pod"
    PRESSURE = "pressure"
    PRESSURE_WAIT = "pressure_wait"
    UNKNOWN_MODEL = "unknown_model"


_REJECTS = {
    RouteReason.NO_POD: Reject.NO_POD,
    RouteReason.REJECT: Reject.PRESSURE,
    RouteReason.PRESSURE_WAIT: Reject.PRESSURE_WAIT,
}


@dataclass(frozen=True, slots=True)
class Choice:
    """A pod for the request, or a reason to refuse it."""

    pod: LivePod | None
    outcome: Outcome | None = None
    #: The policy's reason (plan, spill, hash, coalesce, ...) or "base".
    reason: str = ""
    unplanned: bool = False
    reject: str | None = None
    #: Warm-ups to send to ``pod`` before the request, in order (``RouteDecision.refresh``).
    refresh: tuple[AdapterId, ...] = ()


def _ledger_victim(pod: PodLike) -> str | None:
    """What a load on ``pod`` would evict, by its ledger's engine model with the
    router's requests in flight there as busy (as the ledger applies every call); the
    LRU victim for a pod that is not a ``LivePod``."""
    if isinstance(pod, LivePod):
        return pod.ledger.next_victim(pod.busy.keys())
    return lru_victim(pod)


def slot_taken(pod: PodLike) -> bool:
    """Whether a load on ``pod`` waits for a GPU slot as the engine admits it
    (``RoutingContext.slot_taken`` for the live router; a pod that is not a ``LivePod``
    goes by ``waits_for_slot``).

    It waits when no slot is free and every slot's holder has requests: each GPU adapter
    has the router's requests in flight (``LivePod.busy``, current) or is running or
    waiting by the last scrape (``lora_requests_info``, up to a scrape interval old)
    and no request of the router's for it there has ended since
    (``LivePod.ended_since_scrape``: what the scrape saw running is taken for the
    router's own, gone now; requests are often shorter than a scrape interval, and
    counting them made a full pod look taken that was not; with other workers'
    requests on the pod this leans toward a free slot, as the pricing off does);
    and each slot of an unloaded name's entry (the ledger's vLLM ghost, outside
    ``gpu_adapters`` and ``free_slots``) holds one of those requests' entries. An idle
    ghost slot takes a load now: nothing runs on it."""
    if not isinstance(pod, LivePod):
        return waits_for_slot(pod)
    if pod.free_slots > 0:
        return False
    busy = pod.busy
    ghosts = pod.max_loras - pod.free_slots - len(pod.gpu_adapters)
    if ghosts > 0:
        ledger = pod.ledger
        held = 0
        for key in busy:
            if isinstance(key, Entry) and ledger.entry(AdapterId(key.name)) is not key:
                held += 1
        if held < ghosts:
            return False
    running, waiting = pod.running_adapters, pod.waiting_adapters
    ended = pod.ended_since_scrape
    names: set[str] | None = None
    for name in pod.gpu_adapters:
        if (name in running or name in waiting) and name not in ended:
            continue
        if names is None:  # the names of the router's requests in flight, once
            names = {key.name if isinstance(key, Entry) else key for key in busy}
        if name not in names:
            return False
    return True


class Picker:
    """Applies ``route_plan`` to a ``Topology``; caches per-adapter load costs only."""

    def __init__(
        self,
        *,
        settings: RouterSettings,
        load_cost: LoadCostSettings,
        adapter_bytes: Mapping[AdapterId, int] | None = None,
        adapter_classes: Mapping[AdapterId, float] | None = None,
        prefilter: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        #: The router's clock (the one ``LivePod.note_use`` is given): a victim's worth
        #: fades with its idle time on its pod. None: the forecast alone counts.
        self.clock = clock
        self.class_weight: Mapping[str, float] = {}
        self.prefilter = prefilter
        self.load_cost = load_cost
        #: RoutingContext.slot_wait_s: the engines drain nothing for a load
        #: (RouterSettings.price_slot_wait). None: a load costs the same on every pod.
        self.slot_wait_s = load_cost.expected_drain_ms / 1e3 if settings.price_slot_wait else None
        self.adapter_bytes: dict[AdapterId, int] = {}
        self._costs: dict[AdapterId | None, tuple[float, float]] = {}
        self._fallbacks: dict[tuple[int, PoolId], HashFallback] = {}
        #: The victims' worth for the topology it was built for (a new plan, a new one).
        self._victims: tuple[Topology | None, VictimWorth | None] = (None, None)
        self.use_catalog(adapter_bytes or {}, adapter_classes or {})
        self._cursor = 0
        if settings.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {settings.policy!r}; one of {POLICIES}")

    def use_catalog(
        self, adapter_bytes: Mapping[AdapterId, int], adapter_classes: Mapping[AdapterId, float]
    ) -> None:
        """The catalog's sizes and class weights (``AdapterClass.weight``), at the start
        and when the catalog changes; the classes are kept only when some adapter is not
        production (else no class to keep apart)."""
        self.adapter_bytes = dict(adapter_bytes)
        self._costs.clear()
        classes = {str(name): weight for name, weight in adapter_classes.items()}
        self.class_weight = classes if any(weight < 1.0 for weight in classes.values()) else {}
        self._victims = (None, None)

    def pick(
        self, topology: Topology, model: str, *, exclude: frozenset[PodId] = frozenset()
    ) -> Choice:
        pool = topology.pool_of(model)
        if pool is None:
            return Choice(None, reject=Reject.UNKNOWN_MODEL)
        adapter = AdapterId(model)
        weights = topology.weights.get(adapter)
        pods: Sequence[LivePod] = pool.states
        planned = self.settings.policy == "plan" and model != pool.served_model
        if self.prefilter and planned:
            named: Collection[str] = (
                weights.keys()
                if weights
                else pool.ring.replicas(adapter, self.settings.hash_replicas)
            )
            pods = pool.index.candidates(adapter, named)
        if exclude:
            kept = tuple(state for state in pods if state.pod_id not in exclude)
            if len(kept) < len(pods) and pods is not pool.states:
                # The pre-filter's cut was made over the whole pool, and the pods left
                # out (held by a cold-load hold, failed for this request) get few
                # requests, so they tend to be its least-queued few: with them gone the
                # cut may hold no pod while others could load the adapter. Choose among
                # the whole pool less the excluded, as a full scan would.
                kept = tuple(state for state in pool.states if state.pod_id not in exclude)
            pods = kept
        warm_s, cold_s = self._load_costs(adapter)
        slot_wait_s = self.slot_wait_s
        context = RoutingContext(
            adapter=adapter,
            pods=pods,
            warm_load_s=warm_s,
            cold_load_s=cold_s,
            no_load_kv_usage=self.settings.no_load_kv_usage,
            reject_kv_usage=self.settings.reject_kv_usage,
            per_request_s=pool.index.per_request_s or self.settings.per_request_s,
            victims=self._victims_for(topology) if planned else None,
            now_s=self.clock() if planned and self.clock is not None else 0.0,
            slot_wait_s=slot_wait_s,
            # Only the plan policy counts the router's own requests for a slot (the
            # baselines read the scrape alone, as before).
            slot_taken=slot_taken if planned else waits_for_slot,
        )
        if model == pool.served_model:
            return self._decided(topology, route_least_loaded(context), adapter, base=True)
        if self.settings.policy != "plan":
            return self._decided(topology, self._reactive(context), adapter, base=False)
        # Adapters the plan keeps cold go by bounded affinity over the whole pool (the
        # long tail's general pool): a pod holding them, a free slot, or the pod whose
        # least recently used adapter idled longest, so the tail evicts the tail, not the
        # hot set. Adapters absent from the plan are hashed to their two ring owners.
        plan = topology.plan
        cold = weights is None and plan is not None and adapter in plan.adapters
        decision = route_plan(context, weights, fallback=self._fallback(pool), tail=cold)
        choice = self._decided(topology, decision, adapter, base=False)
        if weights is None and choice.pod is not None:
            plan = topology.plan
            unplanned = plan is None or adapter not in plan.adapters
            return Choice(
                choice.pod,
                choice.outcome,
                choice.reason,
                unplanned=unplanned,
                refresh=choice.refresh,
            )
        return choice

    def _victims_for(self, topology: Topology) -> VictimWorth | None:
        """What a load's victim is worth under ``topology``'s plan: its forecast, capped
        by the router's recent rate (None without a plan or its forecast rates)."""
        built_for, victims = self._victims
        if built_for is topology:
            return victims
        forecast = {} if topology.plan is None else topology.plan.forecast_rps()
        victims = None
        if self.class_weight or any(rate > 0.0 for rate in forecast.values()):
            victims = VictimWorth(
                forecast_rps={str(name): rate for name, rate in forecast.items()},
                recent_rps=topology.recent,
                victim_horizon_s=self.settings.victim_horizon_s,
                victim_of=_ledger_victim,
                class_weight=self.class_weight,
                stall_weight=self.settings.load_stall_weight,
            )
        self._victims = (topology, victims)
        return victims

    def _reactive(self, context: RoutingContext) -> RouteDecision:
        """A baseline that ignores the plan (the pods evict by their own LRU)."""
        policy = self.settings.policy
        if policy == "round-robin":
            decision, self._cursor = route_round_robin(context, cursor=self._cursor)
            return decision
        if policy == "epp":
            return route_epp(context)
        if policy == "llm-d":
            return route_llmd(context)
        return route_least_loaded(context)

    def _decided(
        self, topology: Topology, decision: RouteDecision, adapter: AdapterId, *, base: bool
    ) -> Choice:
        if decision.pod_id is None:
            return Choice(None, reason=str(decision.reason), reject=_REJECTS[decision.reason])
        state = topology.pods[PodId(decision.pod_id)]
        if base:
            return Choice(state, None, reason="base")
        outcome = Outcome.COLD_LOAD if adapter in state.loading else state.ledger.classify(adapter)
        refresh = tuple(AdapterId(name) for name in decision.refresh)
        return Choice(state, outcome, reason=str(decision.reason), refresh=refresh)

    def _fallback(self, pool: PoolView) -> HashFallback:
        key = (id(pool.ring), pool.pool)
        fallback = self._fallbacks.get(key)
        if fallback is None:
            if len(self._fallbacks) > 64:
                self._fallbacks.clear()
            fallback = HashFallback(
                ring=pool.ring,
                replicas=self.settings.hash_replicas,
                general_pool=frozenset(state.pod_id for state in pool.states),
            )
            self._fallbacks[key] = fallback
        return fallback

    def _load_costs(self, adapter: AdapterId) -> tuple[float, float]:
        """Seconds to load the adapter from host RAM and from storage, with a busy drain."""
        size = self.adapter_bytes.get(adapter)
        # Sized adapters (the catalog's: a bounded set) are cached by name; every other
        # name shares the default size's costs, so random names add no entries.
        key = adapter if size is not None else None
        costs = self._costs.get(key)
        if costs is None:
            drain_ms = self.load_cost.expected_drain_ms
            size_bytes = DEFAULT_ADAPTER_BYTES if size is None else size
            costs = (
                self.load_cost.warm_load_ms(size_bytes, drain_ms=drain_ms) / 1000.0,
                self.load_cost.cold_load_ms(size_bytes, drain_ms=drain_ms) / 1000.0,
            )
            self._costs[key] = costs
        return costs
