"""The policies a replay compares, as routers the engine asks per request.

Reactive baselines (``round-robin``, ``least-loaded``, ``epp``, ``llm-d``, ``hash``,
``bounded``) call the pure scorers of ``policies.routing`` on the engine's live pods.
``lorafleet`` replans every ``plan_interval_s`` (and early when unplanned demand
appears) from the history seen so far, preloads the plan's hot sets, protects them
from eviction and routes by the plan's weights with bounded affinity; ``oracle`` does
the same from the true future demand with Belady eviction.

Coalescing: the seed's EPP does not know a pod is loading (the stampede), nor do the
least-loaded and llm-d baselines; hash, bounded, lorafleet and oracle coalesce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.planning import (
    Forecaster,
    History,
    Planner,
    PlanPod,
    PlanRequest,
)
from placement.sim.pods import SimPod
from policies.eviction import EvictionPolicy
from policies.hashing import build_ring
from policies.routing import (
    HashFallback,
    RouteDecision,
    RoutingContext,
    route_bounded,
    route_epp,
    route_hash,
    route_least_loaded,
    route_llmd,
    route_plan,
    route_round_robin,
)

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


def costs_for(engine: FleetReplay, settings: Settings) -> Costs:
    workload, sim, cost = engine.workload, settings.sim, settings.load_cost
    count = max(1, len(workload))
    mean_prompt = sum(workload.prompt_tokens) / count
    mean_output = sum(workload.output_tokens) / count
    service_s = (
        mean_prompt * sim.prefill_ms_per_token + mean_output * sim.decode_ms_per_step
    ) / 1e3
    sizes = sorted(workload.size_bytes.values()) or [0]
    size = sizes[len(sizes) // 2]
    return Costs(
        per_request_s=service_s / sim.max_num_seqs,
        warm_load_s=cost.warm_load_ms(size, drain_ms=cost.expected_drain_ms) / 1e3,
        cold_load_s=cost.cold_load_ms(size, drain_ms=cost.expected_drain_ms) / 1e3,
        no_load_kv_usage=settings.router.no_load_kv_usage,
        reject_kv_usage=settings.router.reject_kv_usage,
    )


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
        self, name: str, engine: FleetReplay, settings: Settings, eviction: EvictionPolicy
    ):
        self.name = name
        self.eviction = eviction
        self.pods: list[SimPod] = engine.pods
        self.costs = costs_for(engine, settings)
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
        )


class ReactiveRouter(_Base):
    """One of the reactive baselines; it never plans."""

    def __init__(
        self, name: str, engine: FleetReplay, settings: Settings, eviction: EvictionPolicy
    ):
        super().__init__(name, engine, settings, eviction)
        self.cursor = 0
        pod_ids = [pod.pod_id for pod in self.pods]
        # Seed 001: a general pool (one pod in eight) takes the long tail.
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

    def plan(self, now_s: float, engine: FleetReplay) -> dict[str, frozenset[str]] | None:
        return None


class PlannedRouter(_Base):
    """``lorafleet`` (forecast from history) or ``oracle`` (the true future)."""

    def __init__(
        self,
        name: str,
        engine: FleetReplay,
        settings: Settings,
        eviction: EvictionPolicy,
        *,
        forecaster: Forecaster,
        planner: Planner,
    ) -> None:
        super().__init__(name, engine, settings, eviction)
        self.settings = settings
        self.forecaster = forecaster
        self.planner = planner
        self.history = History()
        self.weights: dict[str, dict[str, float]] = {}
        pod_ids = [pod.pod_id for pod in self.pods]
        # Unplanned adapters: bounded affinity over every pod (the general pool is the
        # whole fleet; the plan's protected slots keep the hot set safe from them).
        self.fallback = HashFallback(
            ring=build_ring(pod_ids),
            replicas=settings.router.hash_replicas,
            general_pool=frozenset(pod_ids),
        )
        self.known: frozenset[str] = frozenset()
        self.unplanned = DecayedCounts(settings.sim.rate_window_s)
        self.last_plan_s = -math.inf
        self.plan_sources: dict[str, int] = {}

    def route(self, adapter: str, now_s: float) -> RouteDecision:
        ctx = self.context(adapter, now_s)
        return route_plan(ctx, self.weights.get(adapter), fallback=self.fallback, tail=True)

    def observe(self, adapter: str, now_s: float) -> bool:
        self.history.add(adapter, now_s)
        if adapter in self.known:
            return False
        sim = self.settings.sim
        seen = self.unplanned.add(adapter, now_s)
        return (
            seen >= sim.event_replan_requests
            and now_s - self.last_plan_s >= sim.event_replan_min_gap_s
        )

    def plan(self, now_s: float, engine: FleetReplay) -> dict[str, frozenset[str]] | None:
        sim = self.settings.sim
        rates = self.forecaster(self.history, now_s, sim.plan_horizon_s)
        request = PlanRequest(
            now_s=now_s,
            horizon_s=sim.plan_horizon_s,
            rates=rates,
            pods=[
                PlanPod(
                    pod_id=spec.pod_id, max_loras=spec.max_loras, capacity_rps=spec.capacity_rps
                )
                for spec in engine.specs
            ],
            current={pod.pod_id: frozenset(pod.gpu_adapters) for pod in self.pods},
            size_bytes=engine.workload.size_bytes,
            tail_slots=sim.tail_slots,
            capacity_headroom=self.settings.planner.capacity_headroom,
            hot_min_rps=sim.plan_hot_min_rps,
        )
        engine.forecast_rps = dict(rates)
        plan = self.planner(request)
        self.known = frozenset(adapter for adapter, rate in rates.items() if rate > 0.0)
        self.weights = {adapter: dict(pods) for adapter, pods in plan.weights.items()}
        self.unplanned = DecayedCounts(sim.rate_window_s)
        self.last_plan_s = now_s
        self.plan_sources[plan.source] = self.plan_sources.get(plan.source, 0) + 1
        return dict(plan.hot)
