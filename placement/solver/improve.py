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
from placement.solver.assignment import Assignment
from placement.solver.greedy import hot_eligible
from placement.solver.problem import Candidate, PodClass, PoolProblem

#: Challengers that may try a swap to make room (each try scans pods x replicas).
MAX_SWAP_TRIES = 16
#: Swaps one pod may make for one challenger before giving up.
MAX_SWAPS_PER_POD = 4


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
    state = _State(problem, assignment)
    challengers = sorted(
        _challengers(problem, assignment), key=lambda c: (-_gain(problem, c, state.warm), c.name)
    )
    swaps_left = MAX_SWAP_TRIES
    for c in challengers:
        gain = _gain(problem, c, state.warm)
        pod = _best_pod(problem, c, state.rooms, state.warm, state.class_of)
        if pod is None and swaps_left > 0 and gain > 0:
            swaps_left -= 1
            pod = _make_room(state, c, gain)
        if pod is None or gain - _load_ms_per_s(problem, c, pod) <= 0:
            continue
        state.add_hot(c, pod)
    return Assignment(
        hot=MappingProxyType(state.hot),
        warm=MappingProxyType(state.warm),
        weights=MappingProxyType(state.weights),
    )


class _State:
    """An assignment being improved, with every pod's room kept up to date."""

    def __init__(self, problem: PoolProblem, assignment: Assignment) -> None:
        self.problem = problem
        self.rooms = _rooms(problem, assignment)
        self.hot = dict(assignment.hot)
        self.warm = dict(assignment.warm)
        self.weights = dict(assignment.weights)
        self.class_of = problem.class_of()
        self.by_name = {c.name: c for c in problem.candidates}

    def add_hot(self, c: Candidate, pod: PodId) -> None:
        """One replica of ``c`` on ``pod`` (its warm registration, if any, given up)."""
        held_warm = self.warm.pop(c.name, ())
        for other in held_warm:
            self.rooms[other].host_count += 1
            self.rooms[other].host_bytes += c.size_bytes
        self._take(c, pod, sign=1)
        self.hot[c.name] = (pod,)
        self.weights[c.name] = MappingProxyType({pod: 1.0})

    def move(self, c: Candidate, source: PodId, target: PodId) -> None:
        """A single hot replica from one pod to another."""
        self._take(c, source, sign=-1)
        self._take(c, target, sign=1)
        self.hot[c.name] = (target,)
        self.weights[c.name] = MappingProxyType({target: 1.0})

    def _take(self, c: Candidate, pod: PodId, *, sign: int) -> None:
        room = self.rooms[pod]
        room.slots -= sign
        room.hbm_bytes -= sign * c.size_bytes
        room.host_count -= sign
        room.host_bytes -= sign * c.size_bytes
        if (c.name, pod) not in self.problem.current_registered and not c.pinned:
            room.loads_left -= sign
        room.mean_rps += sign * c.mean_rps
        room.spread_sq = max(0.0, room.spread_sq + sign * _spread(c) ** 2)

    def singles(self, pod: PodId) -> list[Candidate]:
        """Unpinned adapters hot on ``pod`` alone, busiest first."""
        found = [
            self.by_name[name]
            for name, pods in self.hot.items()
            if pods == (pod,) and not self.by_name[name].pinned
        ]
        return sorted(found, key=lambda c: (-c.mean_rps, c.name))


def _spread(c: Candidate) -> float:
    return max(0.0, c.q90_rps - c.mean_rps)


def _make_room(state: _State, c: Candidate, gain: float) -> PodId | None:
    """A pod for ``c`` made by swaps: on a pod with a slot and bytes for ``c`` but not
    the q90 capacity, busier single replicas trade places with quieter ones elsewhere
    (both pods staying within capacity) until ``c`` fits. The swaps are undone when it
    still does not fit or their loads cost more than ``c`` saves. None then."""
    problem = state.problem
    for pod, room in sorted(state.rooms.items()):
        if not _room_for(state, c, pod):
            continue
        done: list[tuple[Candidate, PodId, Candidate, PodId]] = []
        extra = 0.0
        while len(done) < MAX_SWAPS_PER_POD and room.q90_with(c) > room.limit_rps + 1e-9:
            swap = _best_swap(state, c, pod)
            if swap is None:
                break
            busy, quiet, other = swap
            extra += (
                _load_ms_per_s(problem, busy, other)
                - _load_ms_per_s(problem, busy, pod)
                + _load_ms_per_s(problem, quiet, pod)
                - _load_ms_per_s(problem, quiet, other)
            )
            state.move(busy, pod, other)
            state.move(quiet, other, pod)
            done.append((busy, pod, quiet, other))
        fits = room.q90_with(c) <= room.limit_rps + 1e-9
        if fits and gain - _load_ms_per_s(problem, c, pod) - extra > 0:
            return pod
        for busy, here, quiet, other in reversed(done):
            state.move(quiet, here, other)
            state.move(busy, other, here)
    return None


def _room_for(state: _State, c: Candidate, pod: PodId) -> bool:
    """Whether ``pod`` has a slot, GPU and host bytes and a host place for ``c``."""
    room = state.rooms[pod]
    return (
        hot_eligible(c, state.class_of[pod])
        and room.slots >= 1
        and room.hbm_bytes >= c.size_bytes
        and room.host_count >= 1
        and room.host_bytes >= c.size_bytes
        and (c.pinned or room.loads_left >= 1 or (c.name, pod) in state.problem.current_registered)
    )


def _best_swap(
    state: _State, c: Candidate, pod: PodId
) -> tuple[Candidate, Candidate, PodId] | None:
    """The swap that takes the most mean traffic off ``pod`` and leaves room for ``c``."""
    best: tuple[float, str, Candidate, Candidate, PodId] | None = None
    for busy in state.singles(pod):
        for other in sorted(state.rooms):
            if other == pod or not hot_eligible(busy, state.class_of[other]):
                continue
            for quiet in reversed(state.singles(other)):
                relief = busy.mean_rps - quiet.mean_rps
                if relief <= 0:
                    break
                if best is not None and relief <= best[0]:
                    continue
                if _swap_fits(state, c, pod, busy, other, quiet):
                    best = (relief, f"{busy.name}/{quiet.name}", busy, quiet, other)
        if best is not None:
            break
    return None if best is None else (best[2], best[3], best[4])


def _swap_fits(
    state: _State, c: Candidate, pod: PodId, busy: Candidate, other: PodId, quiet: Candidate
) -> bool:
    """Whether ``busy`` and ``quiet`` can trade pods with ``c`` joining ``pod``."""
    here, there = state.rooms[pod], state.rooms[other]
    if not hot_eligible(quiet, state.class_of[pod]):
        return False
    if here.hbm_bytes + busy.size_bytes - quiet.size_bytes < c.size_bytes:
        return False
    if there.hbm_bytes + quiet.size_bytes < busy.size_bytes:
        return False
    if there.host_bytes + quiet.size_bytes < busy.size_bytes:
        return False
    if here.host_bytes + busy.size_bytes - quiet.size_bytes < c.size_bytes:
        return False
    mean_there = there.mean_rps - quiet.mean_rps + busy.mean_rps
    sq_there = there.spread_sq - _spread(quiet) ** 2 + _spread(busy) ** 2
    mean_here = here.mean_rps - busy.mean_rps + quiet.mean_rps
    sq_here = here.spread_sq - _spread(busy) ** 2 + _spread(quiet) ** 2
    # The busier replica's new pod stays within capacity; this pod only gets lighter.
    return (
        mean_there + math.sqrt(max(0.0, sq_there)) <= there.limit_rps + 1e-9
        and mean_here + math.sqrt(max(0.0, sq_here)) <= here.limit_rps + 1e-9
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
