"""The values a synthetic log is generated from, and the pieces it is built of.

``Scenario`` is what ``scenario.yaml`` says once parsed (``placement.synth.scenario``);
``Arrivals`` is one adapter's request times from one source (its own demand, a
pipeline step, a login surge), with the event that caused each request where one did.
Plain values only: no IO, no randomness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from placement.domain import AdapterId, TenantId


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """An A/B test: from ``start`` a variant of each of the ``of_top`` most popular
    adapters takes ``split`` of its parent's requests, and the parents' traffic grows
    so that the whole fleet's grows by ``traffic_increase`` (0.05: 5% more)."""

    start: datetime
    of_top: int
    suffix: str = "-experiment"
    split: float = 0.5
    traffic_increase: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Login:
    """A tenant's weekday login surge: ``requests`` requests, in runs of ``per_login``
    after each user's login, spread over ``duration_s`` after ``at_local``."""

    tenant: TenantId
    at_local: str
    requests: int
    duration_s: float = 1800.0
    per_login: int = 3


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What ``scenario.yaml`` says; see data/*/scenario.yaml for examples.

    ``profile``, when given, is the daily curve of demand in local time as (hour,
    level) points, interpolated linearly and around midnight; it replaces the
    business-hours window (``business_hours``, ``night_level``) for every adapter
    without hours of its own."""

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
    profile: tuple[tuple[float, float], ...] = ()
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


NO_EVENT = -1


@dataclass(frozen=True, kw_only=True)
class Arrivals:
    """Request times (seconds since the scenario start) for one adapter; ``event``,
    when given, is the index of the event that caused each request."""

    times_s: np.ndarray
    adapter: AdapterId
    event: np.ndarray | None = None

    def events(self) -> np.ndarray:
        if self.event is not None:
            return self.event
        return np.full(len(self.times_s), NO_EVENT, dtype=np.int64)
