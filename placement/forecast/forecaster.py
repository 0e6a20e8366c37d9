"""Forecasting glue: domain inputs (request logs, catalogs, pipelines) to ``models/`` and back.

- :func:`forecast_demand`: a counts or request frame → a :class:`Forecast` whose
  ``frame`` is the forecast format of ARCHITECTURE.md (``ts, adapter, mean, q50, q90,
  q99, p_nonzero``, requests per bucket); the solver, controller and simulator call it.
- :func:`preloads`: the time-of-day preload schedule of a forecast, with each
  adapter's lead time covering its cold load (:func:`lead_times_s`).
- :func:`learn_events` / :class:`EventModels`: pipeline transitions and tenant logins
  learned from the log and merged with pipelines.yaml, for near-term preloads.
- :class:`ModelForecaster`: the controller's ``DemandForecaster`` port over all of it.

No IO here: files are read by ``placement.inputs.request_log`` and the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pandas as pd

from models.base import PanelForecast, sanitize
from models.events import (
    EventPreload,
    LoginAffinity,
    Transition,
    learn_logins,
    learn_transitions,
    merge_declared,
    preloads_after_login,
    preloads_after_request,
)
from models.preload import HotRule, PreloadItem, hot_flags, preload_schedule
from models.registry import forecaster_named
from models.series import CountPanel, SeriesError, build_panel
from placement.domain import AdapterId, Catalog, Pipelines
from placement.errors import ForecastError
from placement.forecast.demand import demand_from_forecast
from placement.inputs.request_log import RequestLog
from placement.settings import ForecastSettings, LoadCostSettings
from placement.solver.problem import Demand

FORECAST_COLUMNS = ("ts", "adapter", "mean", "q50", "q90", "q99", "p_nonzero")
#: The history a forecast reads, at most: the models look back a few weeks at most
#: (the weekly profiles, the backtest's origins), and the panel is dense, one cell per
#: bucket and adapter, so a log reaching back decades (seconds from a trace's start read
#: as 1970) would fill gigabytes of zeros.
MAX_HISTORY_S = 90 * 86_400


@dataclass(frozen=True, kw_only=True, eq=False)
class Forecast:
    """A forecast from ``origin`` on: the frame others read, and what made it."""

    frame: pd.DataFrame
    origin: datetime
    bucket_s: int
    #: The model behind each adapter's forecast (after fallbacks and selection).
    models: Mapping[str, str]
    #: Everything that was cleaned, simplified or fallen back on, in words.
    notes: tuple[str, ...]
    history: CountPanel
    result: PanelForecast


def _epoch_s(at: datetime | pd.Timestamp | int | float) -> int:
    if isinstance(at, int | float):
        return int(at)
    stamp = pd.Timestamp(at)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return int(stamp.timestamp())


def valid_timezones(timezones: Mapping[str, str | None]) -> tuple[dict[str, str], list[str]]:
    """Zones that exist; the others are dropped (UTC is used) with a note each."""
    good: dict[str, str] = {}
    notes: list[str] = []
    for adapter, zone in timezones.items():
        if not zone:
            continue
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            notes.append(f"{adapter}: unknown time zone {zone!r}; used UTC")
            continue
        good[adapter] = zone
    return good, notes


def forecast_demand(
    counts: pd.DataFrame,
    *,
    at: datetime | pd.Timestamp | int | float,
    horizon_s: int,
    bucket_s: int,
    timezones: Mapping[str, str | None] | None = None,
    adapters: Sequence[str] = (),
    model: str = "auto",
    seed: int = 0,
) -> Forecast:
    """Forecast every adapter for ``horizon_s`` after ``at`` from the history before it.

    ``counts`` has ``ts`` and ``adapter`` (one row per request) and optionally
    ``requests`` (pre-aggregated, e.g. ``RequestLog.counts(bucket_s)``). ``adapters``
    adds catalog adapters without history (they get zeros). A model that cannot be fitted
    falls back to a simpler one and the notes say so; ForecastError when nothing can be.
    """
    end_s = _epoch_s(at)
    start_s, older = _history_start(counts, end_s=end_s)
    try:
        panel = build_panel(
            counts, bucket_s=bucket_s, end_s=end_s, start_s=start_s, adapters=adapters
        )
    except SeriesError as exc:
        raise ForecastError(f"cannot forecast from this log: {exc}") from None
    if older:
        panel = replace(panel, notes=(*panel.notes, older))
    if not panel.counts.any():
        raise ForecastError(
            f"the request log has no requests before {pd.Timestamp(end_s, unit='s', tz='UTC')}"
        )
    zones, zone_notes = valid_timezones(timezones or {})
    horizon = max(1, math.ceil(horizon_s / bucket_s))
    result = _predict(panel, horizon=horizon, model=model, zones=zones, seed=seed)
    notes = (*panel.notes, *zone_notes, *result.notes)
    return Forecast(
        frame=forecast_frame(result),
        origin=datetime.fromtimestamp(panel.end_s, tz=UTC),
        bucket_s=bucket_s,
        models=dict(zip(result.adapters, result.model, strict=True)),
        notes=tuple(dict.fromkeys(notes)),
        history=panel,
        result=result,
    )


def _history_start(counts: pd.DataFrame, *, end_s: int) -> tuple[int | None, str]:
    """Where the panel starts: None (at the log's first row) unless that is more than
    ``MAX_HISTORY_S`` before ``end_s``; then there, with a note of the rows left out."""
    if "ts" not in counts.columns or len(counts) == 0:
        return None, ""
    start_s = end_s - MAX_HISTORY_S
    try:
        first = pd.to_datetime(counts["ts"].min(), utc=True)
    except (TypeError, ValueError):
        return None, ""  # build_panel names what is wrong with the column
    if pd.isna(first) or first.timestamp() >= start_s:
        return None, ""
    since = pd.Timestamp(start_s, unit="s", tz="UTC")
    return start_s, (
        f"history before {since} ({MAX_HISTORY_S // 86_400} days before the forecast's "
        f"origin) left out: the log reaches back to {first}"
    )


def _predict(
    panel: CountPanel, *, horizon: int, model: str, zones: Mapping[str, str], seed: int
) -> PanelForecast:
    try:
        forecaster = forecaster_named(model, timezones=zones, seed=seed)
    except KeyError as exc:
        raise ForecastError(str(exc.args[0])) from None
    try:
        return sanitize(forecaster.fit(panel).predict(panel, horizon=horizon))
    except ValueError as exc:
        fallback = "profile-7d" if panel.n_buckets >= panel.per_day() else "ewma"
        simple = forecaster_named(fallback).fit(panel).predict(panel, horizon=horizon)
        note = f"{model} could not be used ({exc}); fell back to {fallback}"
        return sanitize(replace(simple, notes=(note, *simple.notes)))


def forecast_frame(result: PanelForecast) -> pd.DataFrame:
    """The long forecast format: one row per adapter and bucket, sorted by adapter then time."""
    steps, n_adapters = result.mean.shape
    starts = result.origin_s + np.arange(steps) * result.bucket_s
    ts = pd.to_datetime(np.tile(starts, n_adapters), unit="s", utc=True)
    columns: dict[str, object] = {
        "ts": ts,
        "adapter": np.repeat(np.array(result.adapters, dtype=object), steps),
    }
    for key in FORECAST_COLUMNS[2:]:
        columns[key] = getattr(result, key).T.ravel().astype(np.float64)
    return pd.DataFrame(columns, columns=list(FORECAST_COLUMNS))


def timezones_of(catalog: Catalog) -> dict[str, str | None]:
    return {str(adapter.name): adapter.timezone for adapter in catalog.adapters}


def lead_times_s(
    catalog: Catalog, *, load_cost: LoadCostSettings, minimum_s: int
) -> dict[str, int]:
    """Per adapter, how early to start loading: at least ``minimum_s``, and its cold load.

    The worst-case drain is added: the load must be done before the first request.
    """
    return {
        str(adapter.name): max(
            minimum_s,
            math.ceil(
                load_cost.cold_load_ms(adapter.size_bytes, drain_ms=load_cost.max_drain_ms) / 1000
            ),
        )
        for adapter in catalog.adapters
    }


def preloads(
    forecast: Forecast,
    *,
    settings: ForecastSettings | None = None,
    leads_s: Mapping[str, int] | None = None,
    rule: HotRule | None = None,
    hot_now: frozenset[str] | None = None,
) -> tuple[PreloadItem, ...]:
    """The preload schedule of a forecast (rises into the hot tier, moved earlier by the lead).

    ``hot_now``: adapters already hot at the origin; by default those the forecast puts in
    the hot tier in its first bucket (the fleet is taken to follow today's demand already).
    """
    if hot_now is None:
        hot_now = frozenset(
            name
            for name, flag in zip(
                forecast.result.adapters,
                hot_flags(forecast.result, rule or HotRule())[0],
                strict=True,
            )
            if flag
        )
    lead: int | Mapping[str, int] = (
        dict(leads_s) if leads_s is not None else (settings or ForecastSettings()).preload_lead_s
    )
    return preload_schedule(forecast.result, lead_s=lead, rule=rule, hot_now=hot_now)


@dataclass(frozen=True, kw_only=True)
class EventModels:
    """Learned (and declared) transitions and login affinities, ready to answer events."""

    transitions: tuple[Transition, ...] = ()
    logins: tuple[LoginAffinity, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def after_request(
        self, *, tenant: str | None, adapter: str, at_s: float, min_probability: float = 0.3
    ) -> tuple[EventPreload, ...]:
        return preloads_after_request(
            self.transitions,
            tenant=tenant or "",
            adapter=adapter,
            at_s=at_s,
            min_probability=min_probability,
        )

    def after_login(
        self, *, tenant: str, at_s: float, min_probability: float = 0.3
    ) -> tuple[EventPreload, ...]:
        return preloads_after_login(
            self.logins, tenant=tenant, at_s=at_s, min_probability=min_probability
        )


def declared_transitions(
    pipelines: Pipelines, catalog: Catalog | None = None
) -> tuple[Transition, ...]:
    """pipelines.yaml steps with an ``after`` as transitions, per tenant of the source adapter."""
    tenants = {str(a.name): str(a.tenant or "") for a in catalog.adapters} if catalog else {}
    return tuple(
        Transition(
            tenant=tenants.get(str(step.after), ""),
            source=str(step.after),
            target=str(step.adapter),
            probability=step.probability,
            support=0,
            delay_median_s=step.within_s / 2,
            delay_p10_s=0.0,
            declared=True,
        )
        for pipeline in pipelines.pipelines
        for step in pipeline.steps
        if step.after is not None
    )


def declared_logins(pipelines: Pipelines) -> tuple[LoginAffinity, ...]:
    """pipelines.yaml logins: each listed adapter is wanted at once (lead 0) when unlearned."""
    return tuple(
        LoginAffinity(
            tenant=str(tenant),
            adapter=str(adapter),
            probability=1.0,
            support=0,
            lead_median_s=0.0,
            lead_p10_s=0.0,
        )
        for tenant, adapters in pipelines.logins.items()
        for adapter in adapters
    )


def learn_events(
    log: RequestLog,
    *,
    pipelines: Pipelines | None = None,
    catalog: Catalog | None = None,
    window_s: float = 120.0,
) -> EventModels:
    """Transitions and logins from a per-request log, merged with pipelines.yaml."""
    declared = declared_transitions(pipelines, catalog) if pipelines else ()
    if log.aggregated or log.frame.empty:
        note = "the log is aggregated or empty: only declared pipelines and logins are used"
        return EventModels(
            transitions=declared,
            logins=declared_logins(pipelines) if pipelines else (),
            notes=(note,),
        )
    learned = learn_transitions(log.frame, window_s=window_s)
    logins = learn_logins(log.frame)
    learned_keys = {(login.tenant, login.adapter) for login in logins}
    extra = tuple(
        login
        for login in (declared_logins(pipelines) if pipelines else ())
        if (login.tenant, login.adapter) not in learned_keys
    )
    return EventModels(transitions=merge_declared(learned, declared), logins=logins + extra)


class ModelForecaster:
    """The controller's ``DemandForecaster`` port backed by ``models/``.

    Each call forecasts from ``start`` for ``duration_s`` and returns each adapter's mean
    and peak q90 rate over that window (``placement.forecast.demand.demand_from_forecast``).
    """

    def __init__(
        self,
        *,
        settings: ForecastSettings,
        catalog: Catalog | None = None,
        model: str = "auto",
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._model = model

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        forecast = self.forecast(history, start=start, duration_s=duration_s)
        return demand_from_forecast(
            forecast.frame, at=start, validity_s=duration_s, bucket_s=self._settings.bucket_s
        )

    def forecast(self, history: RequestLog, *, start: datetime, duration_s: int) -> Forecast:
        bucket_s = self._settings.bucket_s
        frame = history.counts(bucket_s) if history.aggregated else history.frame
        return forecast_demand(
            frame,
            at=start,
            horizon_s=max(duration_s + bucket_s, self._settings.horizon_s),
            bucket_s=bucket_s,
            timezones=timezones_of(self._catalog) if self._catalog else None,
            adapters=[str(a.name) for a in self._catalog.adapters] if self._catalog else (),
            model=self._model,
        )
