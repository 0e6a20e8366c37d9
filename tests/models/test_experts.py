"""The cheap experts of the selecting model: what the shaped persistence follows."""

from __future__ import annotations

import numpy as np

from models.experts import EXPERTS, Lags, expert_means
from models.select import Selecting
from models.series import CountPanel

from .conftest import BUCKET_S, PER_DAY, START_S, daily_rate

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


def test_auto_weighs_the_shaped_persistence_where_the_day_moves_and_levels_wander() -> None:
    rng = np.random.default_rng(3)
    days = 9
    levels = np.exp(np.cumsum(rng.normal(0.0, 0.3, days)))  # each day's level wanders
    rate = np.concatenate([level * daily_rate(400.0, base=20.0) for level in levels])
    counts = rng.poisson(rate).astype(np.float64)
    panel = CountPanel(
        start_s=START_S, bucket_s=BUCKET_S, adapters=("adapter-0",), counts=counts[:, None]
    )
    weights = Selecting().fit(panel).weights
    shaped = weights[HOUR - 1, EXPERTS.index("shaped-persistence"), 0]
    assert shaped >= 0.5  # the last step of the first hour leans on the shape
