"""The controller's online forecast score: a past forecast against what arrived.

Owns the arithmetic of scoring one forecast window, pure (no IO, no clock: the caller
passes the history it ingested). A forecast issued at ``issued_at`` for
``[issued_at, issued_at + duration_s)`` is scored once the history covers that whole
window, beside two naive forecasts made at the same moment:

- *persistence*: each adapter keeps the rate of the ``duration_s`` before the window;
- *yesterday*: each adapter has the rate of the same window a day earlier.

Each score is the mean absolute error per adapter, in requests per second, over every
adapter that any of the forecasts or the traffic names (missing ones count as 0), so
the three are comparable; the model's WAPE (sum of absolute errors over the requests
that arrived) comes with it. A naive forecast whose window the history does not reach
is None, not a forecast of zero traffic.

Windows are read on the history's bucket grid (``RequestLog.counts``), which an
aggregated log (the Prometheus source) imposes anyway: the window starts at the bucket
holding ``issued_at``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pandas as pd

from placement.domain import AdapterId
from placement.inputs.request_log import RequestLog
from placement.solver.problem import Demand

DAY = timedelta(days=1)


@dataclass(frozen=True, kw_only=True)
class IssuedForecast:
    """A forecast as the controller made it, kept until its window can be scored."""

    issued_at: datetime
    duration_s: int
    demand: Mapping[AdapterId, Demand]

    @property
    def ends_at(self) -> datetime:
        return self.issued_at + timedelta(seconds=self.duration_s)


@dataclass(frozen=True, kw_only=True)
class ForecastScore:
    """One scored window: the model's MAE beside the naive ones' (rps per adapter)."""

    start: datetime
    end: datetime
    adapters: int
    actual_requests: float
    model_mae_rps: float
    persistence_mae_rps: float | None
    yesterday_mae_rps: float | None
    #: The model's sum of absolute errors over the requests that arrived (WAPE).
    error_ratio: float


def score_due(
    pending: list[IssuedForecast], history: RequestLog, *, bucket_s: int
) -> tuple[list[IssuedForecast], list[ForecastScore]]:
    """Score every pending forecast whose window the history now covers; return the
    forecasts still waiting and the scores, oldest first."""
    if history.frame.empty:
        return pending, []
    last = _as_datetime(history.frame["ts"].max())
    waiting = [f for f in pending if _grid(f.issued_at, bucket_s) + _span(f) > last]
    due = [f for f in pending if f not in waiting]
    scores = [score_forecast(f, history, bucket_s=bucket_s) for f in due]
    return waiting, [s for s in scores if s is not None]


def score_forecast(
    forecast: IssuedForecast, history: RequestLog, *, bucket_s: int
) -> ForecastScore | None:
    """The score of one forecast whose window the history covers (None: the history
    holds nothing to score it with)."""
    if history.frame.empty or forecast.duration_s <= 0:
        return None
    start = _grid(forecast.issued_at, bucket_s)
    span = _span(forecast)
    first = _grid(_as_datetime(history.frame["ts"].min()), bucket_s)
    earliest = start - DAY
    frame = history.frame
    recent = replace(history, frame=frame.loc[frame["ts"] >= pd.Timestamp(earliest)])
    counts = recent.counts(bucket_s)
    seconds = float(forecast.duration_s)
    actual = _rates(counts, start, start + span, seconds)
    persistence = _rates(counts, start - span, start, seconds) if first <= start - span else None
    yesterday = (
        _rates(counts, start - DAY, start - DAY + span, seconds) if first <= earliest else None
    )
    model = {str(name): d.mean_rps for name, d in forecast.demand.items()}
    names = set(model) | set(actual) | set(persistence or {}) | set(yesterday or {})
    if not names:
        return None
    total = sum(actual.values()) * seconds
    model_error = _abs_error(model, actual, names)
    return ForecastScore(
        start=start,
        end=start + span,
        adapters=len(names),
        actual_requests=total,
        model_mae_rps=model_error / len(names),
        persistence_mae_rps=_mae(persistence, actual, names),
        yesterday_mae_rps=_mae(yesterday, actual, names),
        error_ratio=_wape(model_error * seconds, total),
    )


def _rates(
    counts: pd.DataFrame, start: datetime, end: datetime, seconds: float
) -> dict[str, float]:
    """Requests per second of each adapter over ``[start, end)`` of the counts frame."""
    window = counts.loc[(counts["ts"] >= pd.Timestamp(start)) & (counts["ts"] < pd.Timestamp(end))]
    sums = window.groupby(window["adapter"].astype(str))["requests"].sum()
    return {str(name): float(n) / seconds for name, n in sums.items() if n > 0}


def _abs_error(
    forecast: Mapping[str, float], actual: Mapping[str, float], names: set[str]
) -> float:
    return sum(abs(forecast.get(n, 0.0) - actual.get(n, 0.0)) for n in names)


def _mae(
    forecast: Mapping[str, float] | None, actual: Mapping[str, float], names: set[str]
) -> float | None:
    if forecast is None:
        return None
    return _abs_error(forecast, actual, names) / len(names)


def _wape(error_requests: float, total_requests: float) -> float:
    if total_requests <= 0.0:
        return 0.0 if error_requests == 0.0 else 1.0
    return error_requests / total_requests


def _grid(moment: datetime, bucket_s: int) -> datetime:
    """The start of the bucket holding ``moment``."""
    epoch = moment.timestamp()
    return datetime.fromtimestamp(epoch - epoch % bucket_s, UTC)


def _span(forecast: IssuedForecast) -> timedelta:
    return timedelta(seconds=forecast.duration_s)


def _as_datetime(value: object) -> datetime:
    return pd.Timestamp(value).to_pydatetime()  # type: ignore[arg-type]
