"""Why a placement is impossible, in words a person can act on.

Everything in a plan is optional except what operators order: pins (with their
replica minimums) and the capacity the forecast traffic needs. So infeasibility is
explained first by arithmetic over those orders, per pool ("pins need 6 GPU slots in
pool llama-70b; its pods have 4 each and 1 pod is ready"), and when no sum shows it,
by solving again without one constraint family at a time and naming the family whose
removal makes a plan exist.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from ortools.sat.python import cp_model

from placement.domain import AdapterId, PodId
from placement.solver.assignment import Assignment
from placement.solver.counts import FAMILIES, build_model
from placement.solver.greedy import Counts, hot_eligible, named_pins_per_class
from placement.solver.packing import assign_pods
from placement.solver.problem import Candidate, PlacementProblem, PodClass, PoolProblem

_FAMILY_WORDS = {
    "pins": "the pins",
    "replication": "the replica minimums (min_replicas, traffic share, capacity)",
    "churn": "the churn limit (max_loads_per_pod)",
}


def gib(size_bytes: float) -> str:
    """Bytes in the unit a person reads, e.g. ``3.2 GiB`` or ``512 MiB``."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= factor:
            return f"{size_bytes / factor:.3g} {unit}"
    return f"{int(size_bytes)} B"


def _pods_phrase(classes: tuple[PodClass, ...], per_pod: Callable[[PodClass], str]) -> str:
    ready = sum(cls.size for cls in classes)
    ready_words = f"{ready} pod is ready" if ready == 1 else f"{ready} pods are ready"
    if not classes:
        return "no pod is ready"
    values = sorted({per_pod(cls) for cls in classes})
    return f"its pods have {' or '.join(values)} each and {ready_words}"


def quick_reasons(problem: PlacementProblem) -> list[str]:
    """Every reason found by arithmetic, across all pools; empty when none shows."""
    reasons = list(problem.broken_pins)
    for pool in problem.pools:
        reasons.extend(_pinned_adapter_reasons(pool))
        reasons.extend(_named_pod_reasons(pool))
        reasons.extend(_pin_total_reasons(pool))
    return reasons


def capacity_notes(problem: PlacementProblem, *, configured: float) -> list[str]:
    """Pools whose forecast q90 traffic exceeds their capacity with headroom."""
    notes = []
    for pool in problem.pools:
        if not pool.overloaded:
            continue
        carry = sum(cls.capacity_rps * cls.size for cls in pool.classes) * configured
        per_pod = _pods_phrase(pool.classes, lambda c: f"{c.capacity_rps:g} rps")
        notes.append(
            f"forecast q90 traffic of pool {pool.pool} is {pool.q90_total_rps:.4g} rps; "
            f"{per_pod}, which carry {carry:.4g} rps at {configured:.0%} headroom: the plan "
            f"spreads it at {pool.headroom:.0%} of capacity; add pods or raise capacity_rps"
        )
    return notes


def _pinned_adapter_reasons(pool: PoolProblem) -> list[str]:
    reasons = []
    pods = sum(cls.size for cls in pool.classes)
    for c in (c for c in pool.candidates if c.pinned):
        if not any(hot_eligible(c, cls) for cls in pool.classes):
            reasons.append(_why_not_eligible(c, pool))
        elif c.min_hot > c.max_hot:
            reasons.append(
                f"pinned adapter {c.name} needs {c.min_hot} replicas (min_replicas, named pods "
                f"or q90 {c.q90_rps:.4g} rps against capacity) but at most {c.max_hot} are "
                f"allowed in pool {pool.pool} ({pods} ready pods): lower its replicas or add pods"
            )
    return reasons


def _why_not_eligible(c: Candidate, pool: PoolProblem) -> str:
    if not pool.classes:
        return f"pinned adapter {c.name}: pool {pool.pool} has no ready pod"
    top_rank = max(cls.max_lora_rank for cls in pool.classes)
    if c.rank > top_rank:
        return (
            f"pinned adapter {c.name} has rank {c.rank}; pool {pool.pool} accepts rank at "
            f"most {top_rank}: raise max_lora_rank or unpin it"
        )
    top_hbm = max(cls.hbm_bytes for cls in pool.classes)
    return (
        f"pinned adapter {c.name} takes {gib(c.size_bytes)}; pods of pool {pool.pool} hold at "
        f"most {gib(top_hbm)} of adapters on the GPU: raise hbm_adapter_bytes or unpin it"
    )


def _named_pod_reasons(pool: PoolProblem) -> list[str]:
    class_of = pool.class_of()
    named: dict[PodId, list[Candidate]] = {}
    for c in pool.candidates:
        for pod in c.pinned_pods:
            if pod in class_of:
                named.setdefault(pod, []).append(c)
    reasons = []
    for pod, adapters in sorted(named.items()):
        cls = class_of[pod]
        if len(adapters) > cls.max_loras:
            reasons.append(
                f"pins name pod {pod} for {len(adapters)} adapters; it has {cls.max_loras} "
                "GPU slots (max_loras)"
            )
        size = sum(c.size_bytes for c in adapters)
        if size > cls.hbm_bytes:
            reasons.append(
                f"pins name pod {pod} for {gib(size)} of adapters; it holds "
                f"{gib(cls.hbm_bytes)} on the GPU (hbm_adapter_bytes)"
            )
    return reasons


def _pin_total_reasons(pool: PoolProblem) -> list[str]:
    pinned = [c for c in pool.candidates if c.pinned and c.can_be_hot]
    if not pinned:
        return []
    slots = sum(c.min_hot for c in pinned)
    size = sum(c.min_hot * c.size_bytes for c in pinned)
    have_slots = sum(cls.max_loras * cls.size for cls in pool.classes)
    have_hbm = sum(cls.hbm_bytes * cls.size for cls in pool.classes)
    have_places = sum(cls.max_cpu_loras * cls.size for cls in pool.classes)
    reasons = []
    counted = f" ({len(pinned)} pinned adapters, {slots} replicas in all)"
    if slots > have_slots:
        per_pod = _pods_phrase(pool.classes, lambda c: str(c.max_loras))
        reasons.append(f"pins need {slots} GPU slots in pool {pool.pool}; {per_pod}{counted}")
    if slots > have_places:
        per_pod = _pods_phrase(pool.classes, lambda c: str(c.max_cpu_loras))
        reasons.append(
            f"pins need {slots} host cache places in pool {pool.pool}; {per_pod}{counted}"
        )
    if size > have_hbm:
        per_pod = _pods_phrase(pool.classes, lambda c: gib(c.hbm_bytes))
        reasons.append(
            f"pins need {gib(size)} of GPU adapter memory in pool {pool.pool}; {per_pod}{counted}"
        )
    return reasons


def explain_by_relaxing(pool: PoolProblem, *, time_limit_s: float) -> list[str]:
    """Name the constraint family whose removal alone makes the pool feasible; or, when
    pool totals hold and only whole pods do not, the pin that does not pack."""
    if _feasible(build_model(pool, per_pod=False)[0], time_limit_s=time_limit_s):
        reasons = pin_packing_reasons(pool)
        if reasons:
            return reasons
    reasons = []
    for family in FAMILIES:
        model, _ = build_model(pool, relax=frozenset({family}), per_pod=False)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = time_limit_s
        solver.parameters.num_workers = 1
        if solver.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            reasons.append(
                f"pool {pool.pool}: {_FAMILY_WORDS[family]} cannot all hold within the pods' "
                f"GPU slots and bytes; a plan exists without them: relax them or add pods"
            )
    if not reasons:
        reasons.append(
            f"pool {pool.pool}: no placement holds the pins, replica minimums and churn limit "
            "together, nor any one of them left out: check pins against GPU slots and bytes"
        )
    return reasons


def _feasible(model: cp_model.CpModel, *, time_limit_s: float) -> bool:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    return solver.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def honours_pins(pool: PoolProblem, assignment: Assignment) -> bool:
    """Whether every pinned adapter is hot on its named pods and on enough replicas."""
    for c in pool.candidates:
        if not c.pinned:
            continue
        pods = assignment.hot.get(c.name, ())
        if len(pods) < c.min_hot or not set(c.pinned_pods) <= set(pods):
            return False
    return True


def pin_packing_reasons(pool: PoolProblem) -> list[str]:
    """Name the first pin that cannot be placed pod by pod after the pins before it."""
    named = named_pins_per_class(pool)
    hot: dict[tuple[AdapterId, str], int] = {}
    for c in (c for c in pool.candidates if c.pinned):
        extra = c.min_hot - len(c.pinned_pods)
        for cls in pool.classes:
            key = (c.name, cls.key)
            take = min(extra, cls.size - named.get(key, 0)) if hot_eligible(c, cls) else 0
            hot[key] = named.get(key, 0) + max(0, take)
            extra -= max(0, take)
        if assign_pods(pool, Counts(hot=dict(hot))) is None:
            slots = _pods_phrase(pool.classes, lambda cls: f"{cls.max_loras} slots")
            hbm = sorted({gib(cls.hbm_bytes) for cls in pool.classes})
            return [
                f"pins do not fit pod by pod in pool {pool.pool}: after the pins before it, "
                f"{c.name} ({gib(c.size_bytes)}, {c.min_hot} replicas) finds no {c.min_hot} "
                f"pods with a free GPU slot, room in {' or '.join(hbm)} of GPU adapter memory "
                f"and capacity for {c.q90_rps:.4g} rps at q90; {slots}: pin fewer adapters, "
                "on fewer pods, or add pods"
            ]
    return []
