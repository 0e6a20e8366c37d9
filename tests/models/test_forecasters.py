"""Forecasters on synthetic histories: they beat flat baselines and never emit nonsense."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.base import Forecaster, PanelForecast, poisson_ppf, sanitize
from models.baselines import DailyProfile, Ewma, SeasonalNaive
from models.boosting import GlobalBoosting, NotEnoughHistoryError
from models.registry import forecaster_named
from models.series import CountPanel

SMALL_GBM = GlobalBoosting(max_rows=6_000, max_iter=30, quantile_iter=20)


def day_ahead_mae(model: Forecaster, panel: CountPanel, *, days_back: int = 1) -> float:
    cut = panel.n_buckets - days_back * panel.per_day()
    history = panel.head(cut)
    forecast = model.fit(history).predict(history, horizon=panel.per_day())
    return float(np.mean(np.abs(forecast.mean - panel.counts[cut : cut + panel.per_day()])))


def assert_sane(forecast: PanelForecast) -> None:
    for key in ("mean", "q50", "q90", "q99", "p_nonzero"):
        values = getattr(forecast, key)
        assert np.all(np.isfinite(values)), key
        assert np.all(values >= 0), key
    assert np.all(forecast.q50 <= forecast.q90)
    assert np.all(forecast.q90 <= forecast.q99)
    assert np.all(forecast.p_nonzero <= 1)


@pytest.mark.parametrize(
    "model",
    [DailyProfile(), SeasonalNaive(), SMALL_GBM],
    ids=["profile-7d", "seasonal-naive", "global-gbm"],
)
def test_daily_periodic_adapter_beats_a_flat_forecast(
    model: Forecaster, seasonal_panel: Callable[..., CountPanel]
) -> None:
    panel = seasonal_panel(days=7)
    flat = day_ahead_mae(Ewma(), panel)
    assert day_ahead_mae(model, panel) < 0.6 * flat


def test_global_model_covers_about_nine_in_ten(seasonal_panel: Callable[..., CountPanel]) -> None:
    panel = seasonal_panel(days=7, peaks=(40.0, 8.0, 20.0))
    cut = panel.n_buckets - panel.per_day()
    forecast = sanitize(SMALL_GBM.fit(panel.head(cut)).predict(panel.head(cut), horizon=144))
    coverage = float(np.mean(panel.counts[cut:] <= forecast.q90))
    assert 0.75 <= coverage <= 0.99


def test_sparse_adapter_gets_a_probability_not_just_a_fraction(
    seasonal_panel: Callable[..., CountPanel],
) -> None:
    panel = seasonal_panel(days=8, peaks=(30.0, 0.0))
    counts = panel.counts.copy()
    counts[:, 1] = 0.0
    nine_am = 9 * 6
    rng = np.random.default_rng(3)
    for day in range(8):  # one request at 09:00 on about half the days, nothing else
        counts[day * 144 + nine_am, 1] = float(rng.random() < 0.5) if day else 1.0
    sparse = CountPanel(start_s=panel.start_s, bucket_s=600, adapters=panel.adapters, counts=counts)
    forecast = sanitize(DailyProfile().fit(sparse).predict(sparse, horizon=144))
    assert 0.15 <= forecast.p_nonzero[nine_am, 1] <= 0.9
    assert forecast.p_nonzero[3 * 6, 1] < 0.2
    assert forecast.mean[nine_am, 1] < 1.0


def one_request_panel() -> CountPanel:
    counts = np.zeros((30, 2))
    counts[4, 0] = 1.0
    counts[:, 1] = 3.0
    return CountPanel(start_s=0, bucket_s=600, adapters=("lonely", "busy"), counts=counts)


@pytest.mark.parametrize(
    "name",
    [
        "persistence",
        "seasonal-naive-day",
        "seasonal-naive-week",
        "median-7d",
        "profile-7d",
        "ewma",
        "level-profile",
        "holt-winters",
        "auto",
    ],
)
def test_short_history_gives_a_sane_forecast(name: str) -> None:
    panel = one_request_panel()
    forecast = sanitize(forecaster_named(name).fit(panel).predict(panel, horizon=12))
    assert_sane(forecast)
    assert forecast.mean.shape == (12, 2)


def test_global_model_refuses_too_little_history() -> None:
    with pytest.raises(NotEnoughHistoryError, match="bucket"):
        SMALL_GBM.fit(one_request_panel())


@pytest.mark.parametrize(
    ("q", "mean", "expected"),
    [(0.5, 0.0, 0), (0.5, 3.0, 3), (0.9, 1.0, 2), (0.99, 10.0, 18), (0.9, 100.0, 113)],
)
def test_poisson_quantiles(q: float, mean: float, expected: int) -> None:
    assert poisson_ppf(q, np.array([mean]))[0] == expected


@settings(max_examples=40, deadline=None)
@given(
    arrays(np.float64, (4, 3), elements=st.floats(allow_nan=True, allow_infinity=True, width=64)),
    arrays(np.float64, (4, 3), elements=st.floats(allow_nan=True, allow_infinity=True, width=64)),
)
def test_sanitize_never_lets_nan_or_negatives_through(mean: np.ndarray, band: np.ndarray) -> None:
    raw = PanelForecast(
        origin_s=0,
        bucket_s=600,
        adapters=("a", "b", "c"),
        mean=mean,
        q50=band,
        q90=band - 1.0,
        q99=band * 0.5,
        p_nonzero=band,
    )
    assert_sane(sanitize(raw))


def test_level_profile_under_a_day_forecasts_the_unseen_hours_at_the_recent_level() -> None:
    """20 hours of history: the 4 hours after it have no past day, so they are the
    recent level, not zero (a controller fresh in a fleet plans from what it has
    seen); the hours a past day holds keep their profile."""
    per_hour = 6
    busy = np.full(20 * per_hour, 5.0)
    busy[: 2 * per_hour] = 0.0  # quiet from 00:00 to 02:00
    panel = CountPanel(start_s=1_773_014_400, bucket_s=600, adapters=("a",), counts=busy[:, None])
    forecast = forecaster_named("level-profile").fit(panel).predict(panel, horizon=144)
    unseen = forecast.mean[: 4 * per_hour, 0]
    assert np.allclose(unseen, 5.0)
    assert forecast.mean[4 * per_hour : 6 * per_hour, 0].max() < 1.0  # 00:00-02:00: quiet
    assert_sane(sanitize(forecast))
