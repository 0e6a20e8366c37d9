"""The first hour's band past a day boundary the history has not reached (``models.bands``)."""

from __future__ import annotations

import numpy as np

from models.base import PanelForecast
from models.select import Selecting
from models.series import CountPanel

from .conftest import BUCKET_S, PER_DAY, START_S, daily_rate

DAYS = 10
FIRST = Selecting().band_edges[0]


def day_shocked(seed: int) -> np.ndarray:
    """Three daily adapters whose whole fleet's volume is scaled by one factor a day."""
    rng = np.random.default_rng(seed)
    day = rng.uniform(0.5, 1.5, DAYS).repeat(PER_DAY)
    rates = [np.tile(daily_rate(peak, base=8.0), DAYS) * day for peak in (60.0, 40.0, 30.0)]
    return np.column_stack([rng.poisson(rate) for rate in rates]).astype(np.float64)


def bands(panel: CountPanel, fit_at: int, at: int) -> tuple[PanelForecast, PanelForecast]:
    """The forecasts at ``at`` with and without the boundary's own factor."""
    history = panel.head(at)
    off = Selecting().fit(panel.head(fit_at)).predict(history, horizon=PER_DAY)  # the default
    on = Selecting(boundary_band=True).fit(panel.head(fit_at)).predict(history, horizon=PER_DAY)
    np.testing.assert_array_equal(off.mean, on.mean)  # the band only
    np.testing.assert_array_equal(off.q90[FIRST:], on.q90[FIRST:])  # the first hour only
    return off, on


def test_the_first_hour_past_midnight_gets_the_backtests_day_boundary_band() -> None:
    panel = CountPanel(
        start_s=START_S, bucket_s=BUCKET_S, adapters=("a", "b", "c"), counts=day_shocked(3)
    )
    midnight = (DAYS - 1) * PER_DAY
    # The history ends at 23:50: the whole first hour is in a day not seen yet.
    off, on = bands(panel, midnight - FIRST, midnight)
    assert (on.q90[:FIRST] > off.q90[:FIRST]).all()
    assert (on.q99[:FIRST] >= off.q99[:FIRST]).all()
    # At 23:20 only the last two steps are past midnight; the four before it are
    # calibrated on 23:00-23:50's cells without those past midnight: narrower.
    off, on = bands(panel, midnight - FIRST, midnight - 4)
    assert (on.q90[:4] <= off.q90[:4]).all()
    assert (on.q90[4:FIRST] > off.q90[4:FIRST]).all()
    # At noon nothing in the first hour crosses a day: the same band.
    off, on = bands(panel, midnight - FIRST, midnight - PER_DAY // 2)
    np.testing.assert_array_equal(on.q90, off.q90)


def test_the_day_boundary_is_the_clocks_midnight_not_a_day_after_the_panel_start() -> None:
    # The log starts at 13:00 UTC (as the controller's panel starts at its first request).
    skip = 13 * PER_DAY // 24
    counts = day_shocked(3)[skip:]
    panel = CountPanel(
        start_s=START_S + skip * BUCKET_S,
        bucket_s=BUCKET_S,
        adapters=("a", "b", "c"),
        counts=counts,
    )
    midnight = (DAYS - 1) * PER_DAY - skip  # UTC midnight of the last day
    off, on = bands(panel, midnight - FIRST, midnight)
    assert (on.q90[:FIRST] > off.q90[:FIRST]).all()
    # A whole number of days after the panel start (13:00 UTC): no boundary, same band.
    off, on = bands(panel, midnight - FIRST, (DAYS - 2) * PER_DAY)
    np.testing.assert_array_equal(on.q90, off.q90)
