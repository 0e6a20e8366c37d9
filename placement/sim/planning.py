"""Planning inside a replay, through the controller's ports: history in, a ``Plan`` out.

``ReplayPlanning`` is what the ``lorafleet`` and ``oracle`` policies replan with: a
``DemandForecaster`` (``placement.forecast.demand``) and a ``Planner``
(``placement.solver.planner``), the ports the controller ticks through, and the fleet
they plan for. ``ReplayHistory`` hands a forecaster the requests a replay has seen so
far as the request log a controller would have (per-minute counts); ``RecentFloor``
keeps an adapter that just appeared from being forecast at nothing; ``TrueDemand`` is
the oracle's forecaster (the demand actually coming); ``WindowRates`` the recent
rates a victim's worth is capped by, at each decision as the live router reads them;
``observed_plan`` states what the pods hold, for the planner's hint.

Pure: requests in, demand and plans out; no IO, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType

import numpy as np
import pandas as pd

from placement.domain import AdapterId, Fleet, PodId
from placement.errors import ForecastError
from placement.forecast.demand import DemandForecaster
from placement.inputs.request_log import RequestLog
from placement.plan import Plan, PodPlan
from placement.sim.workload import SimWorkload
from placement.solver.planner import Planner
from placement.solver.problem import Demand

MINUTE_S = 60
#: The oracle's peak: the busiest window of this length in the horizon.
PEAK_WINDOW_S = 600.0
#: ``RecentFloor``'s window: at least the rate of the last 20 minutes.
RECENT_S = 1200.0


@dataclass(frozen=True, kw_only=True)
class ReplayPlanning:
    """How ``lorafleet`` forecasts and plans (the ``oracle`` swaps in ``TrueDemand``)."""

    fleet: Fleet
    forecaster: DemandForecaster
    planner: Planner
    #: Of a plan's hot adapters only those forecast (q90) at or above this rate are
    #: preloaded and routed by weight; the rest stay with the routers' LRU.
    hot_min_rps: float = 0.0
    description: str = ""
    #: The oracle's planner: it knows the future, so it plans without availability
    #: replicas, which only guard against what it would foresee (None: ``planner``).
    bound_planner: Planner | None = None


class ReplayHistory:
    """The replay's requests as per-minute counts, cut at any moment of the replay."""

    def __init__(self, workload: SimWorkload) -> None:
        self.workload = workload
        start_s = workload.start.timestamp()
        minute = (start_s + np.asarray(workload.arrival_s, dtype=float)) // MINUTE_S
        counts = (
            pd.DataFrame({"minute": minute.astype("int64"), "adapter": workload.adapters})
            .groupby(["minute", "adapter"], sort=True)
            .size()
            .rename("requests")
            .reset_index()
        )
        self._minute_end_s = (counts["minute"].to_numpy() + 1) * MINUTE_S - start_s
        self._counts = pd.DataFrame(
            {
                "ts": pd.to_datetime(counts["minute"] * MINUTE_S, unit="s", utc=True),
                "adapter": counts["adapter"].astype(str),
                "requests": counts["requests"].astype("int64"),
            }
        )

    def moment(self, now_s: float) -> datetime:
        return self.workload.start + timedelta(seconds=now_s)

    def seconds(self, moment: datetime) -> float:
        return (moment - self.workload.start).total_seconds()

    def log_until(self, now_s: float) -> RequestLog:
        """Every complete minute before ``now_s``: what a controller's history holds."""
        rows = int(np.searchsorted(self._minute_end_s, now_s, side="right"))
        return RequestLog(frame=self._counts.iloc[:rows], aggregated=True, source="replay")

    def rates(self, start_s: float, end_s: float) -> dict[AdapterId, float]:
        """Requests per second per adapter arriving in [start_s, end_s)."""
        arrival = self.workload.arrival_s
        first, last = bisect_left(arrival, start_s), bisect_left(arrival, end_s)
        span_s = max(end_s - start_s, 1e-9)
        counts = Counter(self.workload.adapters[first:last])
        return {AdapterId(name): count / span_s for name, count in counts.items()}


class RecentFloor:
    """A forecaster whose demand is at least each adapter's rate of the last
    ``window_s``, so that an adapter that just appeared (the war story's variants) is
    planned before a bucket model could see it; that rate alone when the model fails."""

    def __init__(self, forecaster: DemandForecaster, *, window_s: float = RECENT_S) -> None:
        self.forecaster = forecaster
        self.window_s = window_s
        self.failures = 0

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        recent = _recent_rates(history, start=start, window_s=self.window_s)
        try:
            forecast = dict(self.forecaster(history, start=start, duration_s=duration_s))
        except ForecastError:
            self.failures += 1
            forecast = {}
        for name, rate in recent.items():
            known = forecast.get(name)
            if known is None:
                forecast[name] = Demand(mean_rps=rate, q90_rps=rate)
            elif known.q90_rps < rate or known.mean_rps < rate:
                forecast[name] = Demand(
                    mean_rps=max(known.mean_rps, rate), q90_rps=max(known.q90_rps, rate)
                )
        return forecast


def _recent_rates(
    history: RequestLog, *, start: datetime, window_s: float
) -> dict[AdapterId, float]:
    frame = history.frame
    recent = frame[frame["ts"] >= pd.Timestamp(start) - pd.Timedelta(seconds=window_s)]
    totals = recent.groupby("adapter", observed=True)["requests"].sum()
    return {AdapterId(str(name)): float(count) / window_s for name, count in totals.items()}


class TrueDemand:
    """The oracle's forecaster: the demand actually coming, whatever the history says.
    The mean is the horizon's; the q90 the busiest ``PEAK_WINDOW_S`` window in it."""

    def __init__(self, history: ReplayHistory) -> None:
        self.history = history

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        begin_s = self.history.seconds(start)
        end_s = begin_s + duration_s
        means = self.history.rates(begin_s, end_s)
        peaks: dict[AdapterId, float] = {}
        moment_s = begin_s
        while moment_s < end_s:
            stop_s = min(moment_s + PEAK_WINDOW_S, end_s)
            # A last window shorter than a minute is read as a minute, not as a burst.
            for name, rate in self.history.rates(
                moment_s, max(stop_s, moment_s + MINUTE_S)
            ).items():
                peaks[name] = max(peaks.get(name, 0.0), rate)
            moment_s = stop_s
        return {
            name: Demand(mean_rps=mean, q90_rps=max(mean, peaks.get(name, 0.0)))
            for name, mean in means.items()
        }


class WindowRates(Mapping[str, float]):
    """Each adapter's rate (req/s over the fleet) of the requests that arrived in the
    ``window_s`` before ``now_s``, read at the moment a router sets: the live router's
    recent rate (it counts what it routed over the last 20 minutes, at each decision),
    for ``VictimWorth.recent_rps``. A window cut short by the start of the replay
    counts over what has passed of it (at least a minute)."""

    def __init__(self, workload: SimWorkload, *, window_s: float = RECENT_S) -> None:
        self.window_s = window_s
        self.now_s = 0.0
        self._arrivals: dict[str, list[float]] = {}
        for moment, adapter in zip(workload.arrival_s, workload.adapters, strict=True):
            self._arrivals.setdefault(adapter, []).append(moment)

    def get(self, adapter: str, default: float = 0.0) -> float:  # type: ignore[override]
        times = self._arrivals.get(adapter)
        if times is None:
            return default
        end = bisect_left(times, self.now_s)
        count = end - bisect_left(times, self.now_s - self.window_s, 0, end)
        return count / max(MINUTE_S, min(self.window_s, self.now_s)) if count else default

    def __getitem__(self, adapter: str) -> float:
        rate = self.get(adapter, -1.0)
        if rate < 0.0:
            raise KeyError(adapter)
        return rate

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._arrivals if self.get(name, -1.0) >= 0.0)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def observed_plan(gpu_adapters: Mapping[str, frozenset[str]], *, at: datetime) -> Plan:
    """What the pods hold on their GPU slots, as a plan: the planner's hint."""
    pods = {
        PodId(pod_id): PodPlan(hot=tuple(AdapterId(name) for name in sorted(names)))
        for pod_id, names in gpu_adapters.items()
    }
    return Plan(
        id="observed",
        created_at=at,
        valid_from=at,
        valid_until=at,
        pods=MappingProxyType(pods),
        adapters=MappingProxyType({}),
    )
