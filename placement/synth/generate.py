"""Synthetic request logs from a scenario (``data/``), reproducible for a seed.

Demand per adapter is a rate curve (power-law popularity x a daily profile in the
tenant's time zone x a weekday factor); arrivals follow a Gamma renewal process in
the curve's operational time, so bursts (CV > 1) and quiet nights both show. On top:
sessions (one user's run of requests on one adapter), pipeline sequences and tenant
login surges (``placement.synth.triggers``, each request tagged with the event that
caused it), and A/B experiment variants that take half of their parent's traffic
from a given moment.

Pure: the random generator is a parameter, the output is two DataFrames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from placement.domain import AdapterId, Catalog, Pipelines
from placement.synth.model import NO_EVENT, Arrivals, Experiment, Login, Scenario
from placement.synth.triggers import EventTimes, login_arrivals, pipeline_arrivals

__all__ = ["Experiment", "Login", "Scenario", "SyntheticLog", "generate"]

MINUTE_S = 60


@dataclass(frozen=True)
class SyntheticLog:
    """The request log and, beside it, the events that caused some of its requests.

    ``requests``: ts, adapter, tenant, prompt_tokens, output_tokens and, when the
    scenario has events, event_id (empty for requests no event caused). ``events``:
    ts, kind (``pipeline`` or ``login``), trigger (pipelines only), tenant, event_id;
    both sorted by ts, every event within the requests' span."""

    requests: pd.DataFrame
    events: pd.DataFrame


def _smooth_window(hour: np.ndarray, start: float, end: float) -> np.ndarray:
    """About 0 outside [start, end], about 1 inside, with half-hour ramps."""
    rise = 1.0 / (1.0 + np.exp(-(hour - start) / 0.35))
    fall = 1.0 / (1.0 + np.exp(-(end - hour) / 0.35))
    return rise * fall


def _profile(
    scenario: Scenario, grid: pd.DatetimeIndex, tz: str, hours: tuple[float, float] | None
) -> np.ndarray:
    """Relative demand on ``grid``: the scenario's daily curve, or a business-hours
    window (``hours``, else the scenario's), in ``tz``; weekends scaled down."""
    local = grid.tz_convert(ZoneInfo(tz))
    hour = np.asarray(local.hour + local.minute / 60.0, dtype=float)
    if scenario.profile and hours is None:
        points_h, levels = zip(*sorted(scenario.profile), strict=True)
        level = np.asarray(np.interp(hour, points_h, levels, period=24.0), dtype=float)
    else:
        start, end = hours or scenario.business_hours
        level = scenario.night_level + (1 - scenario.night_level) * _smooth_window(hour, start, end)
    weekend = np.asarray(local.dayofweek >= 5)
    return np.where(weekend, level * scenario.weekend_level, level)


def _variants(
    scenario: Scenario, ranked: list[AdapterId]
) -> dict[AdapterId, tuple[AdapterId, Experiment]]:
    """Experiment variant name → (parent, experiment)."""
    variants: dict[AdapterId, tuple[AdapterId, Experiment]] = {}
    for experiment in scenario.experiments:
        for parent in ranked[: experiment.of_top]:
            variants[AdapterId(f"{parent}{experiment.suffix}")] = (parent, experiment)
    return variants


def _base_weights(scenario: Scenario, catalog: Catalog) -> dict[AdapterId, float]:
    names = [adapter.name for adapter in catalog.adapters]
    suffixes = tuple(e.suffix for e in scenario.experiments)
    base = [
        n for n in names if not (suffixes and n.endswith(suffixes) and n not in scenario.weights)
    ]
    weights = {name: 1.0 / (rank + 1) ** scenario.zipf_exponent for rank, name in enumerate(base)}
    weights.update({k: v for k, v in scenario.weights.items() if k in weights})
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}


def _ranked(weights: dict[AdapterId, float]) -> list[AdapterId]:
    return [name for name, _ in sorted(weights.items(), key=lambda kv: -kv[1])]


def _renewal_times(
    rng: np.random.Generator, grid_s: np.ndarray, rate_per_s: np.ndarray, cv: float
) -> np.ndarray:
    """Arrival times (s) of a Gamma renewal process following a piecewise-constant rate."""
    step = np.diff(grid_s, append=grid_s[-1] + MINUTE_S)
    cumulative = np.concatenate([[0.0], np.cumsum(rate_per_s * step)])
    total = cumulative[-1]
    if total <= 0:
        return np.empty(0)
    shape = 1.0 / (cv * cv)
    count = int(total * 1.2 + 10 * np.sqrt(total) + 10)
    points = np.cumsum(rng.gamma(shape, 1.0 / shape, size=count))
    points = points[points < total]
    edges = np.concatenate([grid_s, [grid_s[-1] + step[-1]]])
    # strictly increasing for interpolation across zero-rate stretches
    cumulative = cumulative + np.arange(len(cumulative)) * 1e-9
    return np.asarray(np.interp(points, cumulative, edges), dtype=float)


def _expand_sessions(
    rng: np.random.Generator, starts: np.ndarray, scenario: Scenario
) -> np.ndarray:
    if scenario.session_mean_requests <= 1 or len(starts) == 0:
        return starts
    sizes = rng.geometric(1.0 / scenario.session_mean_requests, size=len(starts))
    owner = np.repeat(np.arange(len(starts)), sizes)
    gaps = rng.exponential(scenario.session_gap_s, size=len(owner))
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    gaps[first] = 0.0
    offsets = np.cumsum(gaps)
    offsets -= np.repeat(offsets[first], sizes)
    return starts[owner] + offsets


def _experiment_boost(
    scenario: Scenario, weights: dict[AdapterId, float], grid: pd.DatetimeIndex
) -> dict[AdapterId, np.ndarray]:
    """Per parent of an experiment, its rate multiplier on ``grid``: 1 before the
    experiment, then enough for the fleet's traffic to grow by ``traffic_increase``."""
    boost: dict[AdapterId, np.ndarray] = {}
    ranked = _ranked(weights)
    for experiment in scenario.experiments:
        if experiment.traffic_increase <= 0:
            continue
        parents = ranked[: experiment.of_top]
        share = sum(weights[name] for name in parents)
        after = np.asarray(grid >= pd.Timestamp(experiment.start))
        factor = 1.0 + after * experiment.traffic_increase / max(share, 1e-9)
        for name in parents:
            boost[name] = boost.get(name, 1.0) * factor
    return boost


def _adapter_arrivals(
    rng: np.random.Generator, scenario: Scenario, catalog: Catalog, grid: pd.DatetimeIndex
) -> list[Arrivals]:
    weights = _base_weights(scenario, catalog)
    by_name = catalog.by_name()
    grid_s = (grid - grid[0]).total_seconds().to_numpy()
    profiles = {
        name: _profile(
            scenario, grid, by_name[name].timezone or scenario.timezone, scenario.hours.get(name)
        )
        for name in weights
    }
    mean_level = sum(weights[n] * profiles[n].mean() for n in weights)
    total_rate_per_s = scenario.requests_per_minute / 60.0 / max(mean_level, 1e-9)
    boost = _experiment_boost(scenario, weights, grid)
    arrivals = []
    for name, weight in weights.items():
        rate = total_rate_per_s * weight * profiles[name] / scenario.session_mean_requests
        if name in boost:
            rate = rate * boost[name]
        starts = _renewal_times(rng, grid_s, rate, scenario.interarrival_cv)
        arrivals.append(Arrivals(times_s=_expand_sessions(rng, starts, scenario), adapter=name))
    return arrivals


def _apply_experiments(
    rng: np.random.Generator,
    scenario: Scenario,
    catalog: Catalog,
    adapters: np.ndarray,
    times_s: np.ndarray,
) -> np.ndarray:
    ranked = _ranked(_base_weights(scenario, catalog))
    names = catalog.names()
    for variant, (parent, experiment) in _variants(scenario, ranked).items():
        if variant not in names:
            continue
        after = (experiment.start - scenario.start).total_seconds()
        moved = (
            (adapters == parent)
            & (times_s >= after)
            & (rng.random(len(adapters)) < experiment.split)
        )
        adapters = np.where(moved, variant, adapters)
    return adapters


def _event_frame(
    events: list[EventTimes], start: pd.Timestamp, low_s: float, high_s: float
) -> tuple[pd.DataFrame, np.ndarray]:
    """The events inside [low_s, high_s] as a frame sorted by time, and per event index
    (in the order ``events`` numbered them) its id, or None when left out."""

    def column(value: Callable[[EventTimes], object]) -> np.ndarray:
        parts = [np.full(len(e.times_s), value(e), dtype=object) for e in events]
        return np.concatenate(parts) if parts else np.empty(0, dtype=object)

    times = np.concatenate([e.times_s for e in events]) if events else np.empty(0)
    kinds = column(lambda e: e.kind)
    tenants = column(lambda e: str(e.tenant))
    triggers = column(lambda e: e.trigger)
    ids = np.full(len(times), None, dtype=object)
    inside = np.nonzero((times >= low_s) & (times <= high_s))[0]
    order = inside[np.argsort(times[inside], kind="stable")]
    counters: dict[str, int] = {}
    for index in order:
        kind = str(kinds[index])
        counters[kind] = counters.get(kind, 0) + 1
        ids[index] = f"{kind}-{counters[kind]:06d}"
    frame = pd.DataFrame(
        {
            "ts": start + pd.to_timedelta(np.round(times[order] * 1000).astype("int64"), "ms"),
            "kind": pd.Series(kinds[order], dtype=object),
            "trigger": pd.Series(triggers[order], dtype=object),
            "tenant": pd.Series(tenants[order], dtype=object),
            "event_id": pd.Series(ids[order], dtype=object),
        }
    )
    return frame, ids


def _lognormal_tokens(
    rng: np.random.Generator, median: float, sigma: float, size: int
) -> np.ndarray:
    return np.maximum(1, rng.lognormal(np.log(median), sigma, size)).astype("int32")


def generate(
    scenario: Scenario,
    catalog: Catalog,
    *,
    rng: np.random.Generator,
    pipelines: Pipelines | None = None,
) -> SyntheticLog:
    """The scenario's requests (sorted by ts) and the events that caused some of them."""
    horizon_s = scenario.days * 86400
    grid = pd.date_range(
        scenario.start, periods=int(np.ceil(horizon_s / MINUTE_S)), freq="min", tz="UTC"
    )
    grid_s = (grid - grid[0]).total_seconds().to_numpy()
    parts = _adapter_arrivals(rng, scenario, catalog, grid)
    events: list[EventTimes] = []
    if pipelines is not None:
        profile = _profile(scenario, grid, scenario.timezone, None)
        found, events = pipeline_arrivals(
            rng,
            scenario,
            pipelines,
            catalog,
            grid_s=grid_s,
            profile=profile,
            renewal=_renewal_times,
            first_event=0,
        )
        parts += found
    found, logins = login_arrivals(
        rng, scenario, catalog, pipelines, first_event=sum(len(e.times_s) for e in events)
    )
    parts += found
    events += logins
    times_s = np.concatenate([part.times_s for part in parts] or [np.empty(0)])
    adapters = np.concatenate(
        [np.full(len(part.times_s), part.adapter, dtype=object) for part in parts]
        or [np.empty(0, dtype=object)]
    )
    caused = np.concatenate([part.events() for part in parts] or [np.empty(0, dtype=np.int64)])
    keep = (times_s >= 0) & (times_s < horizon_s)
    times_s, adapters, caused = times_s[keep], adapters[keep], caused[keep]
    adapters = _apply_experiments(rng, scenario, catalog, adapters, times_s)
    order = np.argsort(times_s, kind="stable")
    times_s, adapters, caused = times_s[order], adapters[order], caused[order]
    tenants = {a.name: a.tenant or "" for a in catalog.adapters}
    size = len(times_s)
    start = pd.Timestamp(scenario.start).tz_convert("UTC")
    stamps_ms = np.round(times_s * 1000).astype("int64")
    requests = pd.DataFrame(
        {
            "ts": start + pd.to_timedelta(stamps_ms, unit="ms"),
            "adapter": pd.Categorical(adapters),
            "tenant": pd.Categorical([tenants.get(a, "") for a in adapters]),
            "prompt_tokens": _lognormal_tokens(
                rng, scenario.prompt_median, scenario.prompt_sigma, size
            ),
            "output_tokens": _lognormal_tokens(
                rng, scenario.output_median, scenario.output_sigma, size
            ),
        }
    )
    low_s, high_s = (stamps_ms[0] / 1000, stamps_ms[-1] / 1000) if size else (0.0, -1.0)
    event_frame, ids = _event_frame(events, start, low_s, high_s)
    if events:
        named = np.full(size, None, dtype=object)
        tagged = caused != NO_EVENT
        named[tagged] = ids[caused[tagged]]
        requests["event_id"] = pd.Series(named, dtype=object)
    return SyntheticLog(requests=requests, events=event_frame)
