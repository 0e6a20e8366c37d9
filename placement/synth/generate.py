"""Synthetic request logs from a scenario (``data/``), reproducible for a seed.

Demand per adapter is a rate curve (power-law popularity x a business-hours profile in
the tenant's time zone x a weekday factor); arrivals follow a Gamma renewal process in
the curve's operational time, so bursts (CV > 1) and quiet nights both show. On top:
sessions (one user's run of requests on one adapter), pipeline sequences
(``doc-classifier-v2`` then ``legal-extract-v3`` or ``medical-extract-v1`` seconds
later), tenant login bursts, and A/B experiment variants that take half of their
parent's traffic from a given moment.

Pure: the random generator is a parameter, the output is a DataFrame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from placement.domain import AdapterId, Catalog, Pipelines, TenantId

MINUTE_S = 60


@dataclass(frozen=True, kw_only=True)
class Experiment:
    start: datetime
    of_top: int
    suffix: str = "-experiment"
    split: float = 0.5


@dataclass(frozen=True, kw_only=True)
class Login:
    tenant: TenantId
    at_local: str
    requests: int
    duration_s: float = 1800.0


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What ``scenario.yaml`` says; see data/*/scenario.yaml for examples."""

    name: str
    start: datetime
    days: float
    requests_per_minute: float
    zipf_exponent: float = 1.1
    interarrival_cv: float = 1.5
    timezone: str = "UTC"
    business_hours: tuple[float, float] = (9.0, 18.0)
    night_level: float = 0.15
    weekend_level: float = 0.3
    weights: Mapping[AdapterId, float] = field(default_factory=dict)
    hours: Mapping[AdapterId, tuple[float, float]] = field(default_factory=dict)
    session_mean_requests: float = 1.0
    session_gap_s: float = 20.0
    pipelines_per_hour: Mapping[str, float] = field(default_factory=dict)
    logins: tuple[Login, ...] = ()
    experiments: tuple[Experiment, ...] = ()
    prompt_median: float = 1020.0
    prompt_sigma: float = 0.9
    output_median: float = 129.0
    output_sigma: float = 1.0


def _smooth_window(hour: np.ndarray, start: float, end: float) -> np.ndarray:
    """About 0 outside [start, end], about 1 inside, with half-hour ramps."""
    rise = 1.0 / (1.0 + np.exp(-(hour - start) / 0.35))
    fall = 1.0 / (1.0 + np.exp(-(end - hour) / 0.35))
    return rise * fall


def _profile(
    scenario: Scenario, grid: pd.DatetimeIndex, tz: str, hours: tuple[float, float]
) -> np.ndarray:
    local = grid.tz_convert(ZoneInfo(tz))
    hour = np.asarray(local.hour + local.minute / 60.0, dtype=float)
    level = scenario.night_level + (1 - scenario.night_level) * _smooth_window(hour, *hours)
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


def _adapter_arrivals(
    rng: np.random.Generator, scenario: Scenario, catalog: Catalog, grid: pd.DatetimeIndex
) -> list[tuple[np.ndarray, AdapterId]]:
    weights = _base_weights(scenario, catalog)
    by_name = catalog.by_name()
    grid_s = (grid - grid[0]).total_seconds().to_numpy()
    profiles = {
        name: _profile(
            scenario,
            grid,
            by_name[name].timezone or scenario.timezone,
            scenario.hours.get(name, scenario.business_hours),
        )
        for name in weights
    }
    mean_level = sum(weights[n] * profiles[n].mean() for n in weights)
    total_rate_per_s = scenario.requests_per_minute / 60.0 / max(mean_level, 1e-9)
    arrivals = []
    for name, weight in weights.items():
        rate = total_rate_per_s * weight * profiles[name] / scenario.session_mean_requests
        starts = _renewal_times(rng, grid_s, rate, scenario.interarrival_cv)
        arrivals.append((_expand_sessions(rng, starts, scenario), name))
    return arrivals


def _pipeline_arrivals(
    rng: np.random.Generator, scenario: Scenario, pipelines: Pipelines, grid: pd.DatetimeIndex
) -> list[tuple[np.ndarray, AdapterId]]:
    grid_s = (grid - grid[0]).total_seconds().to_numpy()
    profile = _profile(scenario, grid, scenario.timezone, scenario.business_hours)
    arrivals: list[tuple[np.ndarray, AdapterId]] = []
    for pipeline in pipelines.pipelines:
        per_hour = scenario.pipelines_per_hour.get(pipeline.trigger, 0.0)
        rate = per_hour / 3600.0 * profile / max(profile.mean(), 1e-9)
        events = _renewal_times(rng, grid_s, rate, 1.0)
        happened: dict[AdapterId | None, np.ndarray] = {None: events}
        by_parent: dict[AdapterId | None, list[int]] = {}
        for index, step in enumerate(pipeline.steps):
            by_parent.setdefault(step.after, []).append(index)
        for parent, indices in by_parent.items():
            parent_times = happened.get(parent, np.empty(0))
            choice = rng.random(len(parent_times))
            low = 0.0
            for index in indices:
                step = pipeline.steps[index]
                if parent is None:  # root steps follow the trigger independently
                    chosen = rng.random(len(parent_times)) < step.probability
                else:  # steps after one adapter are alternatives (0.6 legal, 0.4 medical)
                    chosen = (choice >= low) & (choice < low + step.probability)
                    low += step.probability
                delay = rng.uniform(0.2, max(step.within_s, 0.5), size=int(chosen.sum()))
                times = parent_times[chosen] + delay
                happened[step.adapter] = times
                arrivals.append((times, step.adapter))
    return arrivals


def _login_arrivals(
    rng: np.random.Generator, scenario: Scenario, catalog: Catalog, pipelines: Pipelines | None
) -> list[tuple[np.ndarray, AdapterId]]:
    arrivals: list[tuple[np.ndarray, AdapterId]] = []
    for login in scenario.logins:
        adapters = list(pipelines.logins.get(login.tenant, ())) if pipelines else []
        adapters = adapters or [a.name for a in catalog.adapters if a.tenant == login.tenant]
        if not adapters:
            continue
        tz = ZoneInfo(
            next(
                (a.timezone for a in catalog.adapters if a.tenant == login.tenant and a.timezone),
                scenario.timezone,
            )
        )
        hour, minute = (int(part) for part in login.at_local.split(":"))
        day = scenario.start.astimezone(tz).replace(
            hour=hour, minute=minute, second=0, microsecond=0
        )
        while day < scenario.start + timedelta(days=scenario.days):
            if day.weekday() < 5 and day >= scenario.start:
                begin = (
                    (day - scenario.start).total_seconds()
                    + rng.normal(0, 300)
                    + rng.uniform(30, 180)
                )
                offsets = np.sort(rng.exponential(login.duration_s / 3, size=login.requests))
                picks = rng.integers(0, len(adapters), size=login.requests)
                for i, name in enumerate(adapters):
                    arrivals.append((begin + offsets[picks == i], name))
            day += timedelta(days=1)
    return arrivals


def _apply_experiments(
    rng: np.random.Generator,
    scenario: Scenario,
    catalog: Catalog,
    adapters: np.ndarray,
    times_s: np.ndarray,
) -> np.ndarray:
    ranked = sorted(_base_weights(scenario, catalog).items(), key=lambda kv: -kv[1])
    names = catalog.names()
    for variant, (parent, experiment) in _variants(scenario, [n for n, _ in ranked]).items():
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


def generate(
    scenario: Scenario,
    catalog: Catalog,
    *,
    rng: np.random.Generator,
    pipelines: Pipelines | None = None,
) -> pd.DataFrame:
    """A per-request log: ts, adapter, tenant, prompt_tokens, output_tokens, sorted by ts."""
    horizon_s = scenario.days * 86400
    grid = pd.date_range(
        scenario.start, periods=int(np.ceil(horizon_s / MINUTE_S)), freq="min", tz="UTC"
    )
    parts = _adapter_arrivals(rng, scenario, catalog, grid)
    if pipelines is not None:
        parts += _pipeline_arrivals(rng, scenario, pipelines, grid)
    parts += _login_arrivals(rng, scenario, catalog, pipelines)
    times_s = np.concatenate([times for times, _ in parts] or [np.empty(0)])
    adapters = np.concatenate(
        [np.full(len(times), name, dtype=object) for times, name in parts]
        or [np.empty(0, dtype=object)]
    )
    keep = (times_s >= 0) & (times_s < horizon_s)
    times_s, adapters = times_s[keep], adapters[keep]
    adapters = _apply_experiments(rng, scenario, catalog, adapters, times_s)
    order = np.argsort(times_s, kind="stable")
    times_s, adapters = times_s[order], adapters[order]
    tenants = {a.name: a.tenant or "" for a in catalog.adapters}
    size = len(times_s)
    start = pd.Timestamp(scenario.start).tz_convert("UTC")
    return pd.DataFrame(
        {
            "ts": start + pd.to_timedelta(np.round(times_s * 1000).astype("int64"), unit="ms"),
            "adapter": pd.Categorical(adapters),
            "tenant": pd.Categorical([tenants.get(a, "") for a in adapters]),
            "prompt_tokens": np.maximum(
                1, rng.lognormal(np.log(scenario.prompt_median), scenario.prompt_sigma, size)
            ).astype("int32"),
            "output_tokens": np.maximum(
                1, rng.lognormal(np.log(scenario.output_median), scenario.output_sigma, size)
            ).astype("int32"),
        }
    )
