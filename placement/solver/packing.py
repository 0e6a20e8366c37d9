"""Second stage of placement: which pods hold each replica.

Given replica counts per adapter and pod class (``placement.solver.greedy.Counts``), pick the
pods: named pins first, then hot replicas largest first, preferring pods that already
hold the adapter (no load), pods holding its affinity group, and lightly loaded pods;
then the warm registrations. Every per-pod budget is checked here: GPU slots, host
cache places, GPU and host bytes, q90 traffic within capacity and headroom, and the
churn limit. The routing weights and the price of the result are
``placement.solver.assignment``'s (this module imports it, never the other way).

Pure: no IO, no clock; deterministic (ties break by pod name).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from placement.domain import AdapterId, PodId
from placement.solver.assignment import Assignment, routing_weights, within_capacity
from placement.solver.greedy import Counts
from placement.solver.problem import Candidate, PoolProblem


@dataclass
class _PodState:
    name: PodId
    slots: int
    host_count: int
    hbm_bytes: int
    host_bytes: int
    capacity_rps: float
    loads_left: int
    max_rank: int
    mean_load_rps: float = 0.0
    spread_sq: float = 0.0
    #: q90 of a replica placed alone because it exceeds capacity; nothing joins it.
    alone_rps: float = 0.0

    def q90_with(self, candidate: Candidate, share: float) -> float:
        """The pod's pooled q90 load with ``share`` of ``candidate`` added."""
        spread = share * max(0.0, candidate.q90_rps - candidate.mean_rps)
        mean = self.mean_load_rps + share * candidate.mean_rps
        return mean + math.sqrt(self.spread_sq + spread * spread)

    def limit_rps(self, candidate: Candidate, share: float) -> float:
        """Capacity with headroom; a replica too busy for any pod may have one to itself."""
        if self.mean_load_rps == 0.0 and self.slots > 0:
            return max(self.capacity_rps, share * candidate.q90_rps)
        return max(self.capacity_rps, self.alone_rps)

    def fits(self, candidate: Candidate, share: float, *, hot: bool, new: bool) -> bool:
        size = candidate.size_bytes
        if candidate.rank > self.max_rank:
            return False
        if hot and (self.slots < 1 or self.hbm_bytes < size):
            return False
        if hot and self.q90_with(candidate, share) > self.limit_rps(candidate, share) + 1e-9:
            return False
        loads_ok = not new or candidate.pinned or self.loads_left >= 1
        return self.host_count >= 1 and self.host_bytes >= size and loads_ok

    def take(self, candidate: Candidate, share: float, *, hot: bool, new: bool) -> None:
        if hot:
            self.slots -= 1
            self.hbm_bytes -= candidate.size_bytes
            if self.mean_load_rps == 0.0 and share * candidate.q90_rps > self.capacity_rps:
                self.alone_rps = share * candidate.q90_rps
                self.capacity_rps = 0.0
            spread = share * max(0.0, candidate.q90_rps - candidate.mean_rps)
            self.spread_sq += spread * spread
            self.mean_load_rps += share * candidate.mean_rps
        self.host_count -= 1
        self.host_bytes -= candidate.size_bytes
        if new and not candidate.pinned:
            self.loads_left -= 1


def _states(problem: PoolProblem) -> dict[PodId, _PodState]:
    churn = problem.churn_limit
    return {
        pod: _PodState(
            name=pod,
            slots=cls.max_loras,
            host_count=cls.max_cpu_loras,
            hbm_bytes=cls.hbm_bytes,
            host_bytes=cls.host_bytes,
            capacity_rps=cls.capacity_rps * problem.headroom,
            loads_left=churn if churn is not None else 1 << 40,
            max_rank=cls.max_lora_rank,
        )
        for cls in problem.classes
        for pod in cls.pods
    }


class _Packer:
    """Places replicas on pods one adapter at a time; fails fast when one does not fit."""

    def __init__(self, problem: PoolProblem, counts: Counts, *, pack_first: bool) -> None:
        self.problem = problem
        self.counts_total: dict[AdapterId, int] = {}
        for (adapter, _), n in counts.hot.items():
            self.counts_total[adapter] = self.counts_total.get(adapter, 0) + n
        self.pack_first = pack_first
        self.states = _states(problem)
        self.class_of = problem.class_of()
        self.hot: dict[AdapterId, list[PodId]] = {}
        self.warm: dict[AdapterId, list[PodId]] = {}
        self.groups: dict[tuple[str, PodId], int] = {}
        self.class_size = {cls.key: cls.size for cls in problem.classes}
        self.class_pods = {cls.key: cls.pods for cls in problem.classes}

    def _rank(
        self, candidate: Candidate, *, hot: bool
    ) -> Callable[[_PodState], tuple[object, ...]]:
        def key(state: _PodState) -> tuple[object, ...]:
            pair = (candidate.name, state.name)
            held = 0 if pair in self.problem.current_hot else 1
            if not hot or held:
                held = 0 if pair in self.problem.current_registered else 2
            together = -self.groups.get((candidate.group or "", state.name), 0)
            if not hot:
                # Warm registrations spread over host caches, most room first.
                return (held, together, -state.host_count, -state.host_bytes, state.name)
            if self.pack_first:
                return (held, together, -state.slots, -state.hbm_bytes, state.name)
            # Worst fit: the pod with the most room left over all budgets, so that every
            # budget drains evenly and late replicas still find distinct pods.
            cls = self.class_of[state.name]
            room = (
                state.slots / max(1, cls.max_loras)
                + state.hbm_bytes / max(1, cls.hbm_bytes)
                + 1.0
                - state.q90_with(candidate, 0.0) / max(1e-9, state.capacity_rps)
            )
            return (held, together, -round(room, 9), state.mean_load_rps, state.name)

        return key

    def best(
        self,
        candidate: Candidate,
        class_key: str,
        count: int,
        *,
        hot: bool,
        chosen: Sequence[PodId] = (),
    ) -> list[_PodState] | None:
        """The ``count`` best pods of the class for ``candidate``; None if too few fit.
        Hot replicas of an adapter with several go to the zones it has fewest in first
        (``chosen``: pods picked for it in other classes, not yet taken)."""
        pool = self.feasible(candidate, class_key, hot=hot)
        if len(pool) < count:
            return None
        rank = self._rank(candidate, hot=hot)
        if not hot or self.problem.zone_cap(self.total_hot(candidate)) is None:
            return heapq.nsmallest(count, pool, key=rank)
        zones = self.problem.zones
        used = Counter(zones.get(p) for p in (*self.hot.get(candidate.name, ()), *chosen))
        picked: list[_PodState] = []
        for _ in range(count):
            state = min(pool, key=lambda s: (used[zones.get(s.name)], rank(s)))
            pool.remove(state)
            used[zones.get(state.name)] += 1
            picked.append(state)
        return picked

    def feasible(self, candidate: Candidate, class_key: str, *, hot: bool) -> list[_PodState]:
        """Pods of the class that can take one more replica of ``candidate``."""
        taken = set(self.hot.get(candidate.name, ())) | set(self.warm.get(candidate.name, ()))
        share = self.share(candidate) if hot else 0.0
        pool = [
            self.states[p]
            for p in self.class_pods[class_key]
            if p not in taken
            and self.states[p].fits(
                candidate,
                share,
                hot=hot,
                new=(candidate.name, p) not in self.problem.current_registered,
            )
        ]
        return pool

    def dominant(self, candidate: Candidate) -> float:
        """The largest share of one pod's GPU bytes or q90 capacity a replica takes."""
        hbm = min(s.hbm_bytes for s in self.states.values())
        room = min(s.capacity_rps for s in self.states.values())
        q90 = candidate.q90_rps * self.share(candidate)
        return max(candidate.size_bytes / max(1, hbm), q90 / max(room, 1e-9))

    def share(self, candidate: Candidate) -> float:
        """The traffic share of one hot replica, split evenly."""
        return 1.0 / max(1, self.total_hot(candidate))

    def take(self, candidate: Candidate, pod: PodId, *, hot: bool) -> None:
        new = (candidate.name, pod) not in self.problem.current_registered
        self.states[pod].take(candidate, self.share(candidate), hot=hot, new=new)
        (self.hot if hot else self.warm).setdefault(candidate.name, []).append(pod)
        if candidate.group:
            key = (candidate.group, pod)
            self.groups[key] = self.groups.get(key, 0) + 1

    def total_hot(self, candidate: Candidate) -> int:
        return self.counts_total.get(candidate.name, 0)


def assign_pods(problem: PoolProblem, counts: Counts, *, repair: bool = False) -> Assignment | None:
    """Pick pods for the counts, balancing first and packing tight second.

    Strict (the default) returns None when some count does not fit the pods. With
    ``repair`` an adapter whose replicas do not fit is made warm, or else cold; only
    pins that do not fit give None.
    """
    # Balance first; when slots are tight, place the most replicated adapters first on
    # the pods with the most free slots, which packs any counts that fit the slots.
    # A repair run is the first strict run that demotes instead of failing.
    if repair:
        return _assign(problem, counts, pack_first=False, replicas_first=False, repair=True)
    for pack_first, replicas_first in ((False, False), (True, True), (False, True)):
        assignment = _assign(
            problem, counts, pack_first=pack_first, replicas_first=replicas_first, repair=False
        )
        if assignment is not None:
            return assignment
    return None


def _assign(
    problem: PoolProblem, counts: Counts, *, pack_first: bool, replicas_first: bool, repair: bool
) -> Assignment | None:
    packer = _Packer(problem, counts, pack_first=pack_first)
    by_name = {c.name: c for c in problem.candidates}
    if not _place_named_pins(packer, problem):
        return None
    targets: dict[AdapterId, dict[str, int]] = {}
    for (adapter, class_key), n in counts.hot.items():
        targets.setdefault(adapter, {})[class_key] = n

    # Pins first (they must fit), then by the share of a pod a replica takes in its
    # scarcest resource (q90 traffic or GPU bytes), as first-fit-decreasing packs best.
    def priority(a: AdapterId) -> tuple[bool, int, float, str]:
        replicas = packer.counts_total[a] if replicas_first else 0
        return (not by_name[a].pinned, -replicas, -packer.dominant(by_name[a]), a)

    order = sorted(targets, key=priority)
    for adapter in order:
        candidate = by_name[adapter]
        if _place_hot(packer, candidate, targets[adapter]):
            continue
        if not repair or candidate.pinned:
            return None
        if not _place_spread(packer, candidate, targets[adapter]):
            packer.counts_total[adapter] = 0
            _place_warm(packer, candidate, [cls.key for cls in problem.classes])
    if not _place_warm_items(packer, counts, repair=repair):
        return None
    return _with_weights(problem, packer)


def assign_around(
    problem: PoolProblem, counts: Counts, hot: Mapping[AdapterId, tuple[PodId, ...]]
) -> Assignment:
    """Warm registrations around hot replicas chosen elsewhere; what does not fit is cold."""
    packer = _Packer(problem, counts, pack_first=False)
    by_name = {c.name: c for c in problem.candidates}
    for adapter, pods in hot.items():
        for pod in pods:
            packer.take(by_name[adapter], pod, hot=True)
    _place_warm_items(packer, counts, repair=True)
    return _with_weights(problem, packer)


def _place_warm_items(packer: _Packer, counts: Counts, *, repair: bool) -> bool:
    by_name = {c.name: c for c in packer.problem.candidates}
    items = sorted(counts.warm.items(), key=lambda i: (-by_name[i[0][0]].size_bytes, i[0]))
    for (adapter, class_key), n in items:
        if not n or adapter in packer.hot:
            continue
        keys = [class_key] + ([c.key for c in packer.problem.classes] if repair else [])
        if not _place_warm(packer, by_name[adapter], keys) and not repair:
            return False
    return True


def _place_hot(packer: _Packer, candidate: Candidate, targets: Mapping[str, int]) -> bool:
    """All of an adapter's hot replicas, or none of them."""
    chosen: list[PodId] = []
    for class_key, n in sorted(targets.items()):
        held = packer.hot.get(candidate.name, [])
        need = n - sum(1 for p in held if packer.class_of[p].key == class_key)
        if need <= 0:
            continue
        pool = packer.best(candidate, class_key, need, hot=True, chosen=chosen)
        if pool is None:
            return False
        chosen.extend(state.name for state in pool)
    for pod in chosen:
        packer.take(candidate, pod, hot=True)
    return True


def _place_spread(packer: _Packer, candidate: Candidate, targets: Mapping[str, int]) -> bool:
    """Repair: more replicas, so that each carries less q90 traffic, up to max_hot."""
    widest = max(targets, key=lambda key: (packer.class_size[key], key))
    for extra in range(1, candidate.max_hot - sum(targets.values()) + 1):
        packer.counts_total[candidate.name] = sum(targets.values()) + extra
        if _place_hot(packer, candidate, {**targets, widest: targets[widest] + extra}):
            return True
    packer.counts_total[candidate.name] = sum(targets.values())
    return False


def _place_warm(packer: _Packer, candidate: Candidate, class_keys: list[str]) -> bool:
    for class_key in class_keys:
        pool = packer.best(candidate, class_key, 1, hot=False)
        if pool:
            packer.take(candidate, pool[0].name, hot=False)
            return True
    return False


def _with_weights(problem: PoolProblem, packer: _Packer) -> Assignment:
    hot = {a: tuple(sorted(pods)) for a, pods in packer.hot.items() if pods}
    warm = MappingProxyType({a: tuple(sorted(p)) for a, p in packer.warm.items() if p})
    balanced = Assignment(
        hot=MappingProxyType(hot),
        warm=warm,
        weights=MappingProxyType(routing_weights(problem, hot)),
    )
    if within_capacity(problem, balanced):
        return balanced
    # Balancing by the mean can crowd one pod's q90; an equal split was checked above.
    equal = {a: MappingProxyType(dict.fromkeys(pods, 1.0 / len(pods))) for a, pods in hot.items()}
    return Assignment(hot=MappingProxyType(hot), warm=warm, weights=MappingProxyType(equal))


def _place_named_pins(packer: _Packer, problem: PoolProblem) -> bool:
    for candidate in problem.candidates:
        for pod in candidate.pinned_pods:
            state = packer.states.get(pod)
            if state is None:
                continue
            new = (candidate.name, pod) not in problem.current_registered
            if not state.fits(candidate, packer.share(candidate), hot=True, new=new):
                return False
            packer.take(candidate, pod, hot=True)
    return True
