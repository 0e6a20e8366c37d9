"""Baseline forecasters: persistence, seasonal naive, EWMA, same-bucket median.

These are the yardsticks a real model must beat in a backtest, and the fallbacks
for adapters with too little history for anything else. Each one has nothing to
fit; its band comes from the past values it summarises, never narrower than a
Poisson band around its mean.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from models.base import PanelForecast, from_samples
from models.series import CountPanel, FloatArray


def same_bucket(history: CountPanel, *, horizon: int, period: int, draws: int) -> FloatArray:
    """Past values at the same phase of ``period`` for each bucket ahead.

    Returns ``(draws, horizon, adapters)``: draw k holds the value k+1 periods before
    the most recent past occurrence of that phase; NaN where the history is too short.
    """
    n = history.n_buckets
    steps = np.arange(horizon)
    first_back = steps // period + 1  # periods back to land before the origin
    out = np.full((draws, horizon, len(history.adapters)), np.nan)
    for k in range(draws):
        index = n + steps - (first_back + k) * period
        ok = index >= 0
        out[k, ok] = history.counts[index[ok]]
    return out


def recent(history: CountPanel, n_buckets: int) -> FloatArray:
    """The last ``n_buckets`` rows of history (fewer if the history is shorter)."""
    return history.counts[max(0, history.n_buckets - n_buckets) :]


def _nanmean(values: FloatArray, axis: int) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns become 0 below
        return np.asarray(np.nan_to_num(np.nanmean(values, axis=axis), nan=0.0), dtype=np.float64)


def _nanmedian(values: FloatArray, axis: int) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(np.nanmedian(values, axis=axis), nan=0.0)


def _level_draws(history: CountPanel, horizon: int, window: int) -> FloatArray:
    """Recent values as draws for every bucket ahead: the band of a level forecast."""
    tail = recent(history, window)
    return np.repeat(tail[:, None, :], horizon, axis=1)


@dataclass(frozen=True, kw_only=True)
class Persistence:
    """The last bucket before the origin, repeated: the baseline to beat at short horizons."""

    name: str = "persistence"
    band_buckets: int = 36

    def fit(self, history: CountPanel) -> Persistence:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        last = recent(history, 1)
        mean = np.repeat(last[-1:] if len(last) else np.zeros((1, 0)), horizon, axis=0)
        draws = _level_draws(history, horizon, self.band_buckets)
        return from_samples(history, horizon=horizon, mean=mean, samples=draws, name=self.name)


@dataclass(frozen=True, kw_only=True)
class SeasonalNaive:
    """The same bucket one period ago (a day, or a week with ``period_days=7``)."""

    period_days: int = 1
    name: str = "seasonal-naive-day"

    def fit(self, history: CountPanel) -> SeasonalNaive:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        period = self.period_days * history.per_day()
        past = same_bucket(history, horizon=horizon, period=period, draws=1)
        mean = np.nan_to_num(past[0], nan=0.0)
        band = same_bucket(history, horizon=horizon, period=history.per_day(), draws=7)
        return from_samples(history, horizon=horizon, mean=mean, samples=band, name=self.name)


@dataclass(frozen=True, kw_only=True)
class SameBucketMedian:
    """The median of the same bucket over the last ``days`` days: robust to one odd day."""

    days: int = 7
    name: str = "median-7d"

    def fit(self, history: CountPanel) -> SameBucketMedian:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        past = same_bucket(history, horizon=horizon, period=history.per_day(), draws=self.days)
        mean = _nanmedian(past, axis=0)
        return from_samples(history, horizon=horizon, mean=mean, samples=past, name=self.name)


@dataclass(frozen=True, kw_only=True)
class Ewma:
    """An exponentially weighted mean of the recent buckets, flat over the horizon."""

    alpha: float = 0.3
    name: str = "ewma"
    band_buckets: int = 36

    def fit(self, history: CountPanel) -> Ewma:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        tail = recent(history, max(1, int(np.ceil(20 / self.alpha))))
        weights = (1.0 - self.alpha) ** np.arange(len(tail))[::-1]
        level = (
            (tail * weights[:, None]).sum(axis=0) / weights.sum()
            if len(tail)
            else np.zeros(len(history.adapters))
        )
        mean = np.repeat(level[None, :], horizon, axis=0)
        draws = _level_draws(history, horizon, self.band_buckets)
        return from_samples(history, horizon=horizon, mean=mean, samples=draws, name=self.name)


@dataclass(frozen=True, kw_only=True)
class DailyProfile:
    """The mean of the same bucket over the last ``days`` days: the sparse adapters' model.

    Unlike the median it keeps a small positive rate for an adapter with a few requests
    a day at that hour, so p_nonzero is not a hard zero.
    """

    days: int = 7
    name: str = "profile-7d"

    def fit(self, history: CountPanel) -> DailyProfile:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        past = same_bucket(history, horizon=horizon, period=history.per_day(), draws=self.days)
        mean = _nanmean(past, axis=0)
        return from_samples(history, horizon=horizon, mean=mean, samples=past, name=self.name)


BASELINES = (
    Persistence(),
    SeasonalNaive(),
    SeasonalNaive(period_days=7, name="seasonal-naive-week"),
    Ewma(),
    SameBucketMedian(),
    DailyProfile(),
)


@dataclass(frozen=True, kw_only=True)
class LevelProfile:
    """The 7-day daily profile rescaled to the level of the last buckets.

    Persistence with the day's shape: the recent actuals over the profile at the same
    buckets gives a level ratio, shrunk towards 1 as the step grows (``decay`` per step),
    and that ratio multiplies the profile ahead. Beats persistence when the day turns.
    """

    days: int = 7
    window: int = 3
    decay: float = 0.985
    name: str = "level-profile"

    def fit(self, history: CountPanel) -> LevelProfile:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        per_day = history.per_day()
        past = same_bucket(history, horizon=horizon, period=per_day, draws=self.days)
        profile = _nanmean(past, axis=0)
        window = min(self.window, history.n_buckets)
        earlier = (
            history.head(history.n_buckets - window) if history.n_buckets > window else history
        )
        recent_profile = _nanmean(
            same_bucket(earlier, horizon=window, period=per_day, draws=self.days), axis=0
        ).sum(axis=0)
        recent_actual = recent(history, window).sum(axis=0)
        level = (recent_actual + 1.0) / (recent_profile + 1.0)
        shrink = self.decay ** np.arange(1, horizon + 1)[:, None]
        mean = profile * level[None, :] ** shrink
        # With no profile at all (young adapter), fall back to the recent level; so too
        # at a step whose bucket no past day holds (a history under a day: the hours
        # ahead of it have never been seen, which is not the same as seen empty).
        flat = recent_actual / max(window, 1)
        seen = ~np.all(np.isnan(past), axis=0)
        has_profile = profile.sum(axis=0, keepdims=True) > 0
        mean = np.where(has_profile & seen, mean, flat[None, :])
        return from_samples(
            history, horizon=horizon, mean=mean, samples=past * level[None, None, :], name=self.name
        )


@dataclass(frozen=True, kw_only=True)
class RecentMedian:
    """The median of the last ``window`` buckets, flat: a bursty adapter's level."""

    window: int = 6
    name: str = "recent-median"

    def fit(self, history: CountPanel) -> RecentMedian:
        return self

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        tail = recent(history, self.window)
        level = np.median(tail, axis=0) if len(tail) else np.zeros(len(history.adapters))
        mean = np.repeat(level[None, :], horizon, axis=0)
        draws = _level_draws(history, horizon, max(self.window, 12))
        return from_samples(history, horizon=horizon, mean=mean, samples=draws, name=self.name)
