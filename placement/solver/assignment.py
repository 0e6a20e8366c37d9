"""One pool's assignment of adapters to pods: the value, its routing weights, its price.

Owns ``Assignment`` (hot and warm pods per adapter, with routing weights), the routing
weights that fill the least loaded replicas first so that the pods of a pool carry
even traffic, the per-pod loads and the capacity check, and ``evaluate``, which prices
any assignment in the solver's one unit (milliseconds of request delay per second):
misses, loads amortised over validity, and load imbalance. It is the yardstick that
compares the solver's plan with its greedy hint. Choosing the pods is
``placement.solver.packing``'s; this module must not import it.

Pure: no IO, no clock; deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from placement.domain import AdapterId, PodId
from placement.solver.problem import PoolProblem

#: Every hot replica keeps this share of an equal split so that each one sees traffic
#: (a replica the router never uses is not kept warm on its GPU by requests).
EQUAL_SHARE_FLOOR = 0.2


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """Pods of every hot and warm adapter of one pool, with routing weights."""

    hot: Mapping[AdapterId, tuple[PodId, ...]]
    warm: Mapping[AdapterId, tuple[PodId, ...]]
    weights: Mapping[AdapterId, Mapping[PodId, float]]


@dataclass(frozen=True, kw_only=True)
class PoolCost:
    """An assignment's price, in ms of request delay per second, by term."""

    miss_ms_per_s: float
    load_ms_per_s: float
    imbalance_ms_per_s: float
    loads: int
    #: Hysteresis: credit for keeping adapters hot that are hot now (not a delay).
    stability_credit_ms_per_s: float = 0.0
    #: Class priority: the uncounted share of hot batch and experiment adapters' saving.
    priority_discount_ms_per_s: float = 0.0

    @property
    def total(self) -> float:
        """The plan's expected delay: misses, loads and imbalance."""
        return self.miss_ms_per_s + self.load_ms_per_s + self.imbalance_ms_per_s

    @property
    def model_total(self) -> float:
        """What the solver minimises: the delay less the stability credit, plus the
        class priority's discount."""
        return self.total - self.stability_credit_ms_per_s + self.priority_discount_ms_per_s


def within_capacity(problem: PoolProblem, assignment: Assignment) -> bool:
    """Whether the pooled q90 of hot traffic on every pod is within capacity and headroom."""
    class_of = problem.class_of()
    loads = pod_q90_loads(problem, assignment)
    return all(
        rps <= class_of[pod].capacity_rps * problem.headroom + 1e-9 for pod, rps in loads.items()
    )


def pod_q90_loads(problem: PoolProblem, assignment: Assignment) -> dict[PodId, float]:
    """Per pod, the q90 of its hot traffic: means add, and (adapters being independent)
    so do the squares of their q90-minus-mean spreads."""
    by_name = {c.name: c for c in problem.candidates}
    mean = dict.fromkeys(problem.pods, 0.0)
    spread_sq = dict.fromkeys(problem.pods, 0.0)
    for adapter, shares in assignment.weights.items():
        c = by_name[adapter]
        for pod, share in shares.items():
            mean[pod] += share * c.mean_rps
            spread_sq[pod] += (share * max(0.0, c.q90_rps - c.mean_rps)) ** 2
    return {pod: mean[pod] + math.sqrt(spread_sq[pod]) for pod in problem.pods}


def routing_weights(
    problem: PoolProblem, hot: Mapping[AdapterId, tuple[PodId, ...]]
) -> dict[AdapterId, Mapping[PodId, float]]:
    """Shares of each hot adapter's traffic per replica, filling the least loaded first."""
    rates = {c.name: c.mean_rps for c in problem.candidates}
    load: dict[PodId, float] = dict.fromkeys(problem.pods, 0.0)
    weights: dict[AdapterId, Mapping[PodId, float]] = {}
    order = sorted(hot, key=lambda a: (len(hot[a]), -rates.get(a, 0.0), a))
    for adapter in order:
        pods = hot[adapter]
        rate = rates.get(adapter, 0.0)
        filled = _water_fill([load[p] for p in pods], rate)
        equal = 1.0 / len(pods)
        shares = {
            pod: EQUAL_SHARE_FLOOR * equal + (1 - EQUAL_SHARE_FLOOR) * (f / rate if rate else equal)
            for pod, f in zip(pods, filled, strict=True)
        }
        for pod, share in shares.items():
            load[pod] += share * rate
        weights[adapter] = MappingProxyType(shares)
    return weights


def _water_fill(levels: list[float], amount: float) -> list[float]:
    """Amounts to add to each level so that the lowest rise together by ``amount`` in all."""
    if amount <= 0:
        return [0.0] * len(levels)
    ordered = sorted(levels)
    top = ordered[0] + amount
    for k in range(1, len(ordered) + 1):
        top = (sum(ordered[:k]) + amount) / k
        if k == len(ordered) or top <= ordered[k]:
            break
    return [max(0.0, top - level) for level in levels]


def pod_loads(problem: PoolProblem, assignment: Assignment) -> dict[PodId, float]:
    """Mean hot traffic routed to each pod, in rps."""
    by_name = {c.name: c for c in problem.candidates}
    load = dict.fromkeys(problem.pods, 0.0)
    for adapter, shares in assignment.weights.items():
        candidate = by_name[adapter]
        rate = candidate.mean_rps
        for pod, share in shares.items():
            load[pod] += share * rate
    return load


def evaluate(problem: PoolProblem, assignment: Assignment) -> PoolCost:
    """Price an assignment: misses by tier, new loads over validity, and imbalance.

    Imbalance is the traffic of each hot adapter that its replicas cannot carry without
    rising above the pool's mean pod load: too few replicas make a hot spot whatever
    the router does. How evenly the rest spreads is the routing weights' job.
    """
    miss = 0.0
    load_ms = 0.0
    loads = 0
    for candidate in problem.candidates:
        hot_pods = assignment.hot.get(candidate.name, ())
        warm_pods = assignment.warm.get(candidate.name, ())
        if not hot_pods:
            miss_ms = candidate.warm_miss_ms if warm_pods else candidate.cold_miss_ms
            miss += candidate.mean_rps * miss_ms
        for pod in hot_pods:
            if (candidate.name, pod) not in problem.current_hot:
                load_ms += candidate.activate_ms
        for pod in (*hot_pods, *warm_pods):
            if (candidate.name, pod) not in problem.current_registered:
                load_ms += candidate.fetch_ms
                loads += 1
    mean_rps = problem.pod_mean_rps
    imbalance = sum(
        max(0.0, c.mean_rps - mean_rps * len(assignment.hot[c.name]))
        for c in problem.candidates
        if c.name in assignment.hot
    )
    hot_now = {a for a, _ in problem.current_hot}
    credit = sum(
        problem.stability * c.mean_rps * c.warm_miss_ms
        for c in problem.candidates
        if c.name in hot_now and c.name in assignment.hot
    )
    return PoolCost(
        miss_ms_per_s=miss,
        load_ms_per_s=load_ms / problem.validity_s,
        imbalance_ms_per_s=imbalance * problem.imbalance_weight,
        loads=loads,
        stability_credit_ms_per_s=credit,
        priority_discount_ms_per_s=sum(
            c.priority_discount_ms_per_s for c in problem.candidates if c.name in assignment.hot
        ),
    )
