"""The selecting model (``auto``): level shifts, shrinkage toward naive, fallbacks, bands."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from models.bands import widened
from models.base import sanitize
from models.experts import EXPERTS, Lags, expert_means
from models.rolling import simplex
from models.select import FittedSelection, Selecting
from models.series import CountPanel
from models.shifts import Change, detect_shifts, jumped
from models.shrink import jump_trust, trust_from_evidence

from .conftest import BUCKET_S, PER_DAY, START_S, daily_rate

DAYS = 9


def panel_of(*columns: np.ndarray) -> CountPanel:
    counts = np.column_stack(columns).astype(np.float64)
    names = tuple(f"adapter-{i}" for i in range(counts.shape[1]))
    return CountPanel(start_s=START_S, bucket_s=BUCKET_S, adapters=names, counts=counts)


def seasonal(peak: float = 40.0, *, days: int = DAYS, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.poisson(np.tile(daily_rate(peak), days)).astype(np.float64)


def stopped() -> np.ndarray:
    series = seasonal()
    series[-48:] = 0.0  # silent for the last 8 hours
    return series


def surged() -> np.ndarray:
    series = seasonal()
    series[-12:] *= 10.0
    return series


def appeared() -> np.ndarray:
    series = np.zeros(DAYS * PER_DAY)
    series[-12:] = np.random.default_rng(2).poisson(20.0, 12)
    return series


def dropped() -> np.ndarray:
    series = np.random.default_rng(3).poisson(50.0, DAYS * PER_DAY).astype(np.float64)
    series[-12:] = np.random.default_rng(4).poisson(5.0, 12)
    return series


def bursty() -> np.ndarray:
    """Hours at 0 or 100 at random, all week: its pauses are its normal behaviour."""
    rng = np.random.default_rng(5)
    hours = rng.random(DAYS * 24) < 0.6
    series = np.repeat(np.where(hours, 100.0, 0.0), 6)
    series[-6:] = 0.0
    series[-12:-6] = 100.0
    return series


def shift_at_end(series: np.ndarray) -> Change:
    panel = panel_of(series)
    lags = Lags.of(panel.counts, per_day=PER_DAY, first=panel.n_buckets)
    shifts = detect_shifts(lags, np.array([panel.n_buckets]))
    return Change(int(shifts.kind[0, 0]))


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (stopped, Change.STOPPED),
        (surged, Change.SURGED),
        (appeared, Change.APPEARED),
        (dropped, Change.DROPPED),
        (seasonal, Change.NONE),
        (bursty, Change.NONE),
    ],
    ids=["stopped", "surged", "appeared", "dropped", "steady", "bursty-pauses-are-normal"],
)
def test_level_shift_detection(make: Callable[[], np.ndarray], expected: Change) -> None:
    assert shift_at_end(make()) == expected


def test_a_short_pause_is_not_a_stop() -> None:
    series = seasonal()
    series[-12:] = 0.0  # two quiet hours: not yet six
    assert shift_at_end(series) == Change.NONE


@pytest.mark.parametrize(
    ("excess", "expected"),
    [
        (np.full(40, 5.0) + np.tile([0.5, -0.5], 20), 1.0),
        (np.tile([3.0, -3.0], 20), 0.0),
        (np.full(40, -2.0), 0.0),
    ],
    ids=["naive-always-worse", "no-evidence", "naive-better"],
)
def test_trust_follows_the_evidence_against_naive(excess: np.ndarray, expected: float) -> None:
    blocks = np.arange(40) // 4  # ten blocks of four origins
    trust = trust_from_evidence(excess[:, None], blocks, 2.0)
    assert trust[0] == pytest.approx(expected, abs=0.05)


def test_trust_needs_two_blocks() -> None:
    assert trust_from_evidence(np.ones((10, 1)), np.zeros(10, dtype=np.int64), 2.0)[0] == 0.0


def first_band_weight(fitted: FittedSelection, expert: str) -> float:
    return float(fitted.weights[:6, EXPERTS.index(expert), 0].mean())


def test_persistence_keeps_the_weight_on_a_random_walk() -> None:
    rng = np.random.default_rng(6)
    walk = np.abs(500.0 + np.cumsum(rng.normal(0.0, 20.0, 8 * PER_DAY)))
    fitted = Selecting().fit(panel_of(walk))
    assert first_band_weight(fitted, "persistence") >= 0.7


def test_smoothing_wins_the_weight_on_noise_around_a_level() -> None:
    noise = np.random.default_rng(7).poisson(50.0, 8 * PER_DAY)
    fitted = Selecting().fit(panel_of(noise))
    assert first_band_weight(fitted, "persistence") <= 0.3


def test_day_bands_shrink_to_naive_when_nothing_beats_it() -> None:
    # Every day the same shape exactly: yesterday is perfect, and nothing can beat it.
    day = np.round(daily_rate(40.0))
    fitted = Selecting().fit(panel_of(np.tile(day, 8)))
    naive = [EXPERTS.index("yesterday"), EXPERTS.index("median-7d")]
    assert fitted.weights[6:, naive, 0].sum(axis=1) == pytest.approx(1.0)


def test_short_history_falls_back_to_naive_and_says_so() -> None:
    series = seasonal(days=1)[: 20 * 6]  # 20 hours
    panel = panel_of(series)
    forecast = Selecting().fit(panel).predict(panel, horizon=PER_DAY)
    assert any("too short" in note for note in forecast.notes)
    assert forecast.mean[6:, 0] == pytest.approx(np.full(PER_DAY - 6, series[-3:].mean()))


def test_with_a_day_of_history_yesterday_still_counts_in_the_first_hour() -> None:
    # Busy for an hour a day ago, silent since: a daily job or a stop, too early to tell.
    series = np.zeros(PER_DAY)
    series[:6] = 200.0
    panel = panel_of(series)
    forecast = Selecting().fit(panel).predict(panel, horizon=6)
    assert forecast.mean[:, 0].mean() > 0.0
    assert forecast.model[0] != "auto:stopped"


def test_a_young_adapter_gets_the_naive_forecast_past_the_hour() -> None:
    young = seasonal(seed=8)
    young[: -2 * PER_DAY] = 0.0  # first request two days ago
    fitted = Selecting().fit(panel_of(seasonal(), young))
    naive = [EXPERTS.index("yesterday"), EXPERTS.index("median-7d")]
    assert fitted.weights[6:, naive, 1].sum(axis=1) == pytest.approx(1.0)


def test_after_a_surge_the_forecast_follows_the_new_level_and_the_band_widens() -> None:
    panel = panel_of(surged(), seasonal())
    fitted = Selecting().fit(panel)
    assert np.all(fitted.factors[:, :, 1] >= fitted.factors[:, :, 0])  # changed >= steady
    forecast = sanitize(fitted.predict(panel, horizon=PER_DAY))
    assert forecast.model[0] == "auto:surged"
    first_hour = slice(0, 6)
    assert forecast.mean[first_hour, 0].mean() >= 3.0 * forecast.mean[first_hour, 1].mean()
    width = forecast.q90 - forecast.mean
    assert width[first_hour, 0].mean() >= 2.0 * width[first_hour, 1].mean()
    assert np.all(forecast.q99 >= forecast.q90)


def test_after_a_stop_the_forecast_is_zero_but_the_band_is_not() -> None:
    panel = panel_of(stopped())
    forecast = sanitize(Selecting().fit(panel).predict(panel, horizon=PER_DAY))
    assert forecast.model[0] == "auto:stopped"
    assert np.all(forecast.mean[:, 0] == 0.0)
    assert np.all(forecast.q90[:, 0] > 0.0)
    assert any("stopped: adapter-0" in note for note in forecast.notes)


@pytest.mark.parametrize("name", ["persistence", "yesterday", "median-7d"])
def test_naive_experts_match_the_naive_models(name: str) -> None:
    from models.base import FittedForecaster
    from models.baselines import Persistence, SameBucketMedian, SeasonalNaive

    models: dict[str, FittedForecaster] = {
        "persistence": Persistence(),
        "yesterday": SeasonalNaive(),
    }
    model = models.get(name, SameBucketMedian())
    panel = panel_of(seasonal(), surged())
    lags = Lags.of(panel.counts, per_day=PER_DAY, first=panel.n_buckets)
    ours = expert_means(lags, np.array([panel.n_buckets]), horizon=PER_DAY, names=(name,))
    theirs = model.predict(panel, horizon=PER_DAY).mean
    np.testing.assert_allclose(ours[0, 0], theirs)


def test_the_stacking_grid_is_convex_and_starts_on_the_first_expert() -> None:
    grid = simplex(3, 10)
    assert len(grid) == 66
    np.testing.assert_allclose(grid.sum(axis=1), 1.0)
    assert list(grid[0]) == [1.0, 0.0, 0.0]


def test_the_day_margin_widens_the_day_band_and_leaves_the_first_hour() -> None:
    panel = panel_of(seasonal(), seasonal(20.0, seed=6), dropped())
    narrow = Selecting(day_margin=0.0).fit(panel).predict(panel, horizon=PER_DAY)
    wide = Selecting(day_margin=0.5).fit(panel).predict(panel, horizon=PER_DAY)
    hour = slice(0, Selecting().band_edges[0])
    np.testing.assert_array_equal(wide.mean, narrow.mean)
    np.testing.assert_array_equal(wide.q90[hour], narrow.q90[hour])
    assert (wide.q90 >= narrow.q90).all() and (wide.q99 >= narrow.q99).all()
    assert (wide.q90[hour.stop :] > narrow.q90[hour.stop :]).any()


def test_the_short_margin_widens_the_first_hours_band_and_leaves_the_day() -> None:
    panel = panel_of(seasonal(), seasonal(20.0, seed=6), dropped())
    narrow = Selecting(short_margin=0.0).fit(panel).predict(panel, horizon=PER_DAY)
    wide = Selecting().fit(panel).predict(panel, horizon=PER_DAY)  # the default margin
    hour = slice(0, Selecting().band_edges[0])
    np.testing.assert_array_equal(wide.mean, narrow.mean)
    np.testing.assert_array_equal(wide.q90[hour.stop :], narrow.q90[hour.stop :])
    assert (wide.q90 >= narrow.q90).all() and (wide.q99 >= narrow.q99).all()
    assert (wide.q90[hour] > narrow.q90[hour]).any()


def test_past_the_hour_the_band_grows_with_the_forecast_as_a_share_of_it() -> None:
    # A day's volume moves as one factor, so its error grows with the forecast itself.
    panel = panel_of(seasonal(400.0), seasonal(200.0, seed=6), dropped())
    root = Selecting(day_band_power=0.5).fit(panel).predict(panel, horizon=PER_DAY)
    share = Selecting(day_band_power=1.0).fit(panel).predict(panel, horizon=PER_DAY)
    hour = slice(0, Selecting().band_edges[0])
    np.testing.assert_array_equal(share.mean, root.mean)
    np.testing.assert_array_equal(share.q90[hour], root.q90[hour])
    peak, low = 13 * 6, 9 * 6  # 13:00 and 09:00, both past the first hour
    width = {k: (f.q90 - f.mean)[:, 0] for k, f in (("root", root), ("share", share))}
    assert width["share"][peak] / width["share"][low] > width["root"][peak] / width["root"][low]


@pytest.mark.parametrize(
    ("mean", "typical", "root", "share"),
    [
        (0.0, 0.0, 1.0, 1.0),  # no forecast, no typical level: the scale as it is
        (1e6, 0.0, 5.0, 25.0),  # an adapter new today: clipped, not a millionfold
        (0.0, 1e6, 0.2, 0.04),  # a forecast of nothing: narrowed, never to zero
        (3.0, 1.0, 2.0**0.5, 2.0),  # within the clip: (mean + 1) / (typical + 1)
    ],
)
def test_the_band_follows_the_forecast_within_the_clip_at_either_power(
    mean: float, typical: float, root: float, share: float
) -> None:
    # The first hour's bands (power 1/2) as they were, clip 0.2-5 after the power.
    for power, expected in ((0.5, root), (1.0, share)):
        sigma = widened(
            np.array([2.0]),
            np.array([False]),
            np.array([np.nan]),
            np.array([0.0]),
            mean=np.array([mean]),
            typical=np.array([typical]),
            power=power,
        )
        np.testing.assert_allclose(sigma, [2.0 * expected])
    nan = widened(
        np.array([2.0]),
        np.array([False]),
        np.array([np.nan]),
        np.array([0.0]),
        mean=np.array([np.nan]),
        typical=np.array([1.0]),
        power=1.0,
    )
    assert np.isnan(nan).all()  # an unknown forecast stays unknown, not a clip's edge


def regimes(*, seed: int = 8, hours: int = 3) -> np.ndarray:
    """Poisson noise around a level that switches between 100 and 1,000 every few hours
    and stays there: in calm buckets smoothing wins, right after a switch the last bucket.
    """
    rng = np.random.default_rng(seed)
    levels = np.repeat(np.tile([100.0, 1000.0], DAYS * 24 // (2 * hours) + 1), 6 * hours)
    return rng.poisson(levels[: DAYS * PER_DAY]).astype(np.float64)


def test_a_jump_in_the_last_bucket_is_told_from_noise_and_from_a_quiet_adapter() -> None:
    calm = np.random.default_rng(9).poisson(50.0, 2 * PER_DAY).astype(np.float64)
    drop = calm.copy()
    drop[-1] = 5.0
    quiet = np.zeros(2 * PER_DAY)
    quiet[-1] = 1.0  # one request after silence: not a jump
    lags = Lags.of(panel_of(calm, drop, quiet).counts, per_day=PER_DAY, first=2 * PER_DAY)
    flags = jumped(lags, np.array([2 * PER_DAY]), factor=3.0, window=3, smooth=0.1)
    assert flags[0].tolist() == [False, True, False]


def test_jump_trust_follows_the_evidence_right_after_jumps() -> None:
    """Columns: the stack always won after jumps, always lost, won and lost alike, and
    a quiet adapter with one jump, which takes the busy adapters' pooled statistic.
    """
    jump = np.zeros((40, 4), dtype=bool)
    jump[::4, :3] = True  # ten jumps each
    jump[0, 3] = True
    excess = np.stack(
        [
            np.full(40, 5.0) + np.tile([1.0, -1.0], 20),
            np.full(40, -5.0) - np.tile([1.0, -1.0], 20),
            np.tile([3.0, 3.0, 3.0, 3.0, -3.0, -3.0, -3.0, -3.0], 5),
            np.full(40, -50.0),
        ],
        axis=1,
    )
    excess[5, 0] = np.nan  # an origin not scored counts for nothing
    busy = np.array([True, True, True, False])
    kept = jump_trust(excess, jump, busy, 6, 2.0)
    assert kept[:3].tolist() == pytest.approx([1.0, 0.0, 0.5])
    # pooled over the busy three: +5, -5 and 0 on average, so about even
    assert 0.3 < kept[3] < 0.7
    assert jump_trust(excess, np.zeros_like(jump), busy, 6, 2.0).tolist() == [0.5] * 4


def test_after_a_jump_that_usually_lasts_the_first_hour_follows_the_last_bucket() -> None:
    series = regimes()
    end = len(series) - 3 * 6 + 1  # one bucket into a new regime at 1,000
    panel = panel_of(series[:end])
    assert series[end - 2] < 200 and series[end - 1] > 800
    steady = Selecting(jump_factor=None).fit(panel)
    assert first_band_weight(steady, "persistence") <= 0.6  # smoothing carries weight
    new_level = float(series[end - 1])
    old = steady.predict(panel, horizon=6).mean[:, 0]
    now = Selecting().fit(panel).predict(panel, horizon=6).mean[:, 0]
    assert np.abs(now - new_level).max() < 0.05 * new_level
    assert np.abs(old - new_level).max() > 0.2 * new_level
