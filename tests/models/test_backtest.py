"""Rolling-origin backtests and their pooled scores."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from models.accuracy import coverage, pinball, wmape
from models.backtest import backtest, major_adapters, rolling_origins
from models.baselines import DailyProfile, Ewma, Persistence, SeasonalNaive
from models.series import CountPanel


def test_baselines_score_one_against_themselves(seasonal_panel: Callable[..., CountPanel]) -> None:
    panel = seasonal_panel(days=5)
    origins = rolling_origins(panel, first=3 * 144, every=24, count=6)
    report = backtest(
        panel, [Persistence(), SeasonalNaive(), DailyProfile()], origins=origins, horizon=6
    )
    scores = {m.model: m.major for m in report.models}
    assert scores["persistence"].mae_vs_persistence == pytest.approx(1.0)
    assert scores["seasonal-naive-day"].mae_vs_yesterday == pytest.approx(1.0)
    assert scores["profile-7d"].mae < scores["persistence"].mae
    assert report.best() == "profile-7d"
    assert all(0.0 <= m.overall.coverage_90 <= 1.0 for m in report.models)


def test_major_adapters_hold_one_percent_before_the_first_origin(
    seasonal_panel: Callable[..., CountPanel],
) -> None:
    panel = seasonal_panel(days=2, peaks=(100.0, 0.01))
    counts = panel.counts.copy()
    counts[:, 1] = 0.0
    counts[-1, 1] = 1e6  # a burst after the origin does not make it major
    late = CountPanel(start_s=panel.start_s, bucket_s=600, adapters=panel.adapters, counts=counts)
    assert major_adapters(late, before=144, share=0.01) == ("adapter-0",)


def test_backtest_without_origins_is_refused(seasonal_panel: Callable[..., CountPanel]) -> None:
    with pytest.raises(ValueError, match="origin"):
        backtest(seasonal_panel(days=2), [Ewma()], origins=(), horizon=6)


@pytest.mark.parametrize(
    ("actual", "predicted", "expected"),
    [([10.0, 0.0], [8.0, 1.0], 0.3), ([0.0, 0.0], [1.0, 1.0], 0.0)],
    ids=["errors-over-volume", "no-volume"],
)
def test_wmape(actual: list[float], predicted: list[float], expected: float) -> None:
    assert wmape(np.array(actual), np.array(predicted)) == pytest.approx(expected)


def test_pinball_and_coverage() -> None:
    actual = np.array([0.0, 10.0])
    upper = np.array([5.0, 5.0])
    assert pinball(actual, upper, 0.9) == pytest.approx((0.1 * 5 + 0.9 * 5) / 2)
    assert coverage(actual, upper) == 0.5


def test_coverage_counts_only_the_cells_asked_for() -> None:
    actual = np.array([0.0, 10.0, 0.0])
    upper = np.array([5.0, 5.0, 0.0])
    assert coverage(actual, upper, np.array([True, True, False])) == 0.5


def test_coverage_leaves_out_an_adapter_silent_on_every_scored_cell(
    seasonal_panel: Callable[..., CountPanel],
) -> None:
    """A client that stopped for good before the scored days is under any band (0 <= 0):
    counting it would flatter coverage, so coverage is that of the live adapters alone.
    """
    panel = seasonal_panel(days=5)
    counts = panel.counts.copy()
    counts[2 * 144 :, 1] = 0.0  # adapter-1 stops for good on day 2, before the origins
    stopped = CountPanel(
        start_s=panel.start_s, bucket_s=600, adapters=panel.adapters, counts=counts
    )
    live_only = CountPanel(
        start_s=panel.start_s, bucket_s=600, adapters=panel.adapters[:1], counts=counts[:, :1]
    )
    origins = rolling_origins(panel, first=3 * 144, every=24, count=6)
    both = backtest(stopped, [Persistence()], origins=origins, horizon=6).models[0].major
    alone = backtest(live_only, [Persistence()], origins=origins, horizon=6).models[0].major
    assert both.coverage_90 < 1.0
    assert both.coverage_90 == pytest.approx(alone.coverage_90)
    assert both.coverage_99 == pytest.approx(alone.coverage_99)
    assert both.mae < alone.mae  # MAE still counts the stopped adapter's (zero) errors
