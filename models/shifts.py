"""Changes of level: an adapter that stopped, surged, dropped or appeared, at any origin.

A change is something the adapter has not done in the week before: its last hour's
mean is ``factor`` times above the highest (or below the lowest) mean of the same hour
on the 7 days before, or it is busy after a silent week (ending a day before the
origin). Such a change stays flagged for about a day, until yesterday's naive forecast
has seen the new level. An adapter has stopped while it is silent for at least ``quiet`` buckets
and longer than any silence in the week before this one began. Comparing with the
adapter's own range keeps a bursty adapter's usual swings (a busy adapter that pauses
for an hour, a batch that runs at night) from counting as changes.

``level_forecast`` is the forecast from the new level; ``models.select`` learns from its
backtest how far to follow it, and widens a changed adapter's band.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt
import pandas as pd

from models.experts import Lags
from models.series import FloatArray, IntArray


class Change(IntEnum):
    NONE = 0
    SURGED = 1
    DROPPED = 2
    STOPPED = 3
    APPEARED = 4


@dataclass(frozen=True, kw_only=True)
class ShiftRule:
    #: Buckets of the recent level (1 h of 10-minute buckets).
    window: int = 6
    #: A silence this long (6 h) is a stop if the week before never had one.
    quiet: int = 36
    #: The recent level must leave the week's range by this factor.
    factor: float = 3.0
    #: Requests in the recent window for a surge or an appearance to count.
    min_requests: float = 10.0
    days: int = 7


@dataclass(frozen=True, kw_only=True, eq=False)
class Shifts:
    """Per (origin, adapter): the kind of change, and the new level over the old one."""

    kind: npt.NDArray[np.int8]
    ratio: FloatArray
    level: FloatArray

    @property
    def changed(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.kind != Change.NONE)

    def take(self, rows: slice) -> Shifts:
        """The shifts at some of the origins."""
        return Shifts(kind=self.kind[rows], ratio=self.ratio[rows], level=self.level[rows])


def detect_shifts(lags: Lags, origins: IntArray, rule: ShiftRule | None = None) -> Shifts:
    """The change of level, if any, of every adapter at each origin (see the module)."""
    rule = rule or ShiftRule()
    per_day = lags.per_day
    span = rule.days * per_day
    hourly = _rolling_means(lags, rule.window)  # row e: mean of buckets [e - window, e)
    ref = np.clip(origins - per_day, 0, lags.n_buckets)  # the week ends a day before
    mean = _trailing(hourly, span, "mean")[ref]
    ever = _trailing(hourly, span, "max")[ref]
    same = _same_hour(hourly, origins, per_day, rule.days)  # (day, origin, adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no day known yet: NaN, no change
        hi, lo = np.nanmax(same, axis=0), np.nanmin(same, axis=0)
    recent = lags.level(origins, rule.window)
    busy = recent * rule.window >= rule.min_requests
    kind = np.zeros(recent.shape, dtype=np.int8)
    kind[(recent > rule.factor * hi) & busy] = Change.SURGED
    kind[(recent * rule.factor < lo) & (lo * rule.window >= rule.min_requests)] = Change.DROPPED
    kind[(ever <= 0) & busy] = Change.APPEARED
    kind[_stopped(lags, origins, rule)] = Change.STOPPED
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mean > 0, recent / mean, np.where(recent > 0, np.inf, 1.0))
    return Shifts(kind=kind, ratio=ratio, level=recent)


def _same_hour(hourly: FloatArray, origins: IntArray, per_day: int, days: int) -> FloatArray:
    """The hour's mean before each origin, 1 to ``days`` days earlier (NaN before the history)."""
    rows = origins[None, :] - per_day * np.arange(1, days + 1)[:, None]
    values = hourly[np.clip(rows, 0, None)]
    return np.where((rows >= 0)[..., None], values, np.nan)


def _stopped(lags: Lags, origins: IntArray, rule: ShiftRule) -> npt.NDArray[np.bool_]:
    """Silent for at least ``quiet`` buckets, longer than any silence in the week (and at
    least a day) before this one began, after ``min_requests`` in the ``quiet`` buckets
    before it.
    """
    rows = np.arange(lags.n_buckets + 1)[:, None]
    busy_end = np.where(np.vstack([np.zeros((1, lags.counts.shape[1])), lags.counts]) > 0, rows, 0)
    silence = rows - np.maximum.accumulate(busy_end, axis=0)  # row e: silent buckets before e
    longest = _trailing(silence.astype(np.float64), rule.days * lags.per_day, "max")
    now = silence[origins]
    began = origins[:, None] - now
    columns = np.arange(lags.counts.shape[1])[None, :]
    before = lags.cumsum[began, columns] - lags.cumsum[np.maximum(began - rule.quiet, 0), columns]
    seen_day = began >= lags.per_day  # a silence is only judged against a day or more
    return np.asarray(
        (now >= rule.quiet)
        & (now > longest[began, columns])
        & (before >= rule.min_requests)
        & seen_day
    )


def _rolling_means(lags: Lags, width: int) -> FloatArray:
    """Row e (0..n): the mean of buckets ``[e - width, e)``; NaN until a full window."""
    sums = lags.cumsum[width:] - lags.cumsum[:-width] if lags.n_buckets >= width else None
    out = np.full(lags.cumsum.shape, np.nan)
    if sums is not None:
        out[width:] = sums / width
    return out


def _trailing(values: FloatArray, span: int, how: str) -> FloatArray:
    """Row e: the statistic of rows ``(e - span, e]`` that are known (NaN if none)."""
    rolling = pd.DataFrame(values).rolling(span, min_periods=1)
    result = getattr(rolling, how)()
    return np.asarray(result.to_numpy(), dtype=np.float64)


def level_forecast(
    lags: Lags, origins: IntArray, shifts: Shifts, *, horizon: int, rule: ShiftRule | None = None
) -> FloatArray:
    """Forecasts ``(origin, step, adapter)`` from the new level, for changed adapters.

    Stopped: nothing. Appeared: its recent level, flat. Surged or dropped: the 7-day
    profile ahead times the new level over the profile's level in the same recent hour
    (flat at the new level where that profile is empty).
    """
    rows = lags.targets(origins, horizon)
    window = (rule or ShiftRule()).window
    local = origins - lags.t0
    expected = (lags.cum_mean[local] - lags.cum_mean[np.maximum(local - window, 0)]) / window
    recent = shifts.level
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(expected > 0, recent / expected, np.nan)
    profile = lags.mean_7d[rows]
    scaled = profile * np.nan_to_num(ratio, nan=0.0)[:, None, :]
    flat = np.repeat(recent[:, None, :], horizon, axis=1)
    usable = (np.isfinite(ratio) & (ratio <= 50.0))[:, None, :] & (profile.sum(axis=1) > 0)[
        :, None, :
    ]
    out = np.where(usable, scaled, flat)
    kind = shifts.kind[:, None, :]
    out = np.where(kind == Change.STOPPED, 0.0, out)
    return np.asarray(np.where(kind == Change.APPEARED, flat, out), dtype=np.float64)


def jumped(
    lags: Lags, origins: IntArray, *, factor: float, window: int, smooth: float
) -> npt.NDArray[np.bool_]:
    """Per (origin, adapter): the last bucket is ``factor`` times above or below the mean
    of the ``window`` buckets before it, both given one request and ``smooth`` times the
    adapter's 7-day mean per bucket (a request or two does not make a quiet adapter jump).
    """
    last = lags.counts[np.maximum(origins - 1, 0)]
    before = lags.level(np.maximum(origins - 1, 0), window)
    offset = smooth * lags.level(origins, 7 * lags.per_day) + 1.0
    ratio = (last + offset) / (before + offset)
    known = (origins - 1 - window >= 0)[:, None]
    return np.asarray(known & ((ratio > factor) | (ratio * factor < 1.0)))
