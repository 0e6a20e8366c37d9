"""The policies a replay compares, as routers the engine asks per request.

Reactive baselines (``round-robin``, ``least-loaded``, ``epp``, ``llm-d``, ``hash``,
``bounded``) call the pure scorers of ``policies.routing`` on the engine's live pods.
``lorafleet`` replans every ``plan_interval_s`` (and early when unplanned demand
appears) from the history seen so far, preloads the planned adapters no pod holds, and
routes by ``route_plan``: bounded affinity, a due load sent to the plan's pods, and
each load's LRU victim weighed by the forecast (fading as it idles there) and by its
class (it cannot
choose the victim: vLLM evicts by LRU and has no pin over HTTP, so it chooses the pod,
and sends the warm-ups that keep a higher class off the victim's place, which the
engine runs as requests); ``oracle`` does the
same from the true future demand on an engine that evicts by Belady and keeps the
plan's whole hot set, a bound (its victim's worth is Belady's victim's: its rate and its
wait to its next request, over the oracle's own horizon, ``victim_horizon``).

The hybrids between the two (``bench/oracle_levers.py``) take ``PlannedRouter``'s
levers one at a time: the plan (its ``planning``), the engine's eviction, the victim's
wait its worth reads (``victim_wait``) and warm-ups that make the LRU victim the idle
adapter used furthest in the future (``warm_to_true_victim``), or the one lorafleet's own
estimate values least (``warm_by_estimate``; measured, not lorafleet's behaviour).

Coalescing: the EPP baseline does not know a pod is loading (the stampede), nor do the
least-loaded and llm-d baselines; hash, bounded, lorafleet and oracle coalesce.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from placement.domain import Action, AdapterId, Catalog, PodId, Tier
from placement.errors import LorafleetError
from placement.forecast.event_preloads import Event
from placement.plan import Plan
from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.events import EventController
from placement.sim.eviction_choice import VictimWait, victim_horizon
from placement.sim.planning import (
    MINUTE_S,
    RECENT_S,
    ReplayHistory,
    ReplayPlanning,
    WindowRates,
    observed_plan,
)
from placement.sim.pods import SimPod
from placement.solver.problem import Demand
from policies.eviction import EvictionPolicy
from policies.hashing import build_ring
from policies.route_context import PodLike
from policies.routing import (
    HashFallback,
    RouteDecision,
    RoutingContext,
    VictimWorth,
    route_bounded,
    route_epp,
    route_hash,
    route_least_loaded,
    route_llmd,
    route_plan,
    route_round_robin,
)
from policies.victims import adapter_worth_s, estimate_refresh, idle_adapters

REACTIVE = ("round-robin", "least-loaded", "epp", "llm-d", "hash", "bounded")
PLANNED = ("lorafleet", "oracle")
POLICIES = REACTIVE + PLANNED
_COALESCING = frozenset({"hash", "bounded", "lorafleet", "oracle"})


@dataclass(frozen=True, kw_only=True)
class Costs:
    """The figures routers weigh, derived once per replay from settings and workload."""

    per_request_s: float
    warm_load_s: float
    cold_load_s: float
    no_load_kv_usage: float
    reject_kv_usage: float
    #: Under vLLM's admission: the wait for a slot a load adds on a pod where it can take
    #: none (``RoutingContext.slot_wait_s``), besides its cost; None under the drain.
    slot_wait_s: float | None = None


def costs_for(replay: FleetReplay, settings: Settings) -> Costs:
    """The routers' figures. A load costs its transfer plus
    ``LoadCostSettings.expected_drain_ms`` on every pod (under vLLM's admission, which
    drains nothing, that figure stands in for the churn of cheaper loads: without it the
    routers thrash, docs/benchmarks.md); under vLLM's admission a load on a pod where it
    can take no GPU slot waits that figure more (``Costs.slot_wait_s``,
    ``policies.route_context.waits_for_slot``), unless ``RouterSettings.price_slot_wait``
    is off, as the live router reads it."""
    workload, sim, cost = replay.workload, settings.sim, settings.load_cost
    count = max(1, len(workload))
    mean_prompt = sum(workload.prompt_tokens) / count
    mean_output = sum(workload.output_tokens) / count
    service_s = (
        mean_prompt * sim.prefill_ms_per_token + mean_output * sim.decode_ms_per_step
    ) / 1e3
    sizes = sorted(workload.size_bytes.values()) or [0]
    size = sizes[len(sizes) // 2]
    cold_s = cost.cold_load_ms(size, drain_ms=cost.expected_drain_ms) / 1e3
    if replay.specs and replay.specs[0].storage_bytes_per_s is not None:  # the pool's storage
        warm_ms = cost.warm_load_ms(size, drain_ms=cost.expected_drain_ms)
        cold_s = (warm_ms + replay.fetch_ms(0, size)) / 1e3
    return Costs(
        per_request_s=service_s / sim.max_num_seqs,
        warm_load_s=cost.warm_load_ms(size, drain_ms=cost.expected_drain_ms) / 1e3,
        cold_load_s=cold_s,
        no_load_kv_usage=settings.router.no_load_kv_usage,
        reject_kv_usage=settings.router.reject_kv_usage,
        slot_wait_s=(
            cost.expected_drain_ms / 1e3
            if sim.load_admission == "vllm" and settings.router.price_slot_wait
            else None
        ),
    )


def class_weights(catalog: Catalog) -> dict[str, float]:
    """Each adapter's class weight (``AdapterClass.weight``) for ``PlannedRouter``; empty
    when every adapter is production (no class to keep apart)."""
    weights = {str(a.name): a.adapter_class.weight for a in catalog.adapters}
    return weights if any(weight < 1.0 for weight in weights.values()) else {}


@dataclass(frozen=True, kw_only=True)
class ClassedPlanning(ReplayPlanning):
    """``ReplayPlanning`` with the catalog's class weights (``class_weights``), which
    ``lorafleet`` routes by when ``RouterSettings.class_priority`` is on."""

    class_weight: Mapping[str, float] = field(default_factory=dict)
    #: Each adapter's class name (``AdapterClass``), for the per-class figures.
    class_of: Mapping[str, str] = field(default_factory=dict)


class DecayedCounts:
    """Per-adapter request counts decaying with time constant ``tau_s`` (rate = count/tau)."""

    def __init__(self, tau_s: float) -> None:
        self.tau_s = tau_s
        self.values: dict[str, tuple[float, float]] = {}

    def add(self, adapter: str, now_s: float) -> float:
        value = self.at(adapter, now_s) + 1.0
        self.values[adapter] = (value, now_s)
        return value

    def at(self, adapter: str, now_s: float) -> float:
        value, then_s = self.values.get(adapter, (0.0, now_s))
        return value * math.exp(-(now_s - then_s) / self.tau_s)


class _Base:
    def __init__(
        self, name: str, replay: FleetReplay, settings: Settings, eviction: EvictionPolicy
    ):
        self.name = name
        self.eviction = eviction
        self.pods: list[SimPod] = replay.pods
        self.costs = costs_for(replay, settings)
        self.coalesce = name in _COALESCING

    def context(self, adapter: str, now_s: float) -> RoutingContext:
        costs = self.costs
        return RoutingContext(
            adapter=adapter,
            pods=self.pods,
            now_s=now_s,
            per_request_s=costs.per_request_s,
            warm_load_s=costs.warm_load_s,
            cold_load_s=costs.cold_load_s,
            no_load_kv_usage=costs.no_load_kv_usage,
            reject_kv_usage=costs.reject_kv_usage,
            coalesce=self.coalesce,
            slot_wait_s=costs.slot_wait_s,
        )


class ReactiveRouter(_Base):
    """One of the reactive baselines; it never plans."""

    def __init__(
        self, name: str, replay: FleetReplay, settings: Settings, eviction: EvictionPolicy
    ):
        super().__init__(name, replay, settings, eviction)
        self.cursor = 0
        pod_ids = [pod.pod_id for pod in self.pods]
        # A general pool (one pod in eight) takes the long tail.
        pool_size = len(pod_ids) // 8 if len(pod_ids) >= 4 else 0
        self.general_pool = frozenset(pod_ids[len(pod_ids) - pool_size :])
        self.ring = build_ring([p for p in pod_ids if p not in self.general_pool] or pod_ids)
        self.replicas = settings.router.hash_replicas
        self.rates = DecayedCounts(settings.sim.rate_window_s)
        self.tail_count = settings.sim.tail_rps * settings.sim.rate_window_s

    def route(self, adapter: str, now_s: float) -> RouteDecision:
        ctx = self.context(adapter, now_s)
        name = self.name
        if name == "epp":
            return route_epp(ctx)
        if name == "llm-d":
            return route_llmd(ctx)
        if name == "least-loaded":
            return route_least_loaded(ctx)
        if name == "bounded":
            return route_bounded(ctx)
        if name == "hash":
            tail = self.rates.at(adapter, now_s) < self.tail_count
            return route_hash(
                ctx, self.ring, replicas=self.replicas, tail=tail, general_pool=self.general_pool
            )
        decision, self.cursor = route_round_robin(ctx, cursor=self.cursor)
        return decision

    def observe(self, adapter: str, now_s: float) -> bool:
        if self.name == "hash":
            self.rates.add(adapter, now_s)
        return False

    def plan(self, now_s: float, replay: FleetReplay) -> dict[str, frozenset[str]] | None:
        return None

    def on_event(self, event: Event, now_s: float, replay: FleetReplay) -> tuple[Action, ...]:
        return ()  # a reactive router learns of demand from requests alone


class PlannedRouter(_Base):
    """``lorafleet`` (forecast from history) or ``oracle`` (the true future).

    Each replan asks the forecaster for the demand of the coming ``plan_horizon_s`` and
    the planner for a ``Plan``; of its hot adapters those forecast at or above
    ``hot_min_rps`` are preloaded on their pods and routed by the plan's weights. A
    plan that fails keeps the last one, as the controller does.
    """

    def __init__(
        self,
        name: str,
        replay: FleetReplay,
        settings: Settings,
        eviction: EvictionPolicy,
        *,
        planning: ReplayPlanning,
        history: ReplayHistory,
        events: EventController | None = None,
        class_weight: Mapping[str, float] | None = None,
        victim_wait: VictimWait | None = None,
        warm_to_true_victim: bool = False,
        warm_by_estimate: str | None = None,
        warm_margin_s: float = 0.0,
    ) -> None:
        super().__init__(name, replay, settings, eviction)
        self.replay = replay
        self.by_id = {pod.pod_id: pod for pod in self.pods}
        #: A lever (None: the engine's own, the idle time under LRU): what the victim's
        #: worth reads as its wait (``FleetReplay.steer_victim_wait``).
        if victim_wait is not None:
            replay.steer_victim_wait(victim_wait, eviction)
        own = VictimWait.NEXT_USE if eviction is EvictionPolicy.BELADY else VictimWait.IDLE
        #: The victim worth's horizon: the oracle's own with the true next use, else lorafleet's.
        self.victim_horizon_s = victim_horizon(settings, victim_wait or own)
        #: A lever: before a load on a full pod, warm up the idle adapters the LRU would
        #: evict ahead of the one used furthest in the future (the truth), on any engine.
        self.warm_to_true_victim = warm_to_true_victim
        #: A lever: before a load on a full pod, warm up the idle adapters the LRU would
        #: evict ahead of the one lorafleet's estimate values least ("worth": the victim
        #: worth's own rule; "recent": the same over the rate of the last minute), when
        #: the estimate's case beats ``warm_margin_s`` (``estimate_refresh``).
        self.warm_by_estimate = warm_by_estimate
        self.warm_margin_s = warm_margin_s
        self.last_minute = (
            WindowRates(history.workload, window_s=MINUTE_S)
            if warm_by_estimate == "recent"
            else None
        )
        #: Each adapter's class weight (the catalog's ``class``, ``AdapterClass.weight``);
        #: None or empty: every adapter production, no class warm-ups.
        self.class_weight: Mapping[str, float] = class_weight or {}
        #: The webhook path (None: events are not delivered to this policy).
        self.events = events
        self.last_plan: Plan | None = None
        self.settings = settings
        self.planning = planning
        self.history = history
        self.weights: dict[str, dict[str, float]] = {}
        self.hot: dict[str, frozenset[str]] = {}
        pod_ids = [pod.pod_id for pod in self.pods]
        # Unplanned adapters: bounded affinity over every pod (the general pool is the
        # whole fleet), which weighs each pod's next LRU victim before loading there.
        self.fallback = HashFallback(
            ring=build_ring(pod_ids),
            replicas=settings.router.hash_replicas,
            general_pool=frozenset(pod_ids),
        )
        self.known: frozenset[str] = frozenset()
        #: The latest forecast's mean rates: what a load's victim is worth.
        self.victims: VictimWorth | None = None
        #: The rates of the last 20 minutes that cap a victim's forecast, read at each
        #: decision as the live router reads its own (``route`` sets the moment).
        self.recent = WindowRates(history.workload, window_s=RECENT_S)
        self.unplanned = DecayedCounts(settings.sim.rate_window_s)
        self.last_plan_s = -math.inf
        #: Plans by how they were reached (the solver's status, or "failed").
        self.plan_sources: dict[str, int] = {}

    def route(self, adapter: str, now_s: float) -> RouteDecision:
        """``route_plan`` with the latest forecast's victims (and the warm-ups it names)."""
        self.recent.now_s = now_s
        ctx = replace(self.context(adapter, now_s), victims=self.victims)
        decision = route_plan(ctx, self.weights.get(adapter), fallback=self.fallback, tail=True)
        if self.warm_to_true_victim and decision.pod_id is not None:
            return self._warm_to_true_victim(decision, adapter)
        if self.warm_by_estimate and decision.pod_id is not None and not decision.refresh:
            return self._warm_by_estimate(decision, ctx)
        return decision

    def _warm_by_estimate(self, decision: RouteDecision, ctx: RoutingContext) -> RouteDecision:
        """``decision`` with the warm-ups ``estimate_refresh`` names on its pod, each idle
        adapter valued by ``adapter_worth_s`` at its own idle time there."""
        assert decision.pod_id is not None
        pod = self.by_id[decision.pod_id]
        victims = self.victims
        if victims is None or ctx.adapter in pod.gpu_adapters or ctx.adapter in pod.loading:
            return decision
        if self.last_minute is not None:
            self.last_minute.now_s = ctx.now_s
            victims = replace(victims, forecast_rps=self.last_minute, recent_rps=None)
        now_s, last_used = ctx.now_s, pod.last_used
        chosen = victims

        def worth_s(name: str) -> float:
            idle_s = max(0.0, now_s - last_used.get(name, 0.0))
            return adapter_worth_s(name, idle_s, ctx, chosen)

        refresh = estimate_refresh(
            pod, worth_s, warmup_s=ctx.per_request_s, margin_s=self.warm_margin_s
        )
        return replace(decision, refresh=refresh) if refresh else decision

    def _warm_to_true_victim(self, decision: RouteDecision, adapter: str) -> RouteDecision:
        """``decision`` with the warm-ups (``RouteDecision.refresh``, in LRU order) of the
        idle adapters less recently used than the one next asked for last, so that the
        LRU evicts Belady's victim: what a router knowing the future could do on vLLM."""
        assert decision.pod_id is not None
        pod = self.by_id[decision.pod_id]
        if pod.free_slots > 0 or adapter in pod.gpu_adapters or adapter in pod.loading:
            return decision
        idle = idle_adapters(pod)
        if len(idle) < 2:
            return decision
        furthest = max(idle, key=self.replay.next_use_s)
        refresh = tuple(idle[: idle.index(furthest)])
        return replace(decision, refresh=refresh) if refresh else decision

    def _engine_victim(self, pod: PodLike) -> str | None:
        return self.replay.engine_victim(self.by_id[pod.pod_id])

    def observe(self, adapter: str, now_s: float) -> bool:
        if adapter in self.known:
            return False
        sim = self.settings.sim
        seen = self.unplanned.add(adapter, now_s)
        return (
            seen >= sim.event_replan_requests
            and now_s - self.last_plan_s >= sim.event_replan_min_gap_s
        )

    def plan(self, now_s: float, replay: FleetReplay) -> dict[str, frozenset[str]] | None:
        sim = self.settings.sim
        moment = self.history.moment(now_s)
        demand = self.planning.forecaster(
            self.history.log_until(now_s), start=moment, duration_s=int(sim.plan_horizon_s)
        )
        replay.forecast_rps = {str(name): entry.mean_rps for name, entry in demand.items()}
        # A victim is worth what both the forecast and the last minutes say
        # (VictimWorth.rate, the live router's rule too), fading as it idles on its
        # pod (victim_worth_s). The last minutes are those before each decision, as the
        # live router counts them: a rate read at the replan stood for 15 minutes, so a
        # session that had ended still protected its adapter.
        self.victims = VictimWorth(
            forecast_rps=replay.forecast_rps,
            recent_rps=self.recent,
            victim_horizon_s=self.victim_horizon_s,
            class_weight=self.class_weight,
            stall_weight=self.settings.router.load_stall_weight,
            # The name whose rate it weighs is the engine's victim, the one whose wait
            # victim_last_used_s gives: Belady's under Belady, not the LRU one.
            victim_of=self._engine_victim if self.eviction is EvictionPolicy.BELADY else None,
        )
        self.known = frozenset(str(name) for name, entry in demand.items() if entry.q90_rps > 0)
        self.unplanned = DecayedCounts(sim.rate_window_s)
        self.last_plan_s = now_s
        held = {pod.pod_id: frozenset(pod.gpu_adapters) for pod in self.pods}
        try:
            plan = self.planning.planner(
                demand,
                fleet=self.planning.fleet,
                valid_from=moment,
                current=observed_plan(held, at=moment),
            )
        except (LorafleetError, ValueError):
            self._count("failed (kept the last plan)")
            return self._preloads()
        self._count(plan.solver.status)
        self.last_plan = plan
        self._follow(plan, demand)
        return self._preloads()

    def on_event(self, event: Event, now_s: float, replay: FleetReplay) -> tuple[Action, ...]:
        """The controller's webhook path: ``event_preloads`` on the engine models' views,
        the latest plan and forecast, as ``Controller.on_event`` runs it."""
        if self.events is None:
            return ()
        return self.events.decide(
            event, self.pods, plan=self.last_plan, busy_rps=replay.forecast_rps, now_s=now_s
        )

    def _preloads(self) -> dict[str, frozenset[str]]:
        """The hot sets to preload. lorafleet preloads only what no pod holds: routing
        keeps a warm pod, so a second copy where the plan put it would only evict (the
        replays measured the copies costing loads). The oracle's engine keeps its whole
        hot set (Belady skips it), so it gets the plan's."""
        if self.name == "oracle":
            return dict(self.hot)
        held = {name for pod in self.pods for name in (*pod.gpu_adapters, *pod.loading)}
        return {pod_id: names - held for pod_id, names in self.hot.items()}

    def _count(self, source: str) -> None:
        self.plan_sources[source] = self.plan_sources.get(source, 0) + 1

    def _follow(self, plan: Plan, demand: Mapping[AdapterId, Demand]) -> None:
        """Protect and route by the plan's hot adapters forecast at ``hot_min_rps`` or more."""
        floor = self.planning.hot_min_rps
        pod_ids = {pod.pod_id for pod in self.pods}
        protected = {
            name
            for name, entry in plan.adapters.items()
            if entry.tier is Tier.HOT
            and (floor <= 0.0 or (name in demand and demand[name].q90_rps >= floor))
        }
        self.hot = {}
        for pod_id in sorted(pod_ids):
            pod_plan = plan.pods.get(PodId(pod_id))
            hot = pod_plan.hot if pod_plan is not None else ()
            self.hot[pod_id] = frozenset(str(name) for name in hot if name in protected)
        self.weights = {}
        for name in protected:
            shares = plan.hot_pods(name)
            kept = {str(pod): share for pod, share in shares.items() if pod in pod_ids}
            if kept:
                self.weights[str(name)] = kept
