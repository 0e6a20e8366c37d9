"""What a solved placement says: the solution values and the plan's parts built from them.

Owns ``Solution`` (per pool: the assignment, its cost and the solver's report) and
turns it into the pieces of a ``Plan``: per-pod sets with bytes and expected traffic,
per-adapter tiers, routing weights and forecast rates, the preloads the plan needs,
predicted hit rates and one line of why per adapter, assembled by ``assemble_plan``
(which ``placement.solver.solve.extract_plan`` calls).

Pure: no IO, no clock.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from placement.domain import AdapterClass, AdapterId, PodId, Tier
from placement.plan import AdapterPlan, Plan, PodPlan, Preload, SolverReport
from placement.solver.assignment import Assignment, PoolCost, pod_loads
from placement.solver.problem import Candidate, PlacementProblem, PoolProblem


@dataclass(frozen=True, kw_only=True)
class PoolSolution:
    problem: PoolProblem
    assignment: Assignment
    cost: PoolCost
    report: SolverReport
    #: Which plan won: "solver" or "greedy".
    source: str
    #: How far stage 1's bound was above the plan's cost beyond rounding (ms/s): an
    #: invalid cut; the report's bound is then the plan's cost. 0 when valid.
    bound_excess: float = 0.0
    #: Stage 1's own counts priced on pool totals (ms/s), None when it found none: the
    #: gap is this less the bound (the most more stage-1 time could raise it) plus the
    #: plan less this (per-pod packing, which the bound relaxes).
    relaxed_ms_per_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Solution:
    pools: tuple[PoolSolution, ...]
    report: SolverReport
    notes: tuple[str, ...] = field(default=())


def inputs_digest(problem: PlacementProblem) -> str:
    """A stable digest of everything the plan was solved from."""
    text = repr((problem.pools, sorted(problem.fixed_cold.items()), problem.valid_from))
    return hashlib.sha256(text.encode()).hexdigest()


def pod_plans(solution: PoolSolution) -> dict[PodId, PodPlan]:
    problem, assignment = solution.problem, solution.assignment
    by_name = {c.name: c for c in problem.candidates}
    loads = pod_loads(problem, assignment)
    hot_rps = sum(by_name[a].mean_rps for a in assignment.hot)
    cold_rps = sum(c.mean_rps for c in problem.candidates) - hot_rps
    spread = cold_rps / max(1, len(problem.pods))
    class_of = problem.class_of()
    plans = {}
    for pod in problem.pods:
        hot = sorted(a for a, held in assignment.hot.items() if pod in held)
        warm = sorted(a for a, held in assignment.warm.items() if pod in held)
        plans[pod] = PodPlan(
            hot=tuple(hot),
            warm=tuple(warm),
            pinned=tuple(a for a in hot if by_name[a].pinned),
            hbm_bytes_used=sum(by_name[a].size_bytes for a in hot),
            host_bytes_used=sum(by_name[a].size_bytes for a in (*hot, *warm)),
            expected_rps=loads[pod] + spread,
            reserved_slots=class_of[pod].reserved_slots,
        )
    return plans


def adapter_plans(solution: PoolSolution) -> dict[AdapterId, AdapterPlan]:
    assignment = solution.assignment
    plans = {}
    for c in solution.problem.candidates:
        if c.name in assignment.hot:
            plans[c.name] = AdapterPlan(tier=Tier.HOT, pods=assignment.weights[c.name])
        elif c.name in assignment.warm:
            pods = assignment.warm[c.name]
            weights = MappingProxyType(dict.fromkeys(pods, 1.0 / len(pods)))
            plans[c.name] = AdapterPlan(tier=Tier.WARM, pods=weights)
        else:
            plans[c.name] = AdapterPlan(tier=Tier.COLD)
    return plans


def preloads_of(solution: PoolSolution, *, at: datetime) -> list[Preload]:
    problem, assignment = solution.problem, solution.assignment
    rates = {c.name: c.mean_rps for c in problem.candidates}
    preloads = []
    for tier, held in ((Tier.HOT, assignment.hot), (Tier.WARM, assignment.warm)):
        for adapter, pods in held.items():
            current = problem.current_hot if tier is Tier.HOT else problem.current_registered
            for pod in pods:
                if (adapter, pod) not in current:
                    reason = f"{tier.value}: forecast {rates[adapter]:.4g} rps"
                    preloads.append(Preload(at=at, pod=pod, adapter=adapter, reason=reason))
    return preloads


def predicted(problem: PlacementProblem, solution: Solution) -> dict[str, float]:
    """Hit rates by tier (shares of forecast requests) and the expected delay."""
    total = problem.total_mean_rps
    hot = sum(
        c.mean_rps
        for s in solution.pools
        for c in s.problem.candidates
        if c.name in s.assignment.hot
    )
    warm = sum(
        c.mean_rps
        for s in solution.pools
        for c in s.problem.candidates
        if c.name in s.assignment.warm
    )
    miss = sum(s.cost.miss_ms_per_s for s in solution.pools)
    unplaced = sum(problem.demand[a].mean_rps for a in problem.fixed_cold)
    cold_ms = problem.settings.load_cost.cold_load_ms(0)
    return {
        "gpu_hit_rate": hot / total if total > 0 else 1.0,
        "cpu_hit_rate": warm / total if total > 0 else 0.0,
        "cold_rate": (total - hot - warm) / total if total > 0 else 0.0,
        "expected_delay_ms": (miss + unplaced * cold_ms) / total if total > 0 else 0.0,
        "objective_ms_per_s": solution.report.objective,
        "loads": float(sum(s.cost.loads for s in solution.pools)),
        "forecast_rps": total,
        # Share of capacity_rps the busiest short pool runs at q90 (0 when none is short).
        "capacity_overload": max(
            (p.problem.headroom for p in solution.pools if p.problem.overloaded), default=0.0
        ),
    }


def describe(solution: PoolSolution, *, total_rps: float) -> dict[AdapterId, str]:
    """One line per adapter saying what the plan does with it and why."""
    assignment = solution.assignment
    lines = {}
    for c in solution.problem.candidates:
        share = c.mean_rps / total_rps if total_rps > 0 else 0.0
        traffic = f"{c.mean_rps:.4g} rps ({share:.1%} of traffic, q90 {c.q90_rps:.4g})"
        if c.name in assignment.hot:
            n = len(assignment.hot[c.name])
            pin = "pinned; " if c.pinned else _class_note(c)
            lines[c.name] = (
                f"hot on {n} pod{'s' if n > 1 else ''}: {pin}{traffic}; at least {c.min_hot} "
                f"replica{'s' if c.min_hot > 1 else ''}; saves {c.mean_rps * c.warm_miss_ms:.3g}"
                f" ms/s against warm; {_zone_note(solution.problem, assignment.hot[c.name])}"
                f"tiering: {c.proposal.reason}"
            )
        elif c.name in assignment.warm:
            lines[c.name] = (
                f"warm: {traffic}; saves {c.mean_rps * (c.cold_miss_ms - c.warm_miss_ms):.3g} "
                f"ms/s against cold; {_not_hot(c)}; tiering: {c.proposal.reason}"
            )
        else:
            lines[c.name] = f"cold: {traffic}; {_not_hot(c)}; tiering: {c.proposal.reason}"
    return lines


def _zone_note(problem: PoolProblem, pods: tuple[PodId, ...]) -> str:
    """Where several replicas sit when the pool has zones: spread, or why not."""
    cap = problem.zone_cap(len(pods))
    if cap is None:
        return ""
    per_zone = Counter(problem.zones.get(pod, "no zone") for pod in pods)
    listed = ", ".join(f"{zone} ({n})" for zone, n in sorted(per_zone.items()))
    if max(per_zone.values()) <= cap:
        return f"replicas span zones {listed}; "
    return (
        f"replicas in zones {listed}, not spread over the pool's zones "
        f"{', '.join(problem.zone_names)}: the other zones' pods had no room (GPU slots, "
        "bytes, q90 capacity or churn) or hold its pins; "
    )


def _class_note(c: Candidate) -> str:
    note = ""
    if c.adapter_class is not AdapterClass.PRODUCTION:
        note = f"class {c.adapter_class.value} (counted at {c.adapter_class.weight:.0%}); "
    return note + _slo_note(c)


def _slo_note(c: Candidate) -> str:
    if c.slo_weight == 1.0:
        return ""
    return f"its tenant's TTFT SLO counts its GPU saving at {c.slo_weight:.0%}; "


def _not_hot(c: Candidate) -> str:
    if c.can_be_hot and c.adapter_class is not AdapterClass.PRODUCTION:
        return (
            f"class {c.adapter_class.value}: GPU slots go to production adapters first, "
            f"and its saving counts at {c.adapter_class.weight:.0%}"
        )
    if not c.can_be_hot:
        return (
            f"cannot be hot: needs {c.min_hot} replicas (min_replicas, traffic share or q90 "
            f"against pod capacity) and at most {c.max_hot} are allowed (max_replicas, ready "
            "pods): raise max_replicas or capacity_rps"
        )
    if c.can_be_hot and c.slo_weight < 1.0:
        return (
            f"a loose TTFT SLO counts its GPU saving at {c.slo_weight:.0%}: GPU slots went "
            "to adapters with tighter SLOs or more delay saved per slot"
        )
    return "GPU slots went to adapters that save more delay per slot"


def assemble_plan(problem: PlacementProblem, solution: Solution, *, created_at: datetime) -> Plan:
    """The plan of a solution: pods' sets, adapters' tiers and weights, preloads, why."""
    pods: dict[PodId, PodPlan] = {}
    adapters: dict[AdapterId, AdapterPlan] = {}
    preloads: list[Preload] = []
    why: dict[AdapterId, str] = {}
    lead = timedelta(seconds=problem.settings.forecast.preload_lead_s)
    for pool_solution in solution.pools:
        pods.update(pod_plans(pool_solution))
        adapters.update(adapter_plans(pool_solution))
        why.update(describe(pool_solution, total_rps=problem.total_mean_rps))
        preloads.extend(preloads_of(pool_solution, at=problem.valid_from - lead))
    for name, reason in problem.fixed_cold.items():
        adapters[name] = AdapterPlan(tier=Tier.COLD)
        why[name] = f"cold: {reason}"
    for name, rate in problem.demand.items():  # the forecast solved from, for the router
        if name in adapters:
            adapters[name] = replace(adapters[name], mean_rps=rate.mean_rps, q90_rps=rate.q90_rps)
    digest = inputs_digest(problem)
    valid_until = problem.valid_from + timedelta(seconds=problem.settings.planner.validity_s)
    return Plan(
        id=f"plan-{problem.valid_from.strftime('%Y%m%dT%H%M%SZ')}-{digest[:10]}",
        inputs_digest=digest,
        created_at=created_at,
        valid_from=problem.valid_from,
        valid_until=valid_until,
        pods=MappingProxyType(pods),
        adapters=MappingProxyType(adapters),
        preloads=tuple(sorted(preloads, key=lambda p: (p.at, p.pod, p.adapter))),
        predicted=MappingProxyType(predicted(problem, solution)),
        solver=solution.report,
        why=MappingProxyType(why),
    )
