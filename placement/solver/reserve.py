"""The tail reserve: GPU slots per pod a plan keeps free for the dynamic cache, priced.

A plan that fills every GPU slot with planned adapters leaves the long tail (adapters
the forecast calls too thin or too bursty to plan) nothing but evictions. This module
decides, per pool, how many slots of each pod the plan leaves to the engine's own
cache, by pricing them against the planned adapters they would displace:

- a planned adapter holds its slots all the time and saves what the solver counts,
  ``hot_weight x mean_rps x warm_miss_ms`` (ms of delay per second), over ``min_hot``
  slots;
- an unplanned adapter needs its slots (as many as its replicas) only while it is
  busy. Read from the forecast's spread, it runs at its q90 when busy and at its mean
  overall, so it needs them ``mean / q90`` of the time: the expected number of
  distinct unplanned adapters that need a slot at once is the sum of those shares,
  and a reserved slot is worth the savings of the tail adapters that share it (a
  knapsack filled by saving per share of a slot, the best per share first).

For each reserve level ``r`` (0 up to ``PlannerSettings.tail_reserve_max_slots``) the
planned set is the best-per-slot adapters that fit the slots left, the rest is the
tail in ``r`` slots per pod; the level that saves most is kept (ties: the smaller).
So a planned adapter takes a reserved slot only when its saving per slot exceeds what
the slot is worth to the tail. A steady adapter (q90 = mean) needs its slot all the
time, so it gains nothing from the reserve: the reserve prices burstiness only.

Pins are exempt: a reserve never leaves a pod fewer plannable slots than the adapters
pinned to it by name, nor the pool fewer than its pinned adapters' replicas.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class Candidate(Protocol):
    """What the reserve reads of a ``placement.solver.problem.Candidate``."""

    @property
    def name(self) -> str: ...
    @property
    def mean_rps(self) -> float: ...
    @property
    def q90_rps(self) -> float: ...
    @property
    def warm_miss_ms(self) -> float: ...
    @property
    def hot_weight(self) -> float: ...
    @property
    def min_hot(self) -> int: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def can_be_hot(self) -> bool: ...


class PodClass(Protocol):
    """What the reserve reads of a ``placement.solver.problem.PodClass``."""

    @property
    def key(self) -> str: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def size(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class ReserveChoice:
    """The reserve chosen for a pool, and what each level was worth (ms/s)."""

    slots_per_pod: int
    #: Per level r (index): planned saving plus the tail's saving in r slots per pod.
    value_by_level: tuple[float, ...]
    #: The expected number of distinct unplanned adapters needing a slot at once,
    #: over the whole pool, at the chosen level.
    tail_busy: float


def saving_ms_per_s(candidate: Candidate) -> float:
    """What one request per second of ``candidate`` being on the GPU saves, as the
    solver counts it (its class and SLO weight included)."""
    return max(0.0, candidate.hot_weight * candidate.mean_rps * candidate.warm_miss_ms)


def busy_share(candidate: Candidate) -> float:
    """The slots an unplanned adapter needs on average: its replicas (``min_hot``: the
    pods its q90 needs, and the availability rule's) each for mean over q90 of the time
    (it runs at its q90 when busy); ``min_hot`` for a forecast without spread."""
    replicas = max(1, candidate.min_hot)
    if candidate.q90_rps <= 0.0 or candidate.q90_rps <= candidate.mean_rps:
        return float(replicas)
    return replicas * max(1e-6, candidate.mean_rps / candidate.q90_rps)


def _tail_value(tail: Sequence[Candidate], slots: float) -> tuple[float, float]:
    """The tail's saving in ``slots`` slots (whole adapters, the best saving per busy
    share first, as the planned ones are filled) and the busy shares it uses."""
    ranked = sorted(tail, key=lambda c: (-saving_ms_per_s(c) / busy_share(c), c.name))
    value, used = 0.0, 0.0
    for candidate in ranked:
        share = busy_share(candidate)
        if used + share <= slots + 1e-9:
            value += saving_ms_per_s(candidate)
            used += share
    return value, used


def _plannable(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Unpinned candidates that can be hot, best saving per slot first."""
    return sorted(
        (c for c in candidates if c.can_be_hot and not c.pinned and c.mean_rps > 0),
        key=lambda c: (-saving_ms_per_s(c) / max(1, c.min_hot), c.name),
    )


def _level_value(
    ranked: Sequence[Candidate], *, slots: int, tail_slots: float
) -> tuple[float, float]:
    """Planned saving in ``slots`` slots (greedy by saving per slot) plus the tail's in
    ``tail_slots``; and the tail's busy shares."""
    planned, left, tail = 0.0, slots, []
    for candidate in ranked:
        if candidate.min_hot <= left:
            planned += saving_ms_per_s(candidate)
            left -= candidate.min_hot
        else:
            tail.append(candidate)
    tail_value, used = _tail_value(tail, tail_slots)
    return planned + tail_value, used


def reserve_cap(cls: PodClass, *, named_pins: int, limit: int) -> int:
    """The most slots a pod of ``cls`` may reserve: ``limit``, and never into the
    slots its pods' named pins need, nor its last slot."""
    return max(0, min(limit, cls.max_loras - max(1, named_pins)))


def choose_reserve(
    classes: Sequence[PodClass],
    candidates: Sequence[Candidate],
    *,
    limit: int,
    named_pins: Mapping[str, int],
) -> ReserveChoice:
    """The reserve per pod that saves most, between 0 and ``limit`` slots (see the
    module docstring); ``named_pins`` is the most adapters pinned by name to one pod
    of each class (by class key)."""
    pinned_slots = sum(c.min_hot for c in candidates if c.pinned)
    total = sum(cls.max_loras * cls.size for cls in classes)
    caps = {
        cls.key: reserve_cap(cls, named_pins=named_pins.get(cls.key, 0), limit=limit)
        for cls in classes
    }
    top = max(caps.values(), default=0)
    ranked = _plannable(candidates)
    values: list[float] = []
    busy: list[float] = []
    for level in range(top + 1):
        kept = sum(min(level, caps[cls.key]) * cls.size for cls in classes)
        if level and total - kept < pinned_slots:
            break
        value, used = _level_value(ranked, slots=total - kept - pinned_slots, tail_slots=kept)
        values.append(value)
        busy.append(used)
    best = 0
    for level, value in enumerate(values):
        if value > values[best] * (1 + 1e-9) + 1e-12:
            best = level
    return ReserveChoice(
        slots_per_pod=best,
        value_by_level=tuple(values),
        tail_busy=busy[best] if busy else 0.0,
    )
