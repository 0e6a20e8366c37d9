"""Replica counts per adapter and pod class: the greedy first stage of placement.

A pool's pods are grouped into classes of identical pods (``placement.solver.problem``), so
the first stage only decides how many hot replicas and warm registrations each
adapter gets in each class; the second stage (``placement.solver.packing``) picks the pods.
This module owns the ``Counts`` value both stages share, the eligibility rules (rank,
bytes) and a greedy that fills the budgets by delay saved per slot. The greedy is the
solver's hint and its fallback when the time limit passes without a solution.

Pure: no IO, no clock, deterministic for its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.domain import AdapterClass, AdapterId
from placement.solver.problem import Candidate, PodClass, PoolProblem
from policies.tiering import ProposedTier

ClassKey = tuple[AdapterId, str]


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Hot replicas and warm registrations per (adapter, class key)."""

    hot: Mapping[ClassKey, int] = field(default_factory=lambda: MappingProxyType({}))
    warm: Mapping[ClassKey, int] = field(default_factory=lambda: MappingProxyType({}))

    def hot_total(self, adapter: AdapterId) -> int:
        return sum(n for (a, _), n in self.hot.items() if a == adapter)


def hot_eligible(candidate: Candidate, cls: PodClass) -> bool:
    """Whether one replica of ``candidate`` fits a pod of ``cls`` on the GPU at all."""
    return (
        candidate.rank <= cls.max_lora_rank
        and candidate.size_bytes <= cls.hbm_bytes
        and candidate.size_bytes <= cls.host_bytes
        and cls.max_loras >= 1
        and cls.max_cpu_loras >= 1
    )


def warm_eligible(candidate: Candidate, cls: PodClass) -> bool:
    """Whether ``candidate`` can be registered in the host cache of a pod of ``cls``."""
    return (
        candidate.rank <= cls.max_lora_rank
        and candidate.size_bytes <= cls.host_bytes
        and cls.max_cpu_loras >= 1
    )


def named_pins_per_class(problem: PoolProblem) -> dict[ClassKey, int]:
    class_of = problem.class_of()
    named: dict[ClassKey, int] = {}
    for candidate in problem.candidates:
        for pod in candidate.pinned_pods:
            if pod in class_of:
                key = (candidate.name, class_of[pod].key)
                named[key] = named.get(key, 0) + 1
    return named


def current_per_class(problem: PoolProblem, *, hot_only: bool) -> dict[ClassKey, int]:
    """How many pods of each class hold each adapter now (hot, or registered at all)."""
    class_of = problem.class_of()
    pairs = problem.current_hot if hot_only else problem.current_registered
    counts: dict[ClassKey, int] = {}
    for adapter, pod in pairs:
        key = (adapter, class_of[pod].key)
        counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass
class _Room:
    """What is left of one class's pool totals while the greedy fills them."""

    slots: int
    hbm_bytes: int
    host_count: int
    host_bytes: int
    loads: int

    @classmethod
    def of(cls, pod_class: PodClass, scale: float, churn_limit: int | None) -> _Room:
        n = pod_class.size
        return cls(
            slots=pod_class.max_loras * n,
            hbm_bytes=int(pod_class.hbm_bytes * n * scale),
            host_count=pod_class.max_cpu_loras * n,
            host_bytes=int(pod_class.host_bytes * n * scale),
            loads=n * churn_limit if churn_limit is not None else 1 << 40,
        )

    def fits(self, size_bytes: int, replicas: int, *, hot: bool) -> bool:
        gpu_ok = not hot or (self.slots >= replicas and self.hbm_bytes >= size_bytes * replicas)
        return gpu_ok and self.host_count >= replicas and self.host_bytes >= size_bytes * replicas

    def take(self, size_bytes: int, replicas: int, *, hot: bool) -> None:
        if hot:
            self.slots -= replicas
            self.hbm_bytes -= size_bytes * replicas
        self.host_count -= replicas
        self.host_bytes -= size_bytes * replicas


def _priority(candidate: Candidate) -> tuple[int, float, str]:
    """Pins first, then proposed-hot production ones, then by delay saved per GPU slot
    as the class priority counts it."""
    saved = candidate.mean_rps * candidate.warm_miss_ms - candidate.priority_discount_ms_per_s
    saved_per_slot = saved / max(1, candidate.min_hot)
    proposed_hot = (
        candidate.proposal.tier is ProposedTier.HOT
        and candidate.adapter_class is AdapterClass.PRODUCTION
    )
    rank = 0 if candidate.pinned else (1 if proposed_hot else 2)
    return (rank, -saved_per_slot, candidate.name)


def greedy_counts(problem: PoolProblem, *, scale: float = 1.0) -> Counts:
    """Fill GPU slots by delay saved per slot, then host RAM by delay saved per adapter.

    ``scale`` shrinks the byte budgets, for a retry when the pods cannot be packed.
    """
    rooms = {cls.key: _Room.of(cls, scale, problem.churn_limit) for cls in problem.classes}
    named = named_pins_per_class(problem)
    registered = current_per_class(problem, hot_only=False)
    hot: dict[ClassKey, int] = {}
    warm: dict[ClassKey, int] = {}
    for candidate in sorted(problem.candidates, key=_priority):
        if not candidate.can_be_hot:
            continue
        worth = candidate.mean_rps * candidate.warm_miss_ms * problem.validity_s
        if not candidate.pinned and worth <= candidate.activate_ms * candidate.min_hot:
            continue
        split = _split_hot(candidate, problem.classes, rooms, named)
        if split is None:
            continue
        new = {k: max(0, n - registered.get((candidate.name, k), 0)) for k, n in split.items()}
        if not candidate.pinned and any(rooms[k].loads < n for k, n in new.items()):
            continue
        for key, n in split.items():
            hot[(candidate.name, key)] = n
            rooms[key].take(candidate.size_bytes, n, hot=True)
            rooms[key].loads -= 0 if candidate.pinned else new[key]
    _fill_warm(problem, rooms, registered, hot, warm)
    return Counts(hot=MappingProxyType(hot), warm=MappingProxyType(warm))


def _fill_warm(
    problem: PoolProblem,
    rooms: Mapping[str, _Room],
    registered: Mapping[ClassKey, int],
    hot: Mapping[ClassKey, int],
    warm: dict[ClassKey, int],
) -> None:
    """Register the adapters left out of the GPU in host RAM, by delay saved against cold."""
    placed = {a for a, _ in hot}
    by_warm_gain = sorted(
        (c for c in problem.candidates if c.name not in placed and c.mean_rps > 0),
        key=lambda c: (-c.mean_rps * (c.cold_miss_ms - c.warm_miss_ms), c.name),
    )
    for candidate in by_warm_gain:
        # The class that holds it now first: keeping a registration costs no load.
        classes = sorted(
            problem.classes, key=lambda cls: -registered.get((candidate.name, cls.key), 0)
        )
        for cls in classes:
            room = rooms[cls.key]
            fetch = 0 if registered.get((candidate.name, cls.key), 0) else 1
            if (
                warm_eligible(candidate, cls)
                and room.fits(candidate.size_bytes, 1, hot=False)
                and room.loads >= fetch
            ):
                warm[(candidate.name, cls.key)] = 1
                room.take(candidate.size_bytes, 1, hot=False)
                room.loads -= fetch
                break


def _split_hot(
    candidate: Candidate,
    classes: tuple[PodClass, ...],
    rooms: Mapping[str, _Room],
    named: Mapping[ClassKey, int],
) -> dict[str, int] | None:
    """Spread ``min_hot`` replicas over eligible classes, named pins first; None if full."""
    split = {
        cls.key: named.get((candidate.name, cls.key), 0)
        for cls in classes
        if hot_eligible(candidate, cls)
    }
    need = candidate.min_hot - sum(split.values())
    for cls in classes:
        if cls.key not in split:
            continue
        room = rooms[cls.key]
        while need > 0 and split[cls.key] < cls.size:
            if not room.fits(candidate.size_bytes, split[cls.key] + 1, hot=True):
                break
            split[cls.key] += 1
            need -= 1
    if need > 0:
        return None
    for key, n in split.items():
        if n and not rooms[key].fits(candidate.size_bytes, n, hot=True):
            return None
    return {key: n for key, n in split.items() if n > 0}


def trim_counts(problem: PoolProblem, counts: Counts, *, fraction: float) -> Counts:
    """Free ``fraction`` of every class's GPU slots and bytes by making the hot adapters
    that save the least per slot warm, so that pods can be packed one by one.

    Stage 1 fills pool totals exactly when slots bind; single pods then fragment. The
    adapters trimmed are the cheapest to lose, so the plan stays close to the bound.
    """
    by_name = {c.name: c for c in problem.candidates}
    hot = dict(counts.hot)
    warm = dict(counts.warm)
    for cls in problem.classes:
        slots_goal = fraction * cls.max_loras * cls.size
        bytes_goal = fraction * cls.hbm_bytes * cls.size
        here = sorted(
            (a for (a, key), n in hot.items() if key == cls.key and n and not by_name[a].pinned),
            key=lambda a: (by_name[a].mean_rps * by_name[a].warm_miss_ms / hot[(a, cls.key)], a),
        )
        freed_slots, freed_bytes = 0, 0
        for adapter in here:
            if freed_slots >= slots_goal and freed_bytes >= bytes_goal:
                break
            for key in [k for (a, k) in hot if a == adapter]:
                n = hot.pop((adapter, key))
                if key == cls.key:
                    freed_slots += n
                    freed_bytes += n * by_name[adapter].size_bytes
            warm[(adapter, cls.key)] = 1
    return Counts(hot=MappingProxyType(hot), warm=MappingProxyType(warm))


def widen_counts(problem: PoolProblem, counts: Counts, *, share: float) -> Counts:
    """More replicas for the busiest hot adapters, so that none puts more than ``share``
    of a pod's q90 limit on one pod, within each class's free slots, bytes and pods.

    Replicas are cheap (one load over the plan's validity) but stage 1 has no reason
    to add them: its capacity cut counts an adapter's spread whatever its replicas. A
    busy adapter on few pods fills their q90 limit and leaves their slots unusable;
    spread wider, each replica leaves room beside it. Where host places are full, the
    warm registrations that save the least make room (their adapters go cold).
    """
    by_name = {c.name: c for c in problem.candidates}
    hot, warm = dict(counts.hot), dict(counts.warm)
    for cls in problem.classes:
        limit = cls.capacity_rps * problem.headroom * share
        here = [a for (a, key), n in hot.items() if key == cls.key and n]
        slots = cls.max_loras * cls.size - sum(hot[(a, cls.key)] for a in here)
        hbm = cls.hbm_bytes * cls.size - sum(
            by_name[a].size_bytes * hot[(a, cls.key)] for a in here
        )
        places = cls.max_cpu_loras * cls.size - sum(hot[(a, cls.key)] for a in here)
        places -= sum(n for (_, key), n in warm.items() if key == cls.key)
        spare = sorted(
            (a for (a, key), n in warm.items() if key == cls.key and n),
            key=lambda a: (by_name[a].mean_rps * by_name[a].fetch_ms, a),
        )
        for adapter in sorted(here, key=lambda a: (-by_name[a].q90_rps / hot[(a, cls.key)], a)):
            c = by_name[adapter]
            elsewhere = sum(n for (a, key), n in hot.items() if a == adapter and key != cls.key)
            top = min(c.max_hot - elsewhere, cls.size)
            while hot[(adapter, cls.key)] < top and c.q90_rps / hot[(adapter, cls.key)] > limit:
                if slots < 1 or hbm < c.size_bytes or (places < 1 and not spare):
                    break
                if places < 1:
                    warm.pop((spare.pop(0), cls.key))
                    places += 1
                hot[(adapter, cls.key)] += 1
                slots, hbm, places = slots - 1, hbm - c.size_bytes, places - 1
    return Counts(hot=MappingProxyType(hot), warm=MappingProxyType(warm))
