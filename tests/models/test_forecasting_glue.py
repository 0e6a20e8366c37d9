"""placement.forecast.forecaster: bad logs get a sane forecast with notes, or a clear error."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from models.preload import HotRule
from models.series import CountPanel
from placement.domain import AdapterId
from placement.errors import ForecastError
from placement.forecast.forecaster import (
    FORECAST_COLUMNS,
    MAX_HISTORY_S,
    ModelForecaster,
    forecast_demand,
    preloads,
)
from placement.inputs.request_log import request_log_from_frame
from placement.settings import ForecastSettings

AT = pd.Timestamp("2026-01-05T00:00:00Z")
#: forecast_demand has no defaults of its own: the settings tree's are passed.
FORECAST = ForecastSettings()
BUCKET_S, HORIZON_S = FORECAST.bucket_s, FORECAST.horizon_s


def rows(*pairs: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        {"ts": pd.to_datetime([p[0] for p in pairs], utc=True), "adapter": [p[1] for p in pairs]}
    )


def assert_sane_frame(frame: pd.DataFrame) -> None:
    assert tuple(frame.columns) == FORECAST_COLUMNS
    values = frame[list(FORECAST_COLUMNS[2:])].to_numpy()
    assert np.isfinite(values).all()
    assert (values >= 0).all()
    assert (frame["p_nonzero"] <= 1).all()
    assert (frame["q50"] <= frame["q90"]).all() and (frame["q90"] <= frame["q99"]).all()


def test_empty_log_is_a_clear_error() -> None:
    empty = pd.DataFrame(
        {"ts": pd.Series([], dtype="datetime64[ns, UTC]"), "adapter": pd.Series([], dtype=str)}
    )
    with pytest.raises(ForecastError, match="no requests before"):
        forecast_demand(empty, at=AT, horizon_s=HORIZON_S, bucket_s=BUCKET_S)


def test_log_only_after_the_origin_is_a_clear_error() -> None:
    with pytest.raises(ForecastError, match="no requests before"):
        forecast_demand(
            rows(("2026-01-06T00:00", "a")), at=AT, horizon_s=HORIZON_S, bucket_s=BUCKET_S
        )


def spread(
    days: float, *, adapters: tuple[str, ...] = ("a", "b"), every_min: int = 7
) -> pd.DataFrame:
    stamps = pd.date_range(
        AT - pd.Timedelta(days=days), AT, freq=f"{every_min}min", inclusive="left"
    )
    return pd.DataFrame(
        {"ts": np.tile(stamps, len(adapters)), "adapter": np.repeat(adapters, len(stamps))}
    )


def with_gap(frame: pd.DataFrame) -> pd.DataFrame:
    ts = frame["ts"]
    return frame[(ts < AT - pd.Timedelta(days=2)) | (ts >= AT - pd.Timedelta(days=1))]


def duplicated(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([frame, frame.iloc[::3]])


def in_berlin(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(ts=frame["ts"].dt.tz_convert("Europe/Berlin"))


CASES: dict[str, Callable[[], pd.DataFrame]] = {
    "shorter-than-a-day": lambda: spread(0.3),
    "one-request": lambda: rows(("2026-01-04T09:00", "lonely")),
    "one-request-next-to-a-busy-one": lambda: pd.concat(
        [spread(4, adapters=("busy",)), rows(("2026-01-03T09:00", "lonely"))]
    ),
    "gaps": lambda: with_gap(spread(4)),
    "duplicates": lambda: duplicated(spread(2)),
    "out-of-order": lambda: spread(2).sample(frac=1.0, random_state=3),
    "other-time-zone": lambda: in_berlin(spread(2)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_logs_still_get_a_sane_forecast(case: str) -> None:
    result = forecast_demand(CASES[case](), at=AT, horizon_s=6 * 3600, bucket_s=BUCKET_S)
    assert_sane_frame(result.frame)
    assert result.frame["ts"].min() == AT
    assert len(result.frame) == 6 * 3600 // BUCKET_S * len(result.models)


@pytest.mark.parametrize(
    ("case", "note"),
    [
        ("shorter-than-a-day", "too short"),
        ("duplicates", "duplicate"),
        ("other-time-zone", "converted to UTC"),
    ],
)
def test_fallbacks_and_cleaning_are_said(case: str, note: str) -> None:
    result = forecast_demand(CASES[case](), at=AT, horizon_s=3600, bucket_s=BUCKET_S)
    assert any(note in n for n in result.notes), result.notes


def test_unknown_zone_and_unknown_model() -> None:
    result = forecast_demand(
        spread(1),
        at=AT,
        horizon_s=3600,
        bucket_s=BUCKET_S,
        timezones={"a": "Mars/Olympus"},
        model="profile-7d",
    )
    assert any("Mars/Olympus" in n for n in result.notes)
    with pytest.raises(ForecastError, match="unknown forecaster"):
        forecast_demand(
            spread(1), at=AT, horizon_s=HORIZON_S, bucket_s=BUCKET_S, model="crystal-ball"
        )


def test_daily_pattern_reaches_the_frame_and_the_schedule(
    seasonal_panel: Callable[..., CountPanel], to_requests: Callable[[CountPanel], pd.DataFrame]
) -> None:
    panel = seasonal_panel(days=4, peaks=(40.0,))
    at = datetime.fromtimestamp(panel.end_s, tz=UTC)
    result = forecast_demand(
        to_requests(panel), at=at, model="profile-7d", horizon_s=86_400, bucket_s=panel.bucket_s
    )
    by_hour = result.frame.set_index("ts")["mean"]
    peak = by_hour.idxmax()
    assert isinstance(peak, pd.Timestamp)
    assert peak.hour in (12, 13, 14)
    rule = HotRule(mean_per_bucket=10.0, p_nonzero=1.1)
    (rise,) = preloads(result, settings=ForecastSettings(preload_lead_s=900), rule=rule)
    assert rise.needed_at_s - rise.load_at_s == 900


def test_model_forecaster_is_the_controllers_port(
    seasonal_panel: Callable[..., CountPanel], to_requests: Callable[[CountPanel], pd.DataFrame]
) -> None:
    panel = seasonal_panel(days=3, peaks=(40.0, 2.0))
    log = request_log_from_frame(to_requests(panel))
    start = datetime.fromtimestamp(panel.end_s + 12 * 3600, tz=UTC)  # 12:00, near the peak
    forecaster = ModelForecaster(settings=FORECAST, model="profile-7d")
    demand = forecaster(log, start=start, duration_s=3600)
    assert set(demand) == {"adapter-0", "adapter-1"}
    first, second = demand[AdapterId("adapter-0")], demand[AdapterId("adapter-1")]
    assert first.mean_rps > second.mean_rps > 0
    assert first.q90_rps >= first.mean_rps


def test_a_model_that_cannot_fit_falls_back_and_says_so() -> None:
    result = forecast_demand(
        spread(0.2), at=AT, horizon_s=3600, bucket_s=BUCKET_S, model="global-gbm"
    )
    assert any("fell back to ewma" in n for n in result.notes), result.notes
    assert set(result.models.values()) == {"ewma"}
    assert_sane_frame(result.frame)


def test_learned_events_merge_with_declared_logins() -> None:
    from placement.domain import AdapterId, Pipelines, TenantId
    from placement.forecast.forecaster import learn_events

    rng = np.random.default_rng(4)
    rows = []
    for k in range(40):  # sessions 2 h apart: chat first, then the extractor in 70% of them
        start = AT - pd.Timedelta(hours=2 * (k + 1))
        rows.append((start, "acme-chat", "acme"))
        if rng.random() < 0.7:
            rows.append((start + pd.Timedelta(seconds=30), "legal-extract", "acme"))
    log = request_log_from_frame(pd.DataFrame(rows, columns=["ts", "adapter", "tenant"]))
    declared = Pipelines(logins={TenantId("globex"): (AdapterId("globex-bot"),)})
    events = learn_events(log, pipelines=declared)
    after = events.after_request(tenant="acme", adapter="acme-chat", at_s=0.0)
    assert [p.adapter for p in after] == ["legal-extract"]
    assert 0.55 <= after[0].probability <= 0.85
    assert [p.adapter for p in events.after_login(tenant="globex", at_s=10.0)] == ["globex-bot"]
    assert {p.adapter for p in events.after_login(tenant="acme", at_s=10.0)} == {
        "acme-chat",
        "legal-extract",
    }


def test_history_beyond_the_cap_is_left_out_and_said() -> None:
    """A log reaching back to 1970 (seconds from a trace's start read as epoch seconds)
    reads at most ``MAX_HISTORY_S`` of history: the panel is dense, and the whole span
    would be millions of buckets of zeros per adapter."""
    log = rows(("1970-01-01T00:00:05Z", "a"), ("2026-01-04T12:00:00Z", "a"))
    forecast = forecast_demand(log, at=AT, horizon_s=HORIZON_S, bucket_s=BUCKET_S, model="ewma")
    assert forecast.history is not None
    assert forecast.history.n_buckets == MAX_HISTORY_S // BUCKET_S
    assert any("left out: the log reaches back to 1970-01-01" in n for n in forecast.notes)
    assert_sane_frame(forecast.frame)


def test_history_within_the_cap_is_read_whole() -> None:
    log = rows(("2025-12-01T00:00:00Z", "a"), ("2026-01-04T12:00:00Z", "a"))
    forecast = forecast_demand(log, at=AT, horizon_s=HORIZON_S, bucket_s=BUCKET_S, model="ewma")
    assert forecast.history is not None
    assert forecast.history.start_s == int(pd.Timestamp("2025-12-01T00:00:00Z").timestamp())
    assert not any("left out" in n for n in forecast.notes)
