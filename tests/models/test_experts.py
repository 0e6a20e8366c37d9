"""The cheap experts of the selecting model: what the shaped persistence follows."""

from __future__ import annotations

import numpy as np

from models.experts import Lags, expert_means

from .conftest import PER_DAY, daily_rate

HOUR = 6


def _shaped(counts: np.ndarray, origin: int) -> np.ndarray:
    lags = Lags.of(counts[:origin, None], per_day=PER_DAY, first=origin)
    means = expert_means(
        lags, np.array([origin]), horizon=HOUR, names=("persistence", "shaped-persistence")
    )
    return np.asarray(means[:, 0, :, 0])


def test_shaped_persistence_follows_the_daily_rise_from_the_last_bucket() -> None:
    days = 8
    rate = np.tile(daily_rate(60.0), days)
    origin = (days - 1) * PER_DAY + 9 * HOUR  # 09:00, the morning rise toward 13:00
    persistence, shaped = _shaped(rate, origin)
    ahead = rate[origin : origin + HOUR]
    assert np.all(np.diff(shaped) > 0)  # it rises with the profile
    assert np.abs(shaped - ahead).sum() < 0.5 * np.abs(persistence - ahead).sum()


def test_shaped_persistence_scales_the_last_bucket_not_the_profile() -> None:
    days = 8
    rate = np.tile(daily_rate(60.0), days)
    origin = (days - 1) * PER_DAY + 11 * HOUR
    doubled = rate.copy()
    doubled[origin - 1] *= 2.0  # today's level is twice the week's
    _, shaped = _shaped(rate, origin)
    _, shaped_doubled = _shaped(doubled, origin)
    np.testing.assert_allclose(shaped_doubled, 2.0 * shaped, rtol=1e-3)


def test_without_a_past_day_shaped_persistence_is_persistence() -> None:
    counts = np.random.default_rng(1).poisson(20.0, PER_DAY - 10).astype(np.float64)
    persistence, shaped = _shaped(counts, len(counts))
    np.testing.assert_allclose(shaped, persistence)
