"""Planning inside a replay: demand seen so far (or the true future) to hot sets.

Owns the small interface the ``lorafleet`` and ``oracle`` policies replan through:
a ``Forecaster`` turns per-minute request counts into a rate per adapter over the
coming horizon, and a ``Planner`` turns those rates into hot adapters per pod with
routing weights (``SimPlan``). ``greedy_rate_planner`` and ``recent_and_yesterday``
are the simulator's own simple fallbacks; ``placement.sim.wiring`` connects the
project's forecaster and solver when they are importable.

Pure: counts and rates in, plans out; no IO, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

MINUTE_S = 60.0
DAY_S = 86_400.0


@dataclass
class History:
    """Requests per adapter per minute since the replay started (minute index -> counts)."""

    minutes: dict[int, dict[str, int]] = field(default_factory=dict)

    def add(self, adapter: str, now_s: float) -> None:
        minute = int(now_s // MINUTE_S)
        counts = self.minutes.get(minute)
        if counts is None:
            counts = self.minutes[minute] = {}
        counts[adapter] = counts.get(adapter, 0) + 1

    def totals(self, start_s: float, end_s: float) -> dict[str, int]:
        """Requests per adapter with arrival minute in [start_s, end_s)."""
        result: dict[str, int] = {}
        for minute in range(max(0, int(start_s // MINUTE_S)), int(end_s // MINUTE_S)):
            for adapter, count in self.minutes.get(minute, {}).items():
                result[adapter] = result.get(adapter, 0) + count
        return result

    def peak_rates(self, start_s: float, end_s: float, *, bucket_s: float) -> dict[str, float]:
        """Per adapter, the highest rate (req/s) of any ``bucket_s`` window in the span."""
        peaks: dict[str, float] = {}
        moment = start_s
        while moment < end_s:
            stop = min(moment + bucket_s, end_s)
            span = max(stop - moment, MINUTE_S)
            for adapter, count in self.totals(moment, stop).items():
                peaks[adapter] = max(peaks.get(adapter, 0.0), count / span)
            moment = stop
        return peaks


@dataclass(frozen=True, kw_only=True)
class PlanPod:
    pod_id: str
    max_loras: int
    capacity_rps: float


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What a planner sees: the forecast, the pods and what they hold now."""

    now_s: float
    horizon_s: float
    rates: Mapping[str, float]
    pods: Sequence[PlanPod]
    current: Mapping[str, frozenset[str]]
    size_bytes: Mapping[str, int]
    tail_slots: int = 1
    capacity_headroom: float = 0.85
    #: Adapters forecast below this rate are left to the routers' LRU (not planned).
    hot_min_rps: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SimPlan:
    """Hot adapters per pod and, per adapter, the share of its traffic each pod takes."""

    hot: Mapping[str, frozenset[str]]
    weights: Mapping[str, Mapping[str, float]]
    source: str = "greedy"


Forecaster = Callable[[History, float, float], dict[str, float]]
Planner = Callable[[PlanRequest], SimPlan]


def recent_and_yesterday(history: History, now_s: float, horizon_s: float) -> dict[str, float]:
    """Fallback forecast: the larger of the last 20 minutes' rate and the peak rate in
    the same horizon a day earlier (time of day), per adapter."""
    recent = history.peak_rates(max(0.0, now_s - 1200.0), now_s, bucket_s=1200.0)
    yesterday = history.peak_rates(now_s - DAY_S, now_s - DAY_S + horizon_s, bucket_s=600.0)
    return {
        adapter: max(recent.get(adapter, 0.0), yesterday.get(adapter, 0.0))
        for adapter in recent.keys() | yesterday.keys()
    }


def true_future(future: History) -> Forecaster:
    """The oracle's forecaster: the peak 10-minute rate actually coming in the horizon."""

    def forecast(_: History, now_s: float, horizon_s: float) -> dict[str, float]:
        return future.peak_rates(now_s, now_s + horizon_s, bucket_s=600.0)

    return forecast


def greedy_rate_planner(request: PlanRequest) -> SimPlan:
    """Fallback planner: adapters by forecast rate, hottest first, each onto the least
    loaded pods with a free planned slot (pods already holding it first), with enough
    replicas for its rate; ``tail_slots`` slots per pod stay free for the long tail."""
    room = {pod.pod_id: max(0, pod.max_loras - request.tail_slots) for pod in request.pods}
    capacity = {pod.pod_id: pod.capacity_rps * request.capacity_headroom for pod in request.pods}
    load = {pod.pod_id: 0.0 for pod in request.pods}
    hot: dict[str, set[str]] = {pod.pod_id: set() for pod in request.pods}
    weights: dict[str, dict[str, float]] = {}
    ranked = sorted(request.rates.items(), key=lambda item: (-item[1], item[0]))
    for adapter, rate in ranked:
        free = [pod_id for pod_id in room if len(hot[pod_id]) < room[pod_id]]
        if rate <= 0.0 or rate < request.hot_min_rps or not free:
            break
        free.sort(
            key=lambda pod_id: (
                adapter not in request.current.get(pod_id, frozenset()),
                load[pod_id] / max(capacity[pod_id], 1e-9),
                pod_id,
            )
        )
        per_pod = max(min(capacity[pod_id] for pod_id in free), 1e-9)
        replicas = min(len(free), max(1, math.ceil(rate / per_pod)))
        chosen = free[:replicas]
        for pod_id in chosen:
            hot[pod_id].add(adapter)
            load[pod_id] += rate / replicas
        weights[adapter] = {pod_id: 1.0 / replicas for pod_id in chosen}
    return SimPlan(
        hot={pod_id: frozenset(adapters) for pod_id, adapters in hot.items()},
        weights=weights,
        source="greedy",
    )
