"""Cheap point forecasts ("experts") of every adapter, from many origins at once.

The selecting model (``models.select``) scores these experts in a rolling-origin
backtest over the last days of the history, so each one must forecast hundreds of
origins for a thousand adapters in a fraction of a second: each is a lookup or a
window statistic over precomputed arrays (:class:`Lags`), vectorised over origins,
steps and adapters. Three are the naive forecasts every result is judged against:
persistence (the last bucket), the same bucket yesterday, and the median of the same
bucket over the last 7 days.

Steps past one day repeat the first day ahead (the same-bucket experts look back
whole days from the origin's first day).

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from models.series import FloatArray, IntArray

#: Every expert, in the order the selection reports them.
EXPERTS = (
    "persistence",
    "mean-3",
    "median-3",
    "median-6",
    "yesterday",
    "yesterday-near",
    "median-7d",
    "profile-7d",
    "recent-days",
    "anchored-median",
    "anchored-profile",
    "shaped-persistence",
)
#: The naive forecasts a blend is shrunk toward: within an hour, and beyond.
NAIVE_SHORT = ("persistence",)
NAIVE_DAY = ("yesterday", "median-7d")
DAYS = 7
#: Weight of the day k+1 days back in ``recent-days`` (yesterday 1, the day before 0.6, ...).
RECENT_DECAY = 0.6
#: Buckets of the recent level that re-anchors a profile (``anchored-*``): 6 h and 1 h.
ANCHOR_PROFILE = 36
ANCHOR_MEDIAN = 6
#: A re-anchored profile moves at most this many times above its past level.
MAX_RATIO = 20.0
#: ``shaped-persistence`` reads the 7-day profile smoothed over +-this many buckets.
SHAPE_WIDTH = 2


@dataclass(frozen=True, kw_only=True, eq=False)
class Lags:
    """Per-bucket statistics of a history, for buckets ``first`` to one day past its end.

    ``same`` statistics at bucket t read the same bucket on the 7 days before t (those
    inside the history); ``t0`` is the first bucket they are kept for.
    """

    counts: FloatArray
    per_day: int
    t0: int
    cumsum: FloatArray
    yesterday: FloatArray
    median_7d: FloatArray
    mean_7d: FloatArray
    recent_days: FloatArray
    nonzero_7d: FloatArray
    days_known: FloatArray
    cum_median: FloatArray
    cum_mean: FloatArray

    @classmethod
    def of(cls, counts: FloatArray, *, per_day: int, first: int) -> Lags:
        """Statistics from bucket ``first`` (less the longest anchor window) on."""
        n, n_adapters = counts.shape
        t0 = max(0, min(first, n) - ANCHOR_PROFILE)
        rows = np.arange(t0, n + per_day)
        same = np.full((DAYS, len(rows), n_adapters), np.nan)
        for k in range(DAYS):
            back = rows - (k + 1) * per_day
            ok = (back >= 0) & (back < n)
            same[k, ok] = counts[back[ok]]
        known = ~np.isnan(same)
        days_known = known.sum(axis=0).astype(np.float64)
        weights = RECENT_DECAY ** np.arange(DAYS)[:, None, None]
        filled = np.nan_to_num(same)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no day known yet: 0 below
            median = np.nan_to_num(np.nanmedian(same, axis=0))
        mean = filled.sum(axis=0) / np.maximum(days_known, 1.0)
        return cls(
            counts=counts,
            per_day=per_day,
            t0=t0,
            cumsum=_cumsum(counts),
            yesterday=filled[0],
            median_7d=median,
            mean_7d=mean,
            recent_days=(filled * weights).sum(axis=0) / np.maximum((known * weights).sum(0), 1e-9),
            nonzero_7d=((filled > 0).sum(axis=0) / np.maximum(days_known, 1.0)),
            days_known=days_known,
            cum_median=_cumsum(median),
            cum_mean=_cumsum(mean),
        )

    @property
    def n_buckets(self) -> int:
        return int(self.counts.shape[0])

    def window_sum(self, origins: IntArray, width: int) -> FloatArray:
        """Requests in the ``width`` buckets before each origin: ``(origins, adapters)``."""
        return self.cumsum[origins] - self.cumsum[np.maximum(origins - width, 0)]

    def level(self, origins: IntArray, width: int) -> FloatArray:
        """The mean per bucket over the ``width`` buckets before each origin."""
        width_known = np.clip(np.minimum(origins, width), 1, None)[:, None]
        return np.asarray(self.window_sum(origins, width) / width_known, dtype=np.float64)

    def targets(self, origins: IntArray, horizon: int) -> IntArray:
        """Row of each (origin, step) in the same-bucket arrays; past a day, the first day."""
        steps = np.arange(horizon) % self.per_day
        return origins[:, None] + steps[None, :] - self.t0


def _cumsum(values: FloatArray) -> FloatArray:
    return np.vstack([np.zeros((1, values.shape[1])), np.cumsum(values, axis=0)])


def expert_means(
    lags: Lags, origins: IntArray, *, horizon: int, names: tuple[str, ...] = EXPERTS
) -> FloatArray:
    """Mean forecasts ``(expert, origin, step, adapter)`` of the named experts."""
    out = np.empty((len(names), len(origins), horizon, lags.counts.shape[1]))
    rows = lags.targets(origins, horizon)
    for index, name in enumerate(names):
        out[index] = _expert(lags, name, origins, rows, horizon)
    return out


def _expert(lags: Lags, name: str, origins: IntArray, rows: IntArray, horizon: int) -> FloatArray:
    if name == "persistence":
        return _flat(lags.counts[np.maximum(origins - 1, 0)], horizon)
    if name == "mean-3":
        return _flat(lags.level(origins, 3), horizon)
    if name.startswith("median-") and name != "median-7d":
        width = int(name.split("-")[1])
        back = np.maximum(origins[None, :] - np.arange(1, width + 1)[:, None], 0)
        return _flat(np.asarray(np.median(lags.counts[back], axis=0)), horizon)
    table = {
        "yesterday": lags.yesterday,
        "median-7d": lags.median_7d,
        "profile-7d": lags.mean_7d,
        "recent-days": lags.recent_days,
    }
    if name in table:
        return np.asarray(table[name][rows], dtype=np.float64)
    if name == "yesterday-near":
        return _yesterday_near(lags, origins, horizon)
    if name == "anchored-median":
        return anchored(lags, origins, rows, profile="median", width=ANCHOR_MEDIAN)
    if name == "anchored-profile":
        return anchored(lags, origins, rows, profile="mean", width=ANCHOR_PROFILE)
    if name == "shaped-persistence":
        return shaped_persistence(lags, origins, rows)
    raise KeyError(f"unknown expert {name!r}; known: {', '.join(EXPERTS)}")


def _yesterday_near(lags: Lags, origins: IntArray, horizon: int, *, width: int = 2) -> FloatArray:
    """The mean of yesterday's buckets within ``width`` of the same bucket (before the origin):
    yesterday, less its bucket-to-bucket noise.
    """
    target = origins[:, None] + np.arange(horizon)[None, :] % lags.per_day - lags.per_day
    low = np.clip(target - width, 0, None)
    high = np.clip(np.minimum(target + width + 1, origins[:, None]), low + 1, lags.n_buckets)
    total = lags.cumsum[high] - lags.cumsum[low]
    known = (target >= 0)[..., None]
    return np.where(known, total / (high - low)[..., None], 0.0)


def _flat(level: FloatArray, horizon: int) -> FloatArray:
    return np.repeat(level[:, None, :], horizon, axis=1)


def anchored(
    lags: Lags, origins: IntArray, rows: IntArray, *, profile: str, width: int
) -> FloatArray:
    """A 7-day profile ahead, times the ratio of the last ``width`` buckets to that profile.

    The ratio is smoothed by half a window of the adapter's 7-day mean (a quiet adapter
    is not rescaled by one request) and capped; an adapter with no profile ahead (a new
    one) gets its recent level, flat.
    """
    values, cum = (
        (lags.median_7d, lags.cum_median)
        if profile == "median"
        else (
            lags.mean_7d,
            lags.cum_mean,
        )
    )
    local = origins - lags.t0
    expected = cum[local] - cum[np.maximum(local - width, 0)]
    actual = lags.window_sum(origins, width)
    smooth = 0.5 * width * lags.level(origins, DAYS * lags.per_day) + 1e-9
    ratio = np.minimum((actual + smooth) / (expected + smooth), MAX_RATIO)
    ahead = values[rows] * ratio[:, None, :]
    no_profile = values[rows].sum(axis=1, keepdims=True) <= 0
    recent = _flat(actual / width, rows.shape[1])
    return np.where(no_profile, recent, ahead)


def shaped_persistence(lags: Lags, origins: IntArray, rows: IntArray) -> FloatArray:
    """The last bucket, moved along the adapter's daily shape: times the smoothed 7-day
    profile ahead over the same profile at the last bucket.

    The profile is the same-bucket 7-day mean, averaged over +-``SHAPE_WIDTH`` buckets;
    both ends of the ratio get half the adapter's 7-day mean per bucket (one request does
    not rescale a quiet adapter), and the ratio is capped. Without a past day the ratio
    is 1: persistence.
    """
    cum, last = lags.cum_mean, len(lags.cum_mean) - 1

    def smoothed(local: IntArray) -> FloatArray:
        low = np.clip(local - SHAPE_WIDTH, 0, last)
        high = np.clip(local + SHAPE_WIDTH + 1, 0, last)
        total = cum[high] - cum[low]
        return np.asarray(total / np.maximum(high - low, 1)[..., None], dtype=np.float64)

    ahead = smoothed(rows)  # (origin, step, adapter)
    now = smoothed(origins - 1 - lags.t0)[:, None, :]
    smooth = 0.5 * lags.level(origins, DAYS * lags.per_day)[:, None, :] + 1e-9
    ratio = np.clip((ahead + smooth) / (now + smooth), 1.0 / MAX_RATIO, MAX_RATIO)
    last_bucket = lags.counts[np.maximum(origins - 1, 0)][:, None, :]
    return np.asarray(last_bucket * ratio, dtype=np.float64)
