"""The placement problem as the solver sees it: the typed inputs, one pool at a time.

Owns the solver's input values: ``Demand`` per adapter, one ``PoolProblem`` per pool,
with identical pods grouped into ``PodClass``es (the solver counts replicas per class,
not per pod) and every adapter a ``Candidate`` with its costs already in milliseconds.
Decides nothing and does no IO; ``placement.solver.problem_build`` builds these values
from catalog, fleet and demand, and the solver (``placement.solver.solve``) decides.
This module must not import the builder (it imports this one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from types import MappingProxyType

from placement.domain import AdapterClass, AdapterId, PodId, PoolId, Tier
from placement.settings import Settings
from policies.tiering import TierProposal


@dataclass(frozen=True, kw_only=True)
class Demand:
    """Forecast traffic of one adapter over the plan's validity, in requests per second."""

    mean_rps: float
    q90_rps: float


@dataclass(frozen=True, kw_only=True)
class PodClass:
    """Ready pods of one pool with identical limits: interchangeable for the solver."""

    key: str
    pods: tuple[PodId, ...]
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    hbm_bytes: int
    host_bytes: int
    capacity_rps: float
    #: GPU slots per pod kept for the dynamic cache (``placement.solver.reserve``);
    #: ``max_loras`` is what is left to plan, the pod's own limit less this.
    reserved_slots: int = 0

    @property
    def size(self) -> int:
        return len(self.pods)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One adapter of a pool with its demand, its costs and its replica rules."""

    name: AdapterId
    size_bytes: int
    rank: int
    mean_rps: float
    q90_rps: float
    #: Delay of one request that finds the adapter warm / cold, in ms.
    warm_miss_ms: float
    cold_miss_ms: float
    #: One-off cost of a warm-to-hot activation and of a storage-to-host fetch, in ms.
    activate_ms: float
    fetch_ms: float
    pinned: bool
    pinned_pods: tuple[PodId, ...]
    #: Replicas a hot adapter takes; ``min_hot > max_hot`` means it cannot be hot.
    min_hot: int
    max_hot: int
    group: str | None
    proposal: TierProposal
    #: What it serves: the solver counts this class's weight of what being hot saves.
    adapter_class: AdapterClass = AdapterClass.PRODUCTION
    #: Its tenant's TTFT SLO as a weight on the same saving (``slo_weight``): above 1
    #: for an SLO tighter than the reference, below 1 for a looser one.
    slo_weight: float = 1.0

    @property
    def can_be_hot(self) -> bool:
        return self.min_hot <= self.max_hot

    @property
    def hot_weight(self) -> float:
        """The share of what a hot replica saves that the solver counts: class times SLO."""
        return self.adapter_class.weight * self.slo_weight

    @property
    def priority_discount_ms_per_s(self) -> float:
        """What the solver does not count of the delay a hot replica saves against warm:
        nothing for a production adapter at the reference SLO, most of it for an
        experiment (``AdapterClass.weight``), so that short GPU slots go to production
        adapters first; negative (a bonus) for an SLO tighter than the reference."""
        return (1.0 - self.hot_weight) * self.mean_rps * self.warm_miss_ms


@dataclass(frozen=True, kw_only=True)
class PoolProblem:
    """Everything the solver needs to place the adapters of one pool."""

    pool: PoolId
    classes: tuple[PodClass, ...]
    candidates: tuple[Candidate, ...]
    #: Pairs (adapter, pod) of the placement in force, hot and registered (hot or warm).
    current_hot: frozenset[tuple[AdapterId, PodId]]
    current_registered: frozenset[tuple[AdapterId, PodId]]
    #: At most this many new registrations per pod (pins exempt); None: no limit.
    churn_limit: int | None
    validity_s: float
    imbalance_weight: float
    #: Share of capacity_rps a pod may carry at q90: the configured headroom, or more
    #: when the pool's traffic needs more (then ``overloaded`` says so).
    headroom: float
    #: Pooled forecast q90 traffic of every adapter of the pool, hot or not.
    q90_total_rps: float
    unready_pods: tuple[PodId, ...] = ()
    #: Hysteresis against flapping: an adapter hot now is credited this share of what
    #: being hot saves it, so a challenger must save that much more to take its place
    #: (1 - demote_factor when a placement is in force, else 0).
    stability: float = 0.0
    #: Each ready pod's zone (fleet.yaml ``zone``), for the pods that have one: with two
    #: or more zones, a hot adapter's replicas spread over them (stage 2).
    zones: Mapping[PodId, str] = field(default_factory=lambda: MappingProxyType({}))

    @cached_property
    def zone_names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.zones.values())))

    def zone_cap(self, replicas: int) -> int | None:
        """The most of ``replicas`` hot replicas one zone may hold so that they spread
        evenly over the pool's zones; None when there is nothing to spread (one zone,
        or one replica)."""
        zones = len(self.zone_names)
        if zones < 2 or replicas < 2:
            return None
        return math.ceil(replicas / zones)

    @property
    def carry_rps(self) -> float:
        return sum(cls.capacity_rps * cls.size for cls in self.classes) * self.headroom

    @property
    def overloaded(self) -> bool:
        return self.q90_total_rps > self.carry_rps * (1 - 1e-9) and self.q90_total_rps > 0

    @property
    def pods(self) -> tuple[PodId, ...]:
        return tuple(pod for cls in self.classes for pod in cls.pods)

    @cached_property
    def pod_mean_rps(self) -> float:
        """Forecast mean traffic of the pool per ready pod: what an even spread gives."""
        pods = sum(cls.size for cls in self.classes)
        return sum(c.mean_rps for c in self.candidates) / pods if pods else 0.0

    def class_of(self) -> dict[PodId, PodClass]:
        return {pod: cls for cls in self.classes for pod in cls.pods}


@dataclass(frozen=True, kw_only=True)
class PlacementProblem:
    """One pool problem per pool, plus the adapters no pool can take, with why."""

    pools: tuple[PoolProblem, ...]
    #: Adapters that are cold before solving, with the reason (no pool, no traffic).
    fixed_cold: Mapping[AdapterId, str]
    demand: Mapping[AdapterId, Demand]
    valid_from: datetime
    settings: Settings
    #: Pins that cannot hold whatever the solver does (unknown base model, unknown pod).
    broken_pins: tuple[str, ...] = ()
    fleet_pods: tuple[PodId, ...] = field(default=())

    @property
    def total_mean_rps(self) -> float:
        return sum(d.mean_rps for d in self.demand.values())


Current = Mapping[PodId, Mapping[AdapterId, Tier]]
