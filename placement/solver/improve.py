"""A packed plan improved: GPU slots left free filled with the adapters worth most.

Stage 1 fills pool totals; when single pods cannot take its counts, stage 2 demotes
what does not fit, and some pods keep free slots that no demoted adapter's replicas
could use together. ``top_up`` gives each free slot, best first, to the adapter that
is not hot and saves the most delay there: one replica (adapters whose replica minimum
is one) on a pod with the slot, the GPU and host bytes, the churn room and the q90
capacity for it. It never makes a plan worse by ``evaluate``: only a gain above the
adapter's loads and imbalance is taken.

Pure: no IO, no clock; deterministic (ties break by name).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from placement.domain import AdapterId, PodId
from placement.solver.greedy import hot_eligible
from placement.solver.packing import Assignment
from placement.solver.problem import Candidate, PodClass, PoolProblem


@dataclass
class _Room:
    """What one pod has left under an assignment."""

    slots: int
    hbm_bytes: int
    host_count: int
    host_bytes: int
    loads_left: int
    limit_rps: float
    mean_rps: float = 0.0
    spread_sq: float = 0.0

    def q90_with(self, c: Candidate) -> float:
        spread = max(0.0, c.q90_rps - c.mean_rps)
        return self.mean_rps + c.mean_rps + math.sqrt(self.spread_sq + spread * spread)


def top_up(problem: PoolProblem, assignment: Assignment) -> Assignment:
    """``assignment`` with free GPU slots given to the most valuable adapters not hot."""
    rooms = _rooms(problem, assignment)
    hot = dict(assignment.hot)
    warm = dict(assignment.warm)
    weights = dict(assignment.weights)
    class_of = problem.class_of()
    challengers = sorted(
        _challengers(problem, assignment), key=lambda c: (-_gain(problem, c, warm), c.name)
    )
    for c in challengers:
        pod = _best_pod(problem, c, rooms, warm, class_of)
        if pod is None:
            continue
        room = rooms[pod]
        gain = _gain(problem, c, warm) - _load_ms_per_s(problem, c, pod)
        if gain <= 0:
            continue
        held_warm = warm.pop(c.name, ())
        for other in held_warm:
            if other != pod:
                rooms[other].host_count += 1
                rooms[other].host_bytes += c.size_bytes
        new = (c.name, pod) not in problem.current_registered
        room.slots -= 1
        room.hbm_bytes -= c.size_bytes
        if pod not in held_warm:
            room.host_count -= 1
            room.host_bytes -= c.size_bytes
        if new and not c.pinned:
            room.loads_left -= 1
        room.mean_rps += c.mean_rps
        room.spread_sq += max(0.0, c.q90_rps - c.mean_rps) ** 2
        hot[c.name] = (pod,)
        weights[c.name] = MappingProxyType({pod: 1.0})
    return Assignment(
        hot=MappingProxyType(hot), warm=MappingProxyType(warm), weights=MappingProxyType(weights)
    )


def _challengers(problem: PoolProblem, assignment: Assignment) -> list[Candidate]:
    return [
        c
        for c in problem.candidates
        if c.name not in assignment.hot and c.min_hot == 1 and c.max_hot >= 1 and c.mean_rps > 0
    ]


def _gain(problem: PoolProblem, c: Candidate, warm: dict[AdapterId, tuple[PodId, ...]]) -> float:
    """Delay saved per second by one hot replica, less its imbalance; loads apart."""
    miss_ms = c.warm_miss_ms if c.name in warm else c.cold_miss_ms
    imbalance = max(0.0, c.mean_rps - problem.pod_mean_rps) * problem.imbalance_weight
    hot_now = any(a == c.name for a, _ in problem.current_hot)
    credit = problem.stability * c.mean_rps * c.warm_miss_ms if hot_now else 0.0
    return c.mean_rps * miss_ms - imbalance + credit - c.priority_discount_ms_per_s


def _load_ms_per_s(problem: PoolProblem, c: Candidate, pod: PodId) -> float:
    load_ms = 0.0 if (c.name, pod) in problem.current_hot else c.activate_ms
    if (c.name, pod) not in problem.current_registered:
        load_ms += c.fetch_ms
    return load_ms / problem.validity_s


def _best_pod(
    problem: PoolProblem,
    c: Candidate,
    rooms: dict[PodId, _Room],
    warm: dict[AdapterId, tuple[PodId, ...]],
    class_of: Mapping[PodId, PodClass],
) -> PodId | None:
    """The pod that fits one replica with the most q90 room left after it."""
    best: tuple[float, PodId] | None = None
    held = warm.get(c.name, ())
    for pod, room in rooms.items():
        if not hot_eligible(c, class_of[pod]):
            continue
        registered_here = pod in held
        new = (c.name, pod) not in problem.current_registered
        fits = (
            room.slots >= 1
            and room.hbm_bytes >= c.size_bytes
            and (registered_here or (room.host_count >= 1 and room.host_bytes >= c.size_bytes))
            and (not new or c.pinned or room.loads_left >= 1)
        )
        if not fits:
            continue
        left = room.limit_rps - room.q90_with(c)
        if left < -1e-9:
            continue
        key = (-left + (0.0 if registered_here else 1e-6), pod)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def _rooms(problem: PoolProblem, assignment: Assignment) -> dict[PodId, _Room]:
    by_name = {c.name: c for c in problem.candidates}
    churn = problem.churn_limit
    rooms = {
        pod: _Room(
            slots=cls.max_loras,
            hbm_bytes=cls.hbm_bytes,
            host_count=cls.max_cpu_loras,
            host_bytes=cls.host_bytes,
            loads_left=churn if churn is not None else 1 << 40,
            limit_rps=cls.capacity_rps * problem.headroom,
        )
        for cls in problem.classes
        for pod in cls.pods
    }
    for held, hot in ((assignment.hot, True), (assignment.warm, False)):
        for name, pods in held.items():
            c = by_name[name]
            for pod in pods:
                room = rooms[pod]
                if hot:
                    room.slots -= 1
                    room.hbm_bytes -= c.size_bytes
                room.host_count -= 1
                room.host_bytes -= c.size_bytes
                if (name, pod) not in problem.current_registered and not c.pinned:
                    room.loads_left -= 1
    for name, shares in assignment.weights.items():
        c = by_name[name]
        for pod, share in shares.items():
            rooms[pod].mean_rps += share * c.mean_rps
            rooms[pod].spread_sq += (share * max(0.0, c.q90_rps - c.mean_rps)) ** 2
    return rooms
