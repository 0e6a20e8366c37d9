"""Requests an event causes: pipeline triggers and tenant logins, with their events.

A pipeline event (``document.uploaded``) leads to its steps' adapters seconds later
(``doc-classifier-v2``, then ``legal-extract-v3`` or ``medical-extract-v1``); a login
surge is a tenant's users logging in around a local time on weekdays, each user's login
followed by a few requests on the tenant's adapters. Every request made here carries
the index of the event that caused it, so the log can name it (``event_id``) and the
event log (``events.parquet``) can hold the events a webhook would have received.

Pure: the random generator is a parameter; times are seconds since the scenario start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from zoneinfo import ZoneInfo

import numpy as np

from placement.domain import AdapterId, Catalog, Pipeline, Pipelines, TenantId
from placement.synth.model import Arrivals, Login, Scenario

PIPELINE, LOGIN = "pipeline", "login"
#: A user's first request follows the login by this many seconds (uniform).
LOGIN_TO_FIRST_REQUEST_S = (5.0, 60.0)


@dataclass(frozen=True, kw_only=True)
class EventTimes:
    """Events of one kind and name: their times (seconds since the start) in order."""

    times_s: np.ndarray
    kind: str
    tenant: TenantId
    trigger: str | None = None


#: Arrival times of a renewal process: (rng, grid seconds, rate per second, cv).
Renewal = Callable[[np.random.Generator, np.ndarray, np.ndarray, float], np.ndarray]


def _pipeline_tenant(pipeline: Pipeline, catalog: Catalog) -> TenantId:
    """The tenant a webhook names for a pipeline: its first step's adapter's tenant."""
    by_name = catalog.by_name()
    first = by_name.get(pipeline.steps[0].adapter) if pipeline.steps else None
    return first.tenant if first is not None and first.tenant else TenantId(pipeline.trigger)


def pipeline_arrivals(
    rng: np.random.Generator,
    scenario: Scenario,
    pipelines: Pipelines,
    catalog: Catalog,
    *,
    grid_s: np.ndarray,
    profile: np.ndarray,
    renewal: Renewal,
    first_event: int,
) -> tuple[list[Arrivals], list[EventTimes]]:
    """Each trigger's events (a Poisson process following ``profile``) and the requests
    of its steps; event indices are numbered from ``first_event``."""
    arrivals: list[Arrivals] = []
    events: list[EventTimes] = []
    for pipeline in pipelines.pipelines:
        per_hour = scenario.pipelines_per_hour.get(pipeline.trigger, 0.0)
        rate = per_hour / 3600.0 * profile / max(profile.mean(), 1e-9)
        times = renewal(rng, grid_s, rate, 1.0)
        indices = first_event + np.arange(len(times), dtype=np.int64)
        first_event += len(times)
        tenant = _pipeline_tenant(pipeline, catalog)
        events.append(
            EventTimes(times_s=times, kind=PIPELINE, tenant=tenant, trigger=pipeline.trigger)
        )
        arrivals += _steps(rng, pipeline, times, indices)
    return arrivals, events


def _steps(
    rng: np.random.Generator, pipeline: Pipeline, times: np.ndarray, indices: np.ndarray
) -> list[Arrivals]:
    happened: dict[AdapterId | None, tuple[np.ndarray, np.ndarray]] = {None: (times, indices)}
    by_parent: dict[AdapterId | None, list[int]] = {}
    for index, step in enumerate(pipeline.steps):
        by_parent.setdefault(step.after, []).append(index)
    arrivals: list[Arrivals] = []
    for parent, children in by_parent.items():
        parent_times, parent_events = happened.get(
            parent, (np.empty(0), np.empty(0, dtype=np.int64))
        )
        choice = rng.random(len(parent_times))
        low = 0.0
        for index in children:
            step = pipeline.steps[index]
            if parent is None:  # root steps follow the trigger independently
                chosen = rng.random(len(parent_times)) < step.probability
            else:  # steps after one adapter are alternatives (0.6 legal, 0.4 medical)
                chosen = (choice >= low) & (choice < low + step.probability)
                low += step.probability
            delay = rng.uniform(0.2, max(step.within_s, 0.5), size=int(chosen.sum()))
            step_times = parent_times[chosen] + delay
            happened[step.adapter] = (step_times, parent_events[chosen])
            arrivals.append(
                Arrivals(times_s=step_times, adapter=step.adapter, event=parent_events[chosen])
            )
    return arrivals


def _login_adapters(login: Login, catalog: Catalog, pipelines: Pipelines | None) -> list[AdapterId]:
    adapters = list(pipelines.logins.get(login.tenant, ())) if pipelines else []
    return adapters or [a.name for a in catalog.adapters if a.tenant == login.tenant]


def _login_zone(login: Login, catalog: Catalog, scenario: Scenario) -> ZoneInfo:
    zones = (a.timezone for a in catalog.adapters if a.tenant == login.tenant and a.timezone)
    return ZoneInfo(next(zones, scenario.timezone))


def login_arrivals(
    rng: np.random.Generator,
    scenario: Scenario,
    catalog: Catalog,
    pipelines: Pipelines | None,
    *,
    first_event: int,
) -> tuple[list[Arrivals], list[EventTimes]]:
    """Each weekday's login surge: ``requests`` requests around ``at_local`` in the
    tenant's zone, in runs of ``per_login`` after each user's login."""
    arrivals: list[Arrivals] = []
    events: list[EventTimes] = []
    for login in scenario.logins:
        adapters = _login_adapters(login, catalog, pipelines)
        if not adapters:
            continue
        times, user, firsts = _surges(rng, scenario, login, _login_zone(login, catalog, scenario))
        if not len(times):
            continue
        login_s = firsts - rng.uniform(*LOGIN_TO_FIRST_REQUEST_S, size=len(firsts))
        events.append(EventTimes(times_s=login_s, kind=LOGIN, tenant=login.tenant))
        picks = rng.integers(0, len(adapters), size=len(times))
        caused = first_event + user
        first_event += len(firsts)
        for i, name in enumerate(adapters):
            mine = picks == i
            arrivals.append(Arrivals(times_s=times[mine], adapter=name, event=caused[mine]))
    return arrivals, events


def _surges(
    rng: np.random.Generator, scenario: Scenario, login: Login, zone: ZoneInfo
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The surge requests' times, the user each belongs to (numbered from 0 in order)
    and each user's first request time."""
    hour, minute = (int(part) for part in login.at_local.split(":"))
    day = scenario.start.astimezone(zone).replace(hour=hour, minute=minute, second=0, microsecond=0)
    end = scenario.start + timedelta(days=scenario.days)
    days: list[np.ndarray] = []
    while day < end:
        if day.weekday() < 5 and day >= scenario.start:
            begin = (day - scenario.start).total_seconds() + rng.normal(0, 300)
            offsets = np.sort(rng.exponential(login.duration_s / 3, size=login.requests))
            days.append(begin + rng.uniform(30, 180) + offsets)
        day += timedelta(days=1)
    if not days:
        return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0)
    times = np.concatenate(days)
    # Users are consecutive runs within a day's surge (a run never spans two days).
    run = np.concatenate([np.arange(len(d)) // login.per_login for d in days])
    day_of = np.repeat(np.arange(len(days)), [len(d) for d in days])
    first = np.ones(len(times), dtype=bool)
    first[1:] = (run[1:] != run[:-1]) | (day_of[1:] != day_of[:-1])
    return times, np.cumsum(first) - 1, times[first]
