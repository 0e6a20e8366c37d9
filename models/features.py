"""Lag, rolling and calendar features for the global model, at any (adapter, origin, step).

A row describes "forecast adapter a, ``step`` buckets after an origin whose history
ends at bucket ``origin``": only buckets before the origin are read, so training
rows drawn from the past see exactly what a live forecast would see. Values are
divided by the adapter's recent scale so that one model serves adapters whose
volumes differ by orders of magnitude; the scale itself is a feature.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from models.series import CountPanel, FloatArray, IntArray

FEATURE_NAMES = (
    "step",
    "minute_of_day",
    "weekday",
    "log_scale",
    "last",
    "mean_3",
    "mean_6",
    "mean_36",
    "mean_day",
    "yesterday",
    "yesterday_at_origin",
    "yesterday_near",
    "last_week",
    "median_7d",
    "mean_7d",
    "nonzero_7d",
    "nonzero_day",
    "age_days",
    "median_3",
    "median_12",
)


@dataclass(frozen=True, kw_only=True, eq=False)
class LagTable:
    """A history padded with NaN in front, with running sums for window means."""

    padded: FloatArray
    pad: int
    per_day: int
    sums: FloatArray
    valid: FloatArray
    nonzero: FloatArray
    first_seen: IntArray

    @classmethod
    def of(cls, history: CountPanel) -> LagTable:
        per_day = history.per_day()
        pad = 9 * per_day
        n_adapters = len(history.adapters)
        padded = np.vstack([np.full((pad, n_adapters), np.nan), history.counts])
        sums = np.vstack([np.zeros((1, n_adapters)), np.cumsum(np.nan_to_num(padded), axis=0)])
        valid = np.vstack([np.zeros((1, n_adapters)), np.cumsum(~np.isnan(padded), axis=0)])
        nonzero = np.vstack([np.zeros((1, n_adapters)), np.cumsum(padded > 0, axis=0)])
        seen = history.counts > 0
        first_seen = np.where(seen.any(axis=0), seen.argmax(axis=0), history.n_buckets)
        return cls(
            padded=padded,
            pad=pad,
            per_day=per_day,
            sums=sums,
            valid=valid,
            nonzero=nonzero,
            first_seen=first_seen,
        )

    def at(self, index: IntArray, adapter: IntArray) -> FloatArray:
        """Values at history bucket ``index`` (NaN before the history starts)."""
        return self.padded[np.maximum(index + self.pad, 0), adapter]

    def window_mean(
        self, end: IntArray, width: int, adapter: IntArray, *, nonzero: bool = False
    ) -> FloatArray:
        """Mean (or share of nonzero) of buckets ``[end - width, end)``; NaN if none known."""
        hi = end + self.pad
        lo = np.maximum(hi - width, 0)
        count = self.valid[hi, adapter] - self.valid[lo, adapter]
        sums = self.nonzero if nonzero else self.sums
        total = sums[hi, adapter] - sums[lo, adapter]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def scale_of(table: LagTable, origin: IntArray, adapter: IntArray) -> FloatArray:
    """The adapter's mean per bucket over the week before the origin, floored at 1/day."""
    week = table.window_mean(origin, 7 * table.per_day, adapter)
    return np.maximum(np.nan_to_num(week, nan=0.0), 1.0 / table.per_day)


def build_features(
    table: LagTable,
    *,
    adapter: IntArray,
    origin: IntArray,
    step: IntArray,
    minute: IntArray,
    weekday: IntArray,
) -> tuple[FloatArray, FloatArray]:
    """Feature rows and each row's base (see :func:`base_of`) for (adapter, origin, step).

    ``step`` counts from 1 (the first bucket after the origin); ``minute`` and
    ``weekday`` are the calendar of each row's target bucket in the adapter's zone.
    """
    per_day = table.per_day
    target = origin + step - 1
    scale = scale_of(table, origin, adapter)
    days_back = (step - 1) // per_day + 1
    yesterday_index = target - days_back * per_day
    same = np.stack([table.at(yesterday_index - k * per_day, adapter) for k in range(7)], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN on purpose
        median_7d = np.nanmedian(same, axis=1)
        mean_7d = np.nanmean(same, axis=1)
        nonzero_7d = np.nanmean(np.where(np.isnan(same), np.nan, same > 0), axis=1)
    # Yesterday around the target bucket, smoothed over three buckets (never past the origin).
    near = table.window_mean(np.minimum(yesterday_index + 2, origin), 3, adapter)
    week_back = (step - 1) // (7 * per_day) + 1
    age = np.where(table.first_seen[adapter] < origin, origin - table.first_seen[adapter], 0)
    columns = [
        step.astype(np.float64),
        minute.astype(np.float64),
        weekday.astype(np.float64),
        np.log10(scale),
        table.at(origin - 1, adapter) / scale,
        table.window_mean(origin, 3, adapter) / scale,
        table.window_mean(origin, 6, adapter) / scale,
        table.window_mean(origin, 36, adapter) / scale,
        table.window_mean(origin, per_day, adapter) / scale,
        same[:, 0] / scale,
        table.at(origin - 1 - per_day, adapter) / scale,
        near / scale,
        table.at(target - week_back * 7 * per_day, adapter) / scale,
        median_7d / scale,
        mean_7d / scale,
        nonzero_7d,
        table.window_mean(origin, per_day, adapter, nonzero=True),
        np.minimum(age / per_day, 14.0),
        # Recent medians: a bursty adapter's level without its last spike.
        _recent_median(table, origin, adapter, 3) / scale,
        _recent_median(table, origin, adapter, 12) / scale,
    ]
    return np.column_stack(columns), base_of(scale, mean_7d, table.window_mean(origin, 3, adapter))


def base_of(scale: FloatArray, profile: FloatArray, level: FloatArray) -> FloatArray:
    """Each row's reference value: the target is modelled as a multiple of it.

    Half the 7-day same-bucket mean, half the last half hour, each standing in for the
    other when unknown, and floored at a tenth of the weekly scale so that a quiet
    bucket of a busy adapter cannot blow the ratio up.
    """
    profile = np.where(np.isnan(profile), level, profile)
    level = np.where(np.isnan(level), profile, level)
    blended = np.nan_to_num(0.5 * profile + 0.5 * level, nan=0.0)
    return np.maximum(blended, 0.1 * scale)


def _recent_median(table: LagTable, origin: IntArray, adapter: IntArray, width: int) -> FloatArray:
    values = np.stack([table.at(origin - k, adapter) for k in range(1, width + 1)], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no history yet: NaN, which HGB handles
        return np.asarray(np.nanmedian(values, axis=1), dtype=np.float64)
