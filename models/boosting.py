"""One global gradient-boosting model for every adapter at once.

scikit-learn's HistGradientBoostingRegressor with Poisson loss fits the mean, and
quantile loss fits the upper quantiles; a classifier gives P(at least one request).
Training rows are (adapter, origin, step) triples drawn from the history, so one fit
covers thousands of adapters and every step of the horizon (the step is a feature:
the model is horizon-aware), and sparse adapters borrow strength from the rest.
Targets are divided by each adapter's scale (its mean over the week before the
origin) and weighted by that scale, which makes the Poisson loss equal to the loss
on raw counts while letting trees share shapes across sizes.

Pure: no IO, no clock, no logging; randomness comes from ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from models.base import PanelForecast, poisson_quantiles
from models.features import LagTable, build_features
from models.series import CountPanel, FloatArray, IntArray, local_calendar


class NotEnoughHistoryError(ValueError):
    """The history is too short or too empty to train the global model."""


@dataclass(frozen=True, kw_only=True)
class GlobalBoosting:
    """Settings of the global model; ``fit`` returns a :class:`FittedBoosting`."""

    name: str = "global-gbm"
    max_rows: int = 60_000
    #: Share of training rows drawn at short steps (the controller's 1-hour horizon).
    short_share: float = 0.4
    short_steps: int = 6
    max_steps: int = 144
    max_iter: int = 100
    quantile_iter: int = 50
    max_ratio: float = 50.0
    learning_rate: float = 0.08
    #: Weight of each row is scale**weight_power: 1 matches pooled error on raw counts.
    weight_power: float = 0.75
    min_buckets: int = 144
    seed: int = 0
    #: OpenMP threads per fit. One by default: on a shared or busy machine, more threads
    #: made a fit several times slower (measured in bench/forecast_scale.py).
    threads: int = 1
    timezones: tuple[tuple[str, str], ...] = field(default=())

    def fit(self, history: CountPanel) -> FittedBoosting:
        with threadpool_limits(limits=self.threads):
            return self._fit(history)

    def _fit(self, history: CountPanel) -> FittedBoosting:
        if history.n_buckets < self.min_buckets // 2 or not history.counts.any():
            raise NotEnoughHistoryError(
                f"{history.n_buckets} bucket(s) of history; the global model needs "
                f"{self.min_buckets // 2}"
            )
        rng = np.random.default_rng(self.seed)
        table = LagTable.of(history)
        adapter, origin, step = self._sample(history, rng)
        minute, weekday = self._calendar(history, adapter, origin + step - 1)
        x, base = build_features(
            table, adapter=adapter, origin=origin, step=step, minute=minute, weekday=weekday
        )
        # A feature the history is too short for (last week, with six days) carries nothing:
        # it is zeroed at fit and at predict, since the binner rejects an all-NaN column.
        unknown = np.all(np.isnan(x), axis=0)
        x[:, unknown] = 0.0
        # A cap on the ratio keeps one burst on a quiet adapter from dominating the fit.
        ratio = np.minimum(history.counts[origin + step - 1, adapter] / base, self.max_ratio)
        weight = base**self.weight_power
        weight = weight / weight.mean()  # unit mean, so l2_regularization keeps its meaning
        return FittedBoosting(
            settings=self,
            unknown=unknown,
            mean_model=self._regressor("poisson").fit(x, ratio, sample_weight=weight),
            # Quantiles are smoother targets than the mean: half the rows serve them, with
            # equal weights, since coverage counts cells, not requests (and scikit-learn's
            # weighted leaf percentiles are many times slower).
            quantile_models=tuple(
                self._regressor("quantile", q, iterations=self.quantile_iter, leaves=15).fit(
                    x[::2], ratio[::2]
                )
                for q in (0.5, 0.9, 0.99)
            ),
            nonzero_model=self._classifier(x, history.counts[origin + step - 1, adapter] > 0),
        )

    def _sample(
        self, history: CountPanel, rng: np.random.Generator
    ) -> tuple[IntArray, IntArray, IntArray]:
        n, n_adapters = history.n_buckets, len(history.adapters)
        first_origin = min(history.per_day(), n // 2)
        max_step = max(1, min(self.max_steps, n - first_origin))
        rows = min(self.max_rows, n_adapters * (n - first_origin) * 4)
        short = rng.random(rows) < self.short_share
        step = np.where(
            short,
            rng.integers(1, min(self.short_steps, max_step) + 1, rows),
            rng.integers(1, max_step + 1, rows),
        )
        origin = first_origin + (rng.random(rows) * (n - step - first_origin + 1)).astype(np.int64)
        adapter = rng.integers(0, n_adapters, rows)
        return adapter, origin, step

    def _calendar(
        self, history: CountPanel, adapter: IntArray, target: IntArray
    ) -> tuple[IntArray, IntArray]:
        last = int(target.max()) + 1 if len(target) else 1
        minute, weekday = local_calendar(
            history.bucket_starts_s(count=last), history.adapters, dict(self.timezones)
        )
        return minute[target, adapter], weekday[target, adapter]

    def _regressor(
        self,
        loss: str,
        quantile: float | None = None,
        *,
        iterations: int | None = None,
        leaves: int = 31,
    ) -> HistGradientBoostingRegressor:
        return HistGradientBoostingRegressor(
            loss=loss,
            quantile=quantile,
            max_iter=iterations or self.max_iter,
            learning_rate=self.learning_rate,
            max_leaf_nodes=leaves,
            min_samples_leaf=50,
            l2_regularization=1.0,
            categorical_features=None,
            early_stopping=False,
            random_state=self.seed,
        )

    def _classifier(self, x: FloatArray, y: np.ndarray) -> HistGradientBoostingClassifier | float:
        share = float(np.mean(y)) if len(y) else 0.0
        if share in (0.0, 1.0):
            return share  # one class only: the share is the probability
        return HistGradientBoostingClassifier(
            max_iter=max(30, self.max_iter // 3),
            learning_rate=0.1,
            max_leaf_nodes=31,
            min_samples_leaf=50,
            early_stopping=False,
            random_state=self.seed,
        ).fit(x, y)


@dataclass(frozen=True, kw_only=True, eq=False)
class FittedBoosting:
    settings: GlobalBoosting
    unknown: np.ndarray
    mean_model: HistGradientBoostingRegressor
    quantile_models: tuple[HistGradientBoostingRegressor, ...]
    nonzero_model: HistGradientBoostingClassifier | float

    def predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        with threadpool_limits(limits=self.settings.threads):
            return self._predict(history, horizon=horizon)

    def _predict(self, history: CountPanel, *, horizon: int) -> PanelForecast:
        n, n_adapters = history.n_buckets, len(history.adapters)
        table = LagTable.of(history)
        adapter = np.repeat(np.arange(n_adapters), horizon)
        step = np.tile(np.arange(1, horizon + 1), n_adapters)
        origin = np.full_like(step, n)
        minute, weekday = local_calendar(
            history.bucket_starts_s(first=n, count=horizon),
            history.adapters,
            dict(self.settings.timezones),
        )
        x, base = build_features(
            table,
            adapter=adapter,
            origin=origin,
            step=step,
            minute=minute[step - 1, adapter],
            weekday=weekday[step - 1, adapter],
        )
        x[:, self.unknown] = 0.0

        def grid(values: FloatArray) -> FloatArray:
            return np.asarray(values * base, dtype=np.float64).reshape(n_adapters, horizon).T

        mean = grid(np.minimum(self.mean_model.predict(x), self.settings.max_ratio))
        q50, q90, q99 = (grid(model.predict(x)) for model in self.quantile_models)
        _, pq90, pq99 = poisson_quantiles(mean)
        return PanelForecast(
            origin_s=history.end_s,
            bucket_s=history.bucket_s,
            adapters=history.adapters,
            mean=mean,
            q50=q50,
            q90=np.maximum(q90, pq90),
            q99=np.maximum(q99, pq99),
            p_nonzero=self._p_nonzero(x).reshape(n_adapters, horizon).T,
            model=(self.settings.name,) * n_adapters,
        )

    def _p_nonzero(self, x: FloatArray) -> FloatArray:
        if isinstance(self.nonzero_model, float):
            return np.full(len(x), self.nonzero_model)
        return np.asarray(self.nonzero_model.predict_proba(x)[:, 1], dtype=np.float64)
