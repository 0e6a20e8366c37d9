"""The ``auto`` model's settings (``SelectionSettings``) and its fitted form
(``FittedSelection``): the weights, bands and change rules ``Selecting.fit``
(``models.select``) learned, and the forecast from them at the origin.

The settings live here, not with the fit, so that the fitted model reads them without
importing the fitting module back: ``models.select`` imports this module, never the
other way.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from models.bands import day_phase, first_hour_ratios, widened
from models.base import PanelForecast, poisson_quantiles
from models.experts import EXPERTS, Lags, expert_means
from models.series import CountPanel, FloatArray, IntArray
from models.shifts import Change, ShiftRule, Shifts, detect_shifts, jumped, level_forecast

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, kw_only=True)
class SelectionSettings:
    """What ``Selecting`` (``models.select``) fits by; see that module for the method."""

    name: str = "auto"
    #: Upper edges (in steps) of the horizon bands; the last band runs to the horizon.
    #: The first band is stacked step by step, the others band by band.
    band_edges: tuple[int, ...] = (6, 36)
    #: Stacked experts of the first band (the first is its naive forecast) and beyond
    #: (the first two are the naive ones).
    short_experts: tuple[str, ...] = (
        "persistence",
        "mean-3",
        "median-6",
        "shaped-persistence",
    )
    day_experts: tuple[str, ...] = ("yesterday", "median-7d", "yesterday-near", "recent-days")
    #: Stacking weights move in steps of 1/grid.
    short_grid: int = 5
    day_grid: int = 5
    days: int = 7
    short_every: int = 1
    long_every: int = 12
    #: The t statistic at which the stack gets all the weight (none at 0 or below), past
    #: the first band and in it.
    z_full: float = 2.0
    z_short: float = 0.5
    #: The naive target mixes the naive forecasts by 1/error**naive_power (None: the best).
    naive_power: float | None = 2.0
    #: Days of history before the bands past the first are selected at all.
    min_days: int = 3
    #: Buckets of history (and of an adapter's life) before the first band is selected.
    min_short: int = 24
    #: Within the first band (``band_edges[0]`` buckets, the first hour) the band follows
    #: the forecast through the day: its scale goes as the forecast over the adapter's
    #: typical level, to this power.
    band_power: float = 0.5
    #: The same power past the first band: a day's volume moves as one factor, so the
    #: error of a day-ahead forecast grows with the forecast itself.
    day_band_power: float = 1.0
    #: Past the first hour, the band is calibrated this share of the way from its level
    #: (0.9, 0.99) to 1: a day's errors share one shock, so the backtest's days are few.
    day_margin: float = 0.5
    #: The first hour's band, calibrated this share of the way from its level to 1: its
    #: backtest origins run back to back, so their errors share a few hours' shocks and
    #: the band from them came out narrow (q90 0.79-0.86 on held-out dev days).
    short_margin: float = 0.1
    #: The first hour's steady factor is calibrated per hour of day of the origin (each
    #: hour's own quantile, from at least this many backtest cells; fewer: the pooled
    #: factor), since its errors are not the same through the day. None: pooled only.
    hourly_min_cells: int | None = 200
    #: True: the first hour's steps past a day boundary that the history has not reached
    #: get their own steady factor, from the backtest's cells past one (a new day's
    #: volume can differ from the last day's by half, and no bucket before midnight
    #: shows it). Days are UTC days. Off by default: on the perturbed m-mid it lifted
    #: the midnight origins' q90 but took 4 of 42 traces above 0.95 (docs/benchmarks.md).
    #: False: those steps keep their origin's hour of day.
    boundary_band: bool = False
    #: Share of traffic that makes an adapter's cells count for the band's factors.
    busy_share: float = 0.01
    #: Changed (origin, step, adapter) cells below which the changed factor is a default.
    min_changes: int = 60
    #: The last bucket has jumped when it is this many times above (or below) the mean
    #: of the ``jump_window`` buckets before it (both ends given one request and
    #: ``jump_smooth`` times the adapter's mean per bucket). After a jump the first
    #: hour's stack keeps its trust only where it beat persistence over the backtest's
    #: jumps of that adapter (None: no such check).
    jump_factor: float | None = 3.0
    jump_window: int = 3
    jump_smooth: float = 0.5
    #: Backtest jumps an adapter needs for its own evidence; with fewer, the busy
    #: adapters' pooled evidence.
    min_jumps: int = 6
    #: The t statistic (of the stack's advantage right after jumps) that keeps or drops
    #: all of its trust after a jump; half of it at 0.
    z_jump: float = 2.0
    shift_rule: ShiftRule = field(default_factory=ShiftRule)


def jump_mask(settings: SelectionSettings, lags: Lags, origins: IntArray) -> BoolArray:
    """Per (origin, adapter): the last bucket jumped (never without a ``jump_factor``)."""
    if settings.jump_factor is None:
        return np.zeros((len(origins), lags.counts.shape[1]), dtype=bool)
    return jumped(
        lags,
        origins,
        factor=settings.jump_factor,
        window=settings.jump_window,
        smooth=settings.jump_smooth,
    )


def typical(lags: Lags, days: int) -> FloatArray:
    """Each adapter's mean per bucket over the last ``days`` days."""
    end = np.array([lags.n_buckets], dtype=np.int64)
    return np.asarray(lags.level(end, days * lags.per_day)[0], dtype=np.float64)


@dataclass(frozen=True, kw_only=True, eq=False)
class FittedSelection:
    settings: SelectionSettings
    #: ``(unit, expert, adapter)``: weights per step of the first band, then per band.
    weights: FloatArray
    #: ``(step, expert, adapter)``: the first band's weights for an adapter whose last
    #: bucket jumped.
    jump_weights: FloatArray
    #: ``(band, adapter)``: the mean absolute error of the selected forecast in the backtest.
    scale: FloatArray
    #: ``(band, level, [steady, changed])``: q90 and q99 are mean + factor x scale.
    factors: FloatArray
    #: ``(band, [stopped, other])``: how far a changed adapter follows its new level.
    follow: FloatArray
    #: ``(group, level)``: the first band's steady factor at an origin in that hour of
    #: day (0-23) or past a day boundary (``models.bands.BOUNDARY``; NaN where too few
    #: backtest cells were past one: the hour's factor), over the pooled one.
    hourly: FloatArray
    adapters: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        if history.adapters != self.adapters:
            raise ValueError(f"{self.settings.name}: fitted on other adapters than these")
        rule = self.settings.shift_rule
        lags = Lags.of(history.counts, per_day=history.per_day(), first=history.n_buckets)
        origin = np.array([history.n_buckets], dtype=np.int64)
        either = self.weights.any(axis=(0, 2)) | self.jump_weights.any(axis=(0, 2))
        used = tuple(EXPERTS[e] for e in np.flatnonzero(either))
        means = expert_means(lags, origin, horizon=horizon, names=used)[:, 0]
        steps = np.arange(1, horizon + 1)
        band = np.searchsorted(self.settings.band_edges, steps, side="left")
        first = self.settings.band_edges[0]
        unit = np.where(steps <= first, steps - 1, first + band - 1)
        short = steps <= first
        jump = jump_mask(self.settings, lags, origin)[0]  # (adapter,)
        weights = self.weights[unit]
        weights[short] = np.where(
            jump[None, None, :], self.jump_weights[unit[short]], weights[short]
        )
        chosen = weights[:, [EXPERTS.index(name) for name in used]]  # (h, e, a)
        mean = np.einsum("eha,hea->ha", means, chosen)
        shifts = detect_shifts(lags, origin, rule)
        changed = shifts.changed[0][None, :]
        level = level_forecast(lags, origin, shifts, horizon=horizon, rule=rule)[0]
        kind = np.broadcast_to(shifts.kind[0][None, :], mean.shape)
        follow = self.follow[band]  # (step, [stopped, other])
        weight = np.where(
            kind == Change.STOPPED, follow[:, :1], np.where(kind != 0, follow[:, 1:], 0.0)
        )
        mean = weight * level + (1.0 - weight) * mean
        sigma = widened(
            self.scale[band],
            changed,
            shifts.ratio[0][None, :],
            shifts.level[0][None, :],
            mean=mean,
            typical=typical(lags, self.settings.days)[None, :],
            power=np.where(steps <= first, self.settings.band_power, self.settings.day_band_power)[
                :, None
            ],
        )
        which = changed.astype(np.int64)
        factor = np.take_along_axis(self.factors[band], which[:, None, :].repeat(2, axis=1), axis=2)
        hour = np.ones((horizon, factor.shape[1]))
        hour[short] = first_hour_ratios(
            self.hourly,
            history.n_buckets,
            int(short.sum()),
            per_day=history.per_day(),
            phase=day_phase(history.start_s, history.bucket_s),
            boundary=self.settings.boundary_band,
        )  # (step, level)
        factor = np.where(~changed[:, None, :], factor * hour[:, :, None], factor)
        _, pq90, pq99 = poisson_quantiles(mean)
        q90 = np.maximum(mean + factor[:, 0] * sigma, pq90)
        q99 = np.maximum(mean + factor[:, 1] * sigma, np.maximum(pq99, q90))
        return PanelForecast(
            origin_s=history.end_s,
            bucket_s=history.bucket_s,
            adapters=history.adapters,
            mean=mean,
            q50=mean,
            q90=q90,
            q99=q99,
            p_nonzero=_p_nonzero(lags, origin, mean, changed),
            model=self._model_names(unit, shifts),
            notes=self.notes + _shift_notes(self.settings.name, history.adapters, shifts),
        )

    def _model_names(self, unit: IntArray, shifts: Shifts) -> tuple[str, ...]:
        """Each adapter's heaviest expert over the horizon, or the change it is following."""
        heaviest = self.weights[unit].sum(axis=0).argmax(axis=0)
        names = [f"{self.settings.name}:{EXPERTS[int(i)]}" for i in heaviest]
        for column in np.flatnonzero(shifts.changed[0]):
            kind = Change(int(shifts.kind[0, column])).name.lower()
            names[column] = f"{self.settings.name}:{kind}"
        return tuple(names)


def _p_nonzero(lags: Lags, origin: IntArray, mean: FloatArray, changed: BoolArray) -> FloatArray:
    """The share of the last 7 days with a request in the bucket, the Poisson value of the
    mean counting as one more day; after a change of level, the Poisson value alone.
    """
    rows = lags.targets(origin, mean.shape[0])[0]
    days = lags.days_known[rows]
    poisson = 1.0 - np.exp(-mean)
    past = (lags.nonzero_7d[rows] * days + poisson) / (days + 1.0)
    return np.asarray(np.where(changed, poisson, past), dtype=np.float64)


def _shift_notes(name: str, adapters: tuple[str, ...], shifts: Shifts) -> tuple[str, ...]:
    notes = []
    for kind in (Change.STOPPED, Change.SURGED, Change.DROPPED, Change.APPEARED):
        columns = np.flatnonzero(shifts.kind[0] == kind)
        if len(columns):
            listed = ", ".join(adapters[c] for c in columns[:5])
            more = f" and {len(columns) - 5} more" if len(columns) > 5 else ""
            notes.append(
                f"{name}: {kind.name.lower()}: {listed}{more}; forecast from the new level"
            )
    return tuple(notes)
