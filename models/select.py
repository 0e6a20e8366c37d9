"""Horizon-aware selection per adapter, by a backtest on the end of the history.

The best model at one hour ahead is rarely the best at a day ahead, and the best
model for a busy, smooth adapter is rarely the best for a bursty one. ``Selecting``
fits every candidate on the history less its last ``holdout_days``, forecasts from
several origins inside that holdout, and for each adapter and each band of steps
(by default 1-6 buckets and beyond) blends the candidates with weights that fall
with their error there. The candidates are then refitted on the whole history.
With too little history for a holdout it uses its fallback chain and says so.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from models.base import FittedForecaster, Forecaster, PanelForecast, sanitize
from models.series import CountPanel, FloatArray


@dataclass(frozen=True, kw_only=True)
class Selecting:
    candidates: tuple[Forecaster, ...]
    name: str = "auto"
    #: Upper edges (in steps) of the horizon bands; the last band runs to the horizon.
    band_edges: tuple[int, ...] = (6,)
    holdout_days: int = 2
    origins_every: int = 24
    short_every: int = 6
    #: Only the best ``keep`` candidates of a cell get weight, in proportion to 1/MAE**power
    #: (4 of 7 beat 2, 3 and 7 on ServeGen m-mid at both horizons; docs/benchmarks.md).
    keep: int = 4
    power: float = 2.0
    min_days: int = 3
    #: Used alone when the history is too short to select: a day or more, else under a day.
    fallback_day: str = "profile-7d"
    fallback_short: str = "ewma"

    def fit(self, history: CountPanel) -> FittedSelection:
        per_day = history.per_day()
        cut = history.n_buckets - self.holdout_days * per_day
        notes: list[str] = []
        errors: FloatArray | None = None
        factors: FloatArray | None = None
        names = tuple(c.name for c in self.candidates)
        fallback = self.fallback_day if history.n_buckets >= per_day else self.fallback_short
        if history.n_buckets >= self.min_days * per_day and cut > 0:
            errors, factors = self._holdout_errors(history, cut, notes)
        else:
            notes.append(
                f"{self.name}: {history.n_buckets / per_day:.1f} day(s) of history is too short "
                f"to select by backtest; fell back to {fallback}"
            )
        fitted, failed = _fit_all(self.candidates, history)
        notes.extend(failed)
        return FittedSelection(
            settings=self,
            fitted=fitted,
            errors=errors,
            band_factors=factors,
            fallback=names.index(fallback) if fallback in names else len(names) - 1,
            notes=tuple(notes),
        )

    def _holdout_errors(
        self, history: CountPanel, cut: int, notes: list[str]
    ) -> tuple[FloatArray, FloatArray]:
        """Mean absolute error per (candidate, band, adapter) over the holdout origins, and
        per (candidate, band) the factors that would have given q90 and q99 their coverage.
        """
        fitted, failed = _fit_all(self.candidates, history.head(cut))
        notes.extend(failed)
        n_bands = len(self.band_edges) + 1
        totals = np.zeros((len(self.candidates), n_bands, len(history.adapters)))
        counts = np.zeros((n_bands, 1))
        ratios: dict[tuple[int, int], list[FloatArray]] = {}
        major = _major_columns(history.head(cut))
        # Short-band origins every ``short_every`` (cheap: a few steps each); full horizons
        # from every ``origins_every``-th bucket.
        for origin in range(cut, history.n_buckets, self.short_every):
            full = (origin - cut) % self.origins_every == 0
            steps = history.n_buckets - origin
            steps = steps if full else min(steps, self.band_edges[0] if self.band_edges else steps)
            actual = history.counts[origin : origin + steps]
            band = np.searchsorted(self.band_edges, np.arange(1, steps + 1), side="left")
            for index, model in enumerate(fitted):
                if model is None:
                    totals[index] = np.inf
                    continue
                forecast = sanitize(model.predict(history.head(origin), horizon=steps))
                np.add.at(totals[index], band, np.abs(forecast.mean - actual))
                for b in range(n_bands):
                    rows = band == b
                    for k, upper in enumerate((forecast.q90, forecast.q99)):
                        ratio = _ratio(actual[rows][:, major], upper[rows][:, major])
                        ratios.setdefault((index, b * 2 + k), []).append(ratio)
            np.add.at(counts, band, 1.0)
        return totals / np.maximum(counts, 1.0)[None, :, :], _factors(ratios, totals.shape[:2])


def _major_columns(history: CountPanel, share: float = 0.01) -> np.ndarray:
    """Adapters with at least ``share`` of the traffic: where the band's coverage matters."""
    totals = history.counts.sum(axis=0)
    grand = totals.sum()
    major = totals >= share * grand if grand > 0 else np.ones_like(totals, dtype=bool)
    return np.flatnonzero(major)


def _ratio(actual: FloatArray, upper: FloatArray) -> FloatArray:
    """How far each actual went past its quantile: 0 for no request, inf past a zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(upper > 0, actual / np.where(upper > 0, upper, 1.0), np.inf)
    return np.where(actual <= 0, 0.0, ratio).ravel()


def _factors(ratios: dict[tuple[int, int], list[FloatArray]], shape: tuple[int, ...]) -> FloatArray:
    """Conformal scale factors ``(candidate, band, [q90, q99])``, within [0.7, 4]."""
    factors = np.ones((*shape, 2))
    for (index, slot), parts in ratios.items():
        values = np.concatenate(parts)
        if not len(values):
            continue
        target = 0.9 if slot % 2 == 0 else 0.99
        factor = float(np.quantile(values, target, method="higher"))  # inf-safe: no interpolation
        if np.isfinite(factor) and factor > 0:
            # Half the correction (on a log scale): two days of holdout are a small sample,
            # and the full factor overshot the coverage on the ServeGen benchmark.
            factors[index, slot // 2, slot % 2] = min(max(np.sqrt(factor), 0.7), 4.0)
    return factors


def _fit_all(
    candidates: Sequence[Forecaster], history: CountPanel
) -> tuple[list[FittedForecaster | None], list[str]]:
    fitted: list[FittedForecaster | None] = []
    failed: list[str] = []
    for candidate in candidates:
        try:
            fitted.append(candidate.fit(history))
        except ValueError as exc:
            fitted.append(None)
            failed.append(f"{candidate.name}: not used ({exc})")
    return fitted, failed


@dataclass(frozen=True, kw_only=True, eq=False)
class FittedSelection:
    settings: Selecting
    fitted: list[FittedForecaster | None]
    errors: FloatArray | None
    #: Per (candidate, band): factors on q90 and q99 that gave them their coverage in the
    #: holdout (split-conformal calibration); None without a holdout.
    band_factors: FloatArray | None
    fallback: int
    notes: tuple[str, ...] = field(default=())

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        usable = [i for i, model in enumerate(self.fitted) if model is not None]
        if not usable:
            raise ValueError("no candidate forecaster could be fitted")
        forecasts = {
            i: self._calibrated(i, sanitize(model.predict(history, horizon=horizon)))
            for i, model in enumerate(self.fitted)
            if model is not None
        }
        weights = self._weights(usable, horizon, len(history.adapters))
        return _blend(
            forecasts, weights, [self.settings.candidates[i].name for i in usable], self.notes
        )

    def _calibrated(self, index: int, forecast: PanelForecast) -> PanelForecast:
        if self.band_factors is None:
            return forecast
        band = np.searchsorted(
            self.settings.band_edges, np.arange(1, forecast.horizon + 1), side="left"
        )
        factors = self.band_factors[index][band]  # (step, 2)
        return replace(
            forecast,
            q90=forecast.q90 * factors[:, 0:1],
            q99=np.maximum(forecast.q99 * factors[:, 1:2], forecast.q90 * factors[:, 0:1]),
        )

    def _weights(self, usable: list[int], horizon: int, n_adapters: int) -> FloatArray:
        """Weights ``(candidate, step, adapter)`` summing to one over candidates."""
        weights = np.zeros((len(usable), horizon, n_adapters))
        if self.errors is None:
            weights[usable.index(self.fallback) if self.fallback in usable else -1] = 1.0
            return weights
        band = np.searchsorted(self.settings.band_edges, np.arange(1, horizon + 1), side="left")
        errors = self.errors[usable][:, band, :]
        rank = np.argsort(np.argsort(errors, axis=0, kind="stable"), axis=0, kind="stable")
        floor = np.maximum(errors.min(axis=0, keepdims=True), 1e-9)
        score = np.where(
            rank < self.settings.keep,
            (floor / np.maximum(errors, 1e-9)) ** self.settings.power,
            0.0,
        )
        score = np.where(np.isfinite(score), score, 0.0)
        total = score.sum(axis=0, keepdims=True)
        weights = np.where(total > 0, score / np.where(total > 0, total, 1.0), 0.0)
        weights[-1] = np.where(total[0] > 0, weights[-1], 1.0)
        return weights


def _blend(
    forecasts: dict[int, PanelForecast],
    weights: FloatArray,
    names: list[str],
    notes: tuple[str, ...],
) -> PanelForecast:
    parts = list(forecasts.values())
    first = parts[0]

    def mix(key: str) -> FloatArray:
        mixed = np.sum([w * getattr(p, key) for w, p in zip(weights, parts, strict=True)], axis=0)
        return np.asarray(mixed, dtype=np.float64)

    # The model name is each adapter's heaviest candidate over the horizon.
    heaviest = weights.sum(axis=1).argmax(axis=0)
    return PanelForecast(
        origin_s=first.origin_s,
        bucket_s=first.bucket_s,
        adapters=first.adapters,
        mean=mix("mean"),
        q50=mix("q50"),
        q90=mix("q90"),
        q99=mix("q99"),
        p_nonzero=mix("p_nonzero"),
        model=tuple(f"auto:{names[int(i)]}" for i in heaviest),
        notes=notes + tuple(n for p in parts for n in p.notes),
    )
