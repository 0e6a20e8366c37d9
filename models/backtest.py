"""Rolling-origin backtests: how each forecaster would have done, as the controller uses it.

At each origin a model sees only the history before it, forecasts the horizon and
is scored against what happened. Models are refitted every ``refit_every`` buckets
(the controller refits daily and predicts often), and predict at every origin.
Scores are pooled over all adapters and over the "major" ones (at least 1% of the
traffic before the first origin), each against persistence, same-bucket-yesterday and
the same bucket's median over the last 7 days on the very same cells.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.accuracy import Cells, Scores, score, seasonal_mae
from models.base import FittedForecaster, Forecaster, PanelForecast, sanitize
from models.baselines import SameBucketMedian, same_bucket
from models.series import CountPanel, FloatArray


@dataclass(frozen=True, kw_only=True)
class ModelScores:
    model: str
    overall: Scores
    major: Scores


@dataclass(frozen=True, kw_only=True)
class BacktestReport:
    horizon_buckets: int
    bucket_s: int
    origins_s: tuple[int, ...]
    major_adapters: tuple[str, ...]
    models: tuple[ModelScores, ...]
    notes: tuple[str, ...] = ()

    def best(self, *, major: bool = True) -> str:
        """The model with the lowest pooled MAE (on the major adapters by default)."""
        pick = min(self.models, key=lambda m: (m.major if major else m.overall).mae)
        return pick.model


def rolling_origins(panel: CountPanel, *, first: int, every: int, count: int) -> tuple[int, ...]:
    """``count`` origins (bucket indices) ``every`` buckets apart, inside the history."""
    origins = [first + k * every for k in range(count)]
    return tuple(o for o in origins if 0 < o < panel.n_buckets)


def major_adapters(panel: CountPanel, *, before: int, share: float) -> tuple[str, ...]:
    totals = panel.counts[:before].sum(axis=0)
    grand = float(totals.sum())
    if grand <= 0:
        return ()
    return tuple(
        name for name, total in zip(panel.adapters, totals, strict=True) if total / grand >= share
    )


def _forecasts(
    panel: CountPanel,
    forecaster: Forecaster,
    *,
    origins: Sequence[int],
    horizon: int,
    refit_every: int | None,
) -> list[tuple[int, PanelForecast]]:
    fitted: FittedForecaster | None = None
    fitted_at = -1
    out: list[tuple[int, PanelForecast]] = []
    for origin in origins:
        history = panel.head(origin)
        if fitted is None or (refit_every is not None and origin - fitted_at >= refit_every):
            fitted, fitted_at = forecaster.fit(history), origin
        steps = min(horizon, panel.n_buckets - origin)
        out.append((origin, sanitize(fitted.predict(history, horizon=steps))))
    return out


def _cells(panel: CountPanel, runs: list[tuple[int, PanelForecast]], columns: list[int]) -> Cells:
    keys = ("actual", "mean", "q50", "q90", "q99", "persistence", "yesterday", "median_7d")
    stacks: dict[str, list[FloatArray]] = {key: [] for key in keys}
    for origin, forecast in runs:
        steps = forecast.horizon
        history = panel.head(origin)
        stacks["actual"].append(panel.counts[origin : origin + steps][:, columns])
        for key in ("mean", "q50", "q90", "q99"):
            stacks[key].append(getattr(forecast, key)[:, columns])
        last = panel.counts[origin - 1, columns]
        stacks["persistence"].append(np.repeat(last[None, :], steps, axis=0))
        yesterday = same_bucket(history, horizon=steps, period=panel.per_day(), draws=1)[0]
        stacks["yesterday"].append(np.nan_to_num(yesterday, nan=0.0)[:, columns])
        median = SameBucketMedian().predict(history, horizon=steps).mean
        stacks["median_7d"].append(median[:, columns])
    flat = {
        key: np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
        for key, arrays in stacks.items()
    }
    # An adapter with no request on any scored cell is left out of coverage (see Cells).
    alive = np.zeros(len(columns), dtype=bool)
    for actual in stacks["actual"]:
        alive |= (actual > 0).any(axis=0)
    live = [np.broadcast_to(alive[None, :], a.shape).ravel() for a in stacks["actual"]]
    return Cells(**flat, live=np.concatenate(live) if live else np.zeros(0, dtype=bool))


def backtest(
    panel: CountPanel,
    forecasters: Sequence[Forecaster],
    *,
    origins: Sequence[int],
    horizon: int,
    refit_every: int | None = None,
    major_share: float = 0.01,
) -> BacktestReport:
    """Score every forecaster at every origin; see the module docstring."""
    if not origins:
        raise ValueError("a backtest needs at least one origin inside the history")
    first = min(origins)
    major = major_adapters(panel, before=first, share=major_share)
    major_columns = [panel.adapters.index(name) for name in major]
    all_columns = list(range(len(panel.adapters)))
    scale_all = seasonal_mae(panel.counts[:first], panel.per_day())
    scale_major = seasonal_mae(panel.counts[:first][:, major_columns], panel.per_day())
    results: list[ModelScores] = []
    notes: list[str] = []
    for forecaster in forecasters:
        try:
            runs = _forecasts(
                panel, forecaster, origins=origins, horizon=horizon, refit_every=refit_every
            )
        except ValueError as exc:
            notes.append(f"{forecaster.name}: skipped ({exc})")
            continue
        results.append(
            ModelScores(
                model=forecaster.name,
                overall=score(_cells(panel, runs, all_columns), scale_mae=scale_all),
                major=score(_cells(panel, runs, major_columns), scale_mae=scale_major),
            )
        )
    return BacktestReport(
        horizon_buckets=horizon,
        bucket_s=panel.bucket_s,
        origins_s=tuple(panel.start_s + o * panel.bucket_s for o in origins),
        major_adapters=major,
        models=tuple(results),
        notes=tuple(notes),
    )
