"""Per-pod GPU packing in stage 1: how many pods of a class take each fill of slots.

Stage 1 counts replicas against a class's totals of slots and GPU bytes. When adapters
are large against one pod's GPU budget (a 500 MiB adapter on a pod with 512 MiB for
adapters), those totals promise room that no pod has: a pod's bytes are spent in whole
adapters, and what is left over is wasted. Stage 2 then cannot pack stage 1's counts,
and stage 1's bound says little about the plan.

This module makes stage 1 exact in the GPU dimension for such classes. A *pattern* is
a fill of one pod: how many hot replicas of each adapter size it holds, within its
slots and GPU bytes, maximal (no further replica of any size fits). Stage 1 chooses how
many pods take each pattern; the replicas of each size cannot exceed the slots of that
size the chosen patterns offer, and an adapter's replicas (on distinct pods) cannot
exceed the pods offering its size. Every per-pod packing of slots and bytes is a choice
of patterns, so the model stays a relaxation and its bound stays valid.

Used only where it can matter and stays small: a class whose pods could not fill their
slots with the largest adapter within their GPU bytes, with few distinct sizes and few
patterns; elsewhere the totals are exact enough.

It also owns the capacity cuts (``add_capacity_cuts``): every pod's q90 limit relaxed
into linear pool totals that stage 1 can carry, each valid for every per-pod plan.

Pure: no IO, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from placement.solver.greedy import ClassKey, hot_eligible
from placement.solver.problem import Candidate, PodClass, PoolProblem

#: Above this many distinct adapter sizes in a class, or this many patterns, the class
#: keeps its totals: the enumeration and the model would grow faster than they help.
MAX_SIZES = 12
MAX_PATTERNS = 4000


@dataclass(frozen=True, kw_only=True)
class ClassPatterns:
    """The maximal fills of one pod of a class, by adapter size (bytes, largest first)."""

    sizes: tuple[int, ...]
    #: One row per pattern: replicas of each size in ``sizes``.
    patterns: tuple[tuple[int, ...], ...]


def enumerate_patterns(
    sizes: Sequence[int], *, slots: int, capacity_bytes: int, limit: int = MAX_PATTERNS
) -> tuple[tuple[int, ...], ...] | None:
    """Every maximal fill of ``slots`` slots and ``capacity_bytes`` bytes with items of
    ``sizes`` (each item one slot); None when there are more than ``limit``."""
    ordered = sorted(sizes, reverse=True)
    smallest = ordered[-1] if ordered else 0
    found: list[tuple[int, ...]] = []
    counts = [0] * len(ordered)

    def fill(index: int, slots_left: int, bytes_left: int) -> bool:
        if index == len(ordered):
            # Maximal: no further item of any size fits. Sizes descend, so checking the
            # smallest suffices only for room; a skipped larger size is checked too.
            if slots_left > 0 and any(size <= bytes_left for size in ordered):
                return True
            found.append(tuple(counts))
            return len(found) <= limit
        size = ordered[index]
        most = min(slots_left, bytes_left // size) if size > 0 else slots_left
        for n in range(most, -1, -1):
            counts[index] = n
            if not fill(index + 1, slots_left - n, bytes_left - n * size):
                return False
        counts[index] = 0
        return True

    if not ordered or smallest > capacity_bytes or slots <= 0:
        return ()
    if not fill(0, slots, capacity_bytes):
        return None
    return tuple(found)


def class_patterns(problem: PoolProblem, cls: PodClass, *, scale: float) -> ClassPatterns | None:
    """The patterns of ``cls`` when its GPU bytes can bind per pod; None when its totals
    are exact enough (or the patterns too many)."""
    sizes = sorted(
        {c.size_bytes for c in problem.candidates if c.can_be_hot and hot_eligible(c, cls)},
        reverse=True,
    )
    hbm = int(cls.hbm_bytes * scale)
    slots = min(cls.max_loras, cls.max_cpu_loras)
    if not sizes or len(sizes) > MAX_SIZES or sizes[0] * slots <= hbm:
        return None
    found = enumerate_patterns(sizes, slots=slots, capacity_bytes=hbm)
    if not found:
        return None
    return ClassPatterns(sizes=tuple(sizes), patterns=found)


def add_pattern_constraints(
    model: cp_model.CpModel,
    problem: PoolProblem,
    replicas: Mapping[ClassKey, cp_model.IntVar],
    *,
    scale: float,
) -> None:
    """Per class where GPU bytes bind per pod: pods per pattern, slots per size."""
    by_name = {c.name: c for c in problem.candidates}
    for cls in problem.classes:
        found = class_patterns(problem, cls, scale=scale)
        if found is None:
            continue
        pods = [
            model.new_int_var(0, cls.size, f"pattern[{cls.key},{i}]")
            for i in range(len(found.patterns))
        ]
        # A pod takes one pattern (a pod left idle takes any, unused).
        model.add(sum(pods) <= cls.size)
        for index, size in enumerate(found.sizes):
            here = [
                var
                for (adapter, key), var in replicas.items()
                if key == cls.key and by_name[adapter].size_bytes == size
            ]
            if not here:
                continue
            offer = [n[index] * y for n, y in zip(found.patterns, pods, strict=True) if n[index]]
            holding = [y for n, y in zip(found.patterns, pods, strict=True) if n[index]]
            # Replicas of this size fit the slots of this size the pods' patterns offer.
            model.add(sum(here) <= sum(offer))
            # An adapter's replicas sit on distinct pods that offer its size.
            for var in here:
                if _upper(var) > 1:
                    model.add(var <= sum(holding))


def _upper(var: cp_model.IntVar) -> int:
    domain = var.proto.domain
    return int(domain[-1]) if domain else 0


def most_beside(problem: PoolProblem, cls: PodClass, *, scale: float) -> dict[int, int]:
    """Per adapter size, the most hot replicas a pod of ``cls`` can hold with one of that
    size among them (slots, or fewer where its GPU bytes bind)."""
    slots = min(cls.max_loras, cls.max_cpu_loras)
    found = class_patterns(problem, cls, scale=scale)
    if found is None:
        sizes = {c.size_bytes for c in problem.candidates}
        return dict.fromkeys(sizes, slots)
    most: dict[int, int] = {}
    for pattern in found.patterns:
        for size, n in zip(found.sizes, pattern, strict=True):
            if n:
                most[size] = max(most.get(size, 0), sum(pattern))
    return most


def add_capacity_cuts(
    model: cp_model.CpModel,
    problem: PoolProblem,
    hot: Mapping[str, cp_model.IntVar],
    replicas: Mapping[ClassKey, cp_model.IntVar],
    *,
    fewest: Mapping[str, int],
    scale: float,
) -> None:
    """Pool capacity, as relaxations of every pod's q90 limit.

    A pod's q90 is its mean plus the norm of its replicas' (share-weighted) spreads,
    and that norm is at least ``sum(sqrt(alpha[a]) * spread[a])`` over the replicas
    on it for any weights ``alpha`` that add to at most 1 on every fill of one pod
    (Cauchy-Schwarz). Routing weights add to one per adapter, so summed over the pods
    each hot adapter counts its mean plus ``sqrt(alpha) * spread``, within the pods'
    summed limits. Two such weights are valid on every class: one over the most
    replicas a pod beside the adapter can hold (its slots, or fewer where GPU bytes
    bind), and, where bytes bind, the adapter's share of a pod's GPU bytes; their
    average is valid too, and each makes its own cut. An adapter too large to share a
    pod takes its pods' whole capacity.

    A pod goes over its limit only alone, with one replica whose equal share (q90 over
    the adapter's replicas) is above the limit of that pod's class (stage 2 packs so,
    ``placement.solver.packing``; routing weights other than equal shares are kept only
    where every pod is within its limit). Such a pod's limit stands for the adapter's
    share on it: an adapter whose share at its ``fewest`` replicas is above some
    class's limit counts at most the least such limit, and every cut stays a
    relaxation.
    """
    beside = {cls.key: most_beside(problem, cls, scale=scale) for cls in problem.classes}

    def by_slots(c: Candidate, cls: PodClass) -> float:
        return 1.0 / max(1, beside[cls.key].get(c.size_bytes, 1))

    def by_bytes(c: Candidate, cls: PodClass) -> float:
        return min(1.0, c.size_bytes / max(1, int(cls.hbm_bytes * scale)))

    def halfway(c: Candidate, cls: PodClass) -> float:
        return (by_slots(c, cls) + by_bytes(c, cls)) / 2

    weights: list[Callable[[Candidate, PodClass], float]] = [by_slots]
    if any(class_patterns(problem, cls, scale=scale) is not None for cls in problem.classes):
        weights.extend((by_bytes, halfway))
    for alpha in weights:
        _add_cut(model, problem, hot, replicas, beside, alpha, fewest)


def _add_cut(
    model: cp_model.CpModel,
    problem: PoolProblem,
    hot: Mapping[str, cp_model.IntVar],
    replicas: Mapping[ClassKey, cp_model.IntVar],
    beside: Mapping[str, Mapping[int, int]],
    alpha: Callable[[Candidate, PodClass], float],
    fewest: Mapping[str, int],
) -> None:
    """One capacity cut with per-adapter weights ``alpha`` (valid on every class)."""
    limit = {cls.key: cls.capacity_rps * problem.headroom for cls in problem.classes}
    terms: list[cp_model.LinearExprT] = []
    for c in problem.candidates:
        classes = [cls for cls in problem.classes if hot_eligible(c, cls)]
        if not c.can_be_hot or not classes:
            continue
        if max(beside[cls.key].get(c.size_bytes, 1) for cls in classes) <= 1:
            terms.extend(
                math.floor(limit[cls.key] * 1000) * replicas[(c.name, cls.key)] for cls in classes
            )
            continue
        # The weight must hold on whichever class's pods the adapter takes.
        weight = min(alpha(c, cls) for cls in classes)
        load = c.mean_rps + max(0.0, c.q90_rps - c.mean_rps) * math.sqrt(weight)
        # Pods this adapter may have alone above their limit: its term counts at most
        # the least of those limits (the pod's limit stands for its share there).
        share = c.q90_rps / max(1, fewest[str(c.name)])
        over = [limit[cls.key] for cls in classes if share > limit[cls.key]]
        load = min([load, *over])
        terms.append(math.floor(load * 1000) * hot[str(c.name)])
    capacity = sum(limit[cls.key] * cls.size for cls in problem.classes)
    model.add(sum(terms) <= math.ceil(capacity * 1000))
