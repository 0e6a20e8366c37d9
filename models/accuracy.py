"""Forecast error measures, pooled over adapters and buckets.

Pooling absolute errors over adapters weighs each adapter by its volume, which is
what placement cares about: a miss on a busy adapter costs more cold starts. Coverage
is over the adapters with a request on some scored cell (``Cells.live``).

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.series import FloatArray

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, kw_only=True)
class Scores:
    """Pooled errors of one model over one set of (bucket, adapter) cells."""

    points: int
    mae: float
    #: MAE divided by the MAE of persistence (last bucket before the origin) on the same cells.
    mae_vs_persistence: float
    #: MAE divided by the MAE of the same bucket one day earlier on the same cells.
    mae_vs_yesterday: float
    #: MAE divided by the MAE of the median of the same bucket over the last 7 days.
    mae_vs_median_7d: float
    #: MAE divided by the better of the two day-ahead naive forecasts (yesterday, median 7d).
    mae_vs_best_naive: float
    #: MAE divided by the in-sample MAE of the one-day seasonal naive forecast.
    mase: float
    wmape: float
    pinball_50: float
    pinball_90: float
    pinball_99: float
    coverage_90: float
    coverage_99: float


def mae(actual: FloatArray, predicted: FloatArray) -> float:
    return float(np.mean(np.abs(actual - predicted))) if actual.size else 0.0


def wmape(actual: FloatArray, predicted: FloatArray) -> float:
    total = float(np.sum(np.abs(actual)))
    return float(np.sum(np.abs(actual - predicted))) / total if total > 0 else 0.0


def pinball(actual: FloatArray, quantile: FloatArray, q: float) -> float:
    if not actual.size:
        return 0.0
    diff = actual - quantile
    return float(np.mean(np.maximum(q * diff, (q - 1.0) * diff)))


def coverage(actual: FloatArray, upper: FloatArray, live: BoolArray | None = None) -> float:
    """The share of cells at or under ``upper``; with ``live``, of those cells only."""
    if live is not None:
        actual, upper = actual[live], upper[live]
    return float(np.mean(actual <= upper)) if actual.size else 0.0


def ratio(numerator: float, denominator: float) -> float:
    """A ratio that stays finite: 1.0 when both are zero, and large but finite otherwise."""
    if denominator > 0:
        return numerator / denominator
    return 1.0 if numerator == 0 else float(np.finfo(np.float64).max)


def seasonal_mae(history: FloatArray, period: int) -> float:
    """In-sample MAE of the one-period seasonal naive forecast: the MASE denominator."""
    if history.shape[0] <= period:
        return mae(history[1:], history[:-1])
    return mae(history[period:], history[:-period])


@dataclass(frozen=True, kw_only=True, eq=False)
class Cells:
    """Stacked actuals and forecasts of a backtest (one row per bucket-adapter cell)."""

    actual: FloatArray
    mean: FloatArray
    q50: FloatArray
    q90: FloatArray
    q99: FloatArray
    persistence: FloatArray
    yesterday: FloatArray
    median_7d: FloatArray
    #: True where the cell's adapter has a request in some scored cell. Coverage counts
    #: these cells only: an adapter silent on every scored cell (one that stopped for
    #: good) is under any band whatever, so it says nothing of the band (None: all cells).
    live: BoolArray | None = None


def score(cells: Cells, *, scale_mae: float) -> Scores:
    """Every measure for one model on one set of cells."""
    model_mae = mae(cells.actual, cells.mean)
    yesterday = mae(cells.actual, cells.yesterday)
    median_7d = mae(cells.actual, cells.median_7d)
    return Scores(
        points=int(cells.actual.size),
        mae=model_mae,
        mae_vs_persistence=ratio(model_mae, mae(cells.actual, cells.persistence)),
        mae_vs_yesterday=ratio(model_mae, yesterday),
        mae_vs_median_7d=ratio(model_mae, median_7d),
        mae_vs_best_naive=ratio(model_mae, min(yesterday, median_7d)),
        mase=ratio(model_mae, scale_mae),
        wmape=wmape(cells.actual, cells.mean),
        pinball_50=pinball(cells.actual, cells.q50, 0.5),
        pinball_90=pinball(cells.actual, cells.q90, 0.9),
        pinball_99=pinball(cells.actual, cells.q99, 0.99),
        coverage_90=coverage(cells.actual, cells.q90, cells.live),
        coverage_99=coverage(cells.actual, cells.q99, cells.live),
    )
