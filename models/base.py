"""The Forecaster protocol and the one output shape every model returns.

A forecaster is fitted once on a history panel and then predicts from any later
origin (the controller refits daily and predicts every few minutes; a backtest
does the same). Every prediction passes through :func:`sanitize`, so no model can
hand out a NaN, a negative rate or crossing quantiles.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import warnings
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # cells with no past draw: NaN, floored
        q50 = np.nan_to_num(np.nanquantile(samples, 0.5, axis=0), nan=0.0) if samples.size else pq50
        q90 = np.nan_to_num(np.nanquantile(samples, 0.9, axis=0), nan=0.0) if samples.size else pq90
        q99 = np.nan_to_num(np.nanmax(samples, axis=0), nan=0.0) if samples.size else pq99
    q50 = np.where(draws > 0, q50, pq50)
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


def combine(
    parts: dict[str, PanelForecast], choice: np.ndarray, *, notes: tuple[str, ...] = ()
) -> PanelForecast:
    """Take each (bucket, adapter) cell from the forecast named in ``choice[t, a]``."""
    first = next(iter(parts.values()))
    arrays: dict[str, FloatArray] = {}
    for key in ("mean", "q50", "q90", "q99", "p_nonzero"):
        out = np.zeros_like(first.mean)
        for name, part in parts.items():
            out = np.where(choice == name, getattr(part, key), out)
        arrays[key] = out
    models = tuple(
        "+".join(dict.fromkeys(str(c) for c in choice[:, a])) for a in range(choice.shape[1])
    )
    return PanelForecast(
        origin_s=first.origin_s,
        bucket_s=first.bucket_s,
        adapters=first.adapters,
        model=models,
        notes=notes,
        **arrays,
    )
