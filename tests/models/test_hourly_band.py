"""The first hour's band calibrated per hour of day of the origin (``models.bands``)."""

from __future__ import annotations

import numpy as np

from models.select import Selecting
from models.series import CountPanel

from .conftest import BUCKET_S, PER_DAY, START_S, daily_rate

DAYS = 9
HOUR = PER_DAY // 24


def ramped(seed: int) -> np.ndarray:
    """A daily adapter whose 08:00-10:00 swings widely, unlike the rest of its day."""
    rng = np.random.default_rng(seed)
    rate = np.tile(daily_rate(40.0), DAYS)
    swing = np.zeros(PER_DAY)
    swing[8 * HOUR : 10 * HOUR] = 1.0
    shock = rng.uniform(0.2, 4.0, DAYS).repeat(PER_DAY) * np.tile(swing, DAYS)
    return rng.poisson(rate * (1.0 + shock)).astype(np.float64)


def test_an_hour_whose_errors_run_wide_gets_a_wider_first_hour_band() -> None:
    counts = np.column_stack([ramped(1), ramped(2)])
    panel = CountPanel(start_s=START_S, bucket_s=BUCKET_S, adapters=("a", "b"), counts=counts)
    # Fitted the midnight before, as the controller refits daily.
    fit_at = (DAYS - 1) * PER_DAY
    pooled = Selecting(hourly_min_cells=None).fit(panel.head(fit_at))
    hourly = Selecting().fit(panel.head(fit_at))  # the default: per hour of day
    wide, quiet = panel.head(fit_at + 8 * HOUR), panel.head(fit_at + 3 * HOUR)
    first = slice(0, Selecting().band_edges[0])
    for history, wider in ((wide, True), (quiet, False)):
        a = pooled.predict(history, horizon=PER_DAY)
        b = hourly.predict(history, horizon=PER_DAY)
        np.testing.assert_array_equal(a.mean, b.mean)  # the band only
        np.testing.assert_array_equal(a.q90[first.stop :], b.q90[first.stop :])
        if wider:
            assert (b.q90[first] >= a.q90[first]).all() and (b.q90[first] > a.q90[first]).any()
        else:
            assert (b.q90[first] <= a.q90[first]).all() and (b.q90[first] < a.q90[first]).any()
    assert hourly.hourly[8, 0] > 1.0 > hourly.hourly[3, 0]
    np.testing.assert_array_equal(pooled.hourly, np.ones_like(pooled.hourly))


def test_the_hours_are_the_clocks_when_the_log_starts_in_the_afternoon() -> None:
    # The controller's panel starts at its first request, here 13:00 UTC: the wide hour
    # is still 08:00 UTC, not 8 hours after the panel's start.
    skip = 13 * HOUR
    counts = np.column_stack([ramped(1), ramped(2)])[skip:]
    panel = CountPanel(
        start_s=START_S + skip * BUCKET_S, bucket_s=BUCKET_S, adapters=("a", "b"), counts=counts
    )
    fitted = Selecting().fit(panel.head((DAYS - 1) * PER_DAY - skip))
    assert fitted.hourly[7:9, 0].min() > 1.0 > fitted.hourly[[3, 20], 0].max()
