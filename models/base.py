"""The Forecaster protocol and the one output shape every model returns.

A forecaster is fitted once on a history panel and then predicts from any later
origin (the controller refits daily and predicts every few minutes; a backtest
does the same). Every prediction passes through :func:`sanitize`, so no model can
hand out a NaN, a negative rate or crossing quantiles.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from models.series import CountPanel, FloatArray

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, kw_only=True, eq=False)
class PanelForecast:
    """Per bucket ahead (rows) and adapter (columns): mean, quantiles, P(at least one)."""

    origin_s: int
    bucket_s: int
    adapters: tuple[str, ...]
    mean: FloatArray
    q50: FloatArray
    q90: FloatArray
    q99: FloatArray
    p_nonzero: FloatArray
    #: The model that produced each adapter's forecast (after any fallback or selection).
    model: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def horizon(self) -> int:
        return int(self.mean.shape[0])


class FittedForecaster(Protocol):
    """A model fitted on a history; predicts from the end of any later history."""

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast: ...


class Forecaster(Protocol):
    """Fit on a history panel; the fit may use the adapters' local calendars."""

    @property
    def name(self) -> str: ...

    def fit(self, history: CountPanel) -> FittedForecaster: ...


_EXACT_BELOW = 30.0
_Z = {0.5: 0.0, 0.9: 1.2815515655446004, 0.99: 2.3263478740408408}


def poisson_ppf(q: float, mean: FloatArray) -> FloatArray:
    """The q-quantile of a Poisson count: exact for small means, normal beyond."""
    safe = np.maximum(np.nan_to_num(mean, nan=0.0, posinf=0.0), 0.0)
    # Normal approximation with continuity correction where the mean is large.
    out = np.maximum(np.ceil(safe + _Z[q] * np.sqrt(safe) - 0.5), 0.0)
    small = safe < _EXACT_BELOW
    values = safe[small]
    ks = np.arange(0, int(3 * _EXACT_BELOW) + 1, dtype=np.float64)
    exact = np.empty_like(values)
    for start in range(0, len(values), 20_000):  # bounded memory for big panels
        chunk = values[start : start + 20_000, None]
        log_pmf = -chunk + ks * np.log(np.maximum(chunk, 1e-300)) - _log_fact(ks)
        cdf = np.cumsum(np.exp(log_pmf), axis=-1)
        exact[start : start + 20_000] = (cdf < q).sum(axis=-1)
    out[small] = exact
    return out


def _log_fact(ks: FloatArray) -> FloatArray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.maximum(ks[1:], 1.0)))])


def poisson_quantiles(mean: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Quantiles of a Poisson count with this mean: the floor of any honest band."""
    q50, q90, q99 = (poisson_ppf(q, mean) for q in QUANTILES)
    return q50, q90, q99


def clean_array(values: FloatArray) -> FloatArray:
    return np.maximum(np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0), 0.0)


def sanitize(forecast: PanelForecast) -> PanelForecast:
    """Finite, non-negative, monotone in the quantile, p_nonzero within [0, 1]."""
    mean = clean_array(forecast.mean)
    q50 = clean_array(forecast.q50)
    q90 = np.maximum(clean_array(forecast.q90), q50)
    q99 = np.maximum(clean_array(forecast.q99), q90)
    p_nonzero = np.clip(np.nan_to_num(forecast.p_nonzero, nan=0.0), 0.0, 1.0)
    # A positive mean with no chance of a request is a contradiction; keep a floor.
    p_nonzero = np.where(
        mean > 0, np.maximum(p_nonzero, 1.0 - np.exp(-np.minimum(mean, 1e-3))), 0.0
    )
    model = forecast.model or ("unknown",) * len(forecast.adapters)
    return PanelForecast(
        origin_s=forecast.origin_s,
        bucket_s=forecast.bucket_s,
        adapters=forecast.adapters,
        mean=mean,
        q50=q50,
        q90=q90,
        q99=q99,
        p_nonzero=p_nonzero,
        model=model,
        notes=forecast.notes,
    )


def from_samples(
    history: CountPanel, *, horizon: int, mean: FloatArray, samples: FloatArray, name: str
) -> PanelForecast:
    """A forecast whose band comes from past values (``samples``: draws x horizon x adapter).

    The band is widened to at least the Poisson band of the mean, and p_nonzero is the
    share of past draws with a request, smoothed towards the Poisson value.
    """
    pq50, pq90, pq99 = poisson_quantiles(mean)
    known = ~np.isnan(samples)
    draws = known.sum(axis=0)
    ordered = np.sort(samples, axis=0)  # NaN sorts last: the first ``draws`` rows are known
    q50 = np.where(draws > 0, _sorted_quantile(ordered, draws, 0.5), pq50)
    q90 = _sorted_quantile(ordered, draws, 0.9)
    q99 = _sorted_quantile(ordered, draws, 1.0)
    q90, q99 = np.maximum(q90, pq90), np.maximum(q99, pq99)
    seen = ((samples > 0) & known).sum(axis=0) if samples.size else np.zeros_like(mean)
    # The share of past draws with a request, with the Poisson value as one extra draw.
    p_nonzero = (seen + 1.0 - np.exp(-mean)) / (draws + 1.0)
    return PanelForecast(
        origin_s=history.end_s,
        bucket_s=history.bucket_s,
        adapters=history.adapters,
        mean=mean,
        q50=q50,
        q90=q90,
        q99=q99,
        p_nonzero=p_nonzero,
        model=(name,) * len(history.adapters),
    )


def _sorted_quantile(ordered: FloatArray, draws: np.ndarray, q: float) -> FloatArray:
    """The q-quantile (linear) of the first ``draws`` rows of each column; 0 with none."""
    if not ordered.shape[0]:
        return np.zeros(ordered.shape[1:])
    position = q * np.maximum(draws - 1, 0)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, np.maximum(draws - 1, 0))
    below = np.take_along_axis(ordered, low[None], axis=0)[0]
    above = np.take_along_axis(ordered, high[None], axis=0)[0]
    value = below + (above - below) * (position - low)
    return np.where(draws > 0, np.nan_to_num(value, nan=0.0), 0.0)
