"""Series building: counts per bucket from messy request logs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.series import SeriesError, build_panel, local_calendar

T0 = pd.Timestamp("2026-01-01T00:00:00Z")


def frame(*rows: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        {"ts": pd.to_datetime([r[0] for r in rows], utc=True), "adapter": [r[1] for r in rows]}
    )


def test_counts_per_bucket_with_gaps_as_zeros() -> None:
    log = frame(("2026-01-01T00:01", "a"), ("2026-01-01T00:02", "a"), ("2026-01-01T00:45", "b"))
    panel = build_panel(log, bucket_s=600, end_s=int((T0 + pd.Timedelta("1h")).timestamp()))
    assert panel.adapters == ("a", "b")
    assert panel.n_buckets == 6
    assert panel.counts[:, 0].tolist() == [2, 0, 0, 0, 0, 0]
    assert panel.counts[:, 1].tolist() == [0, 0, 0, 0, 1, 0]


def test_out_of_order_rows_count_the_same_as_sorted() -> None:
    log = frame(("2026-01-01T00:45", "b"), ("2026-01-01T00:01", "a"), ("2026-01-01T00:12", "a"))
    end_s = int((T0 + pd.Timedelta("1h")).timestamp())
    shuffled = build_panel(log, bucket_s=600, end_s=end_s)
    ordered = build_panel(log.sort_values("ts"), bucket_s=600, end_s=end_s)
    np.testing.assert_array_equal(shuffled.counts, ordered.counts)


def test_duplicate_request_rows_are_dropped_with_a_note() -> None:
    log = frame(("2026-01-01T00:01", "a"), ("2026-01-01T00:01", "a"), ("2026-01-01T00:02", "a"))
    panel = build_panel(log, bucket_s=600, end_s=int((T0 + pd.Timedelta("10min")).timestamp()))
    assert panel.counts[0, 0] == 2
    assert any("duplicate" in note for note in panel.notes)


def test_aggregated_rows_add_up() -> None:
    log = pd.DataFrame(
        {
            "ts": [T0, T0, T0 + pd.Timedelta("10min")],
            "adapter": ["a", "a", "a"],
            "requests": [3, 3, 5],
        }
    )
    panel = build_panel(log, bucket_s=600, end_s=int((T0 + pd.Timedelta("20min")).timestamp()))
    assert panel.counts[:, 0].tolist() == [6, 5]


def test_only_history_before_the_origin_is_used() -> None:
    log = frame(("2026-01-01T00:01", "a"), ("2026-01-01T00:31", "a"))
    panel = build_panel(log, bucket_s=600, end_s=int((T0 + pd.Timedelta("30min")).timestamp()))
    assert panel.counts.sum() == 1
    assert panel.end_s == int((T0 + pd.Timedelta("30min")).timestamp())


@pytest.mark.parametrize(
    ("ts", "note"),
    [
        (pd.Series(pd.to_datetime(["2026-01-01T00:01"])), "no time zone"),
        (
            pd.Series(pd.to_datetime(["2026-01-01T01:01"]).tz_localize("Europe/Berlin")),
            "converted to UTC",
        ),
    ],
    ids=["naive", "berlin"],
)
def test_time_zones_are_read_as_utc(ts: pd.Series, note: str) -> None:
    log = pd.DataFrame({"ts": ts, "adapter": ["a"]})
    panel = build_panel(log, bucket_s=600, end_s=int((T0 + pd.Timedelta("10min")).timestamp()))
    assert panel.counts[0, 0] == 1  # 01:01 Berlin is 00:01 UTC: the first bucket
    assert any(note in n for n in panel.notes)


@pytest.mark.parametrize(
    ("log", "message"),
    [
        (pd.DataFrame({"ts": [T0]}), "lacks column"),
        (frame(("2026-01-02T00:00", "a")), "no requests before"),
    ],
    ids=["no-adapter-column", "all-after-origin"],
)
def test_unusable_frames_say_why(log: pd.DataFrame, message: str) -> None:
    with pytest.raises(SeriesError, match=message):
        build_panel(log, bucket_s=600, end_s=int((T0 + pd.Timedelta("1h")).timestamp()))


def test_catalog_adapters_without_history_get_zeros() -> None:
    log = frame(("2026-01-01T00:01", "a"))
    panel = build_panel(
        log, bucket_s=600, end_s=int((T0 + pd.Timedelta("10min")).timestamp()), adapters=["z"]
    )
    assert panel.adapters == ("a", "z")
    assert panel.counts[:, 1].sum() == 0


def test_local_calendar_follows_each_adapters_zone() -> None:
    starts = np.array([int(T0.timestamp())], dtype=np.int64)  # 00:00 UTC, a Thursday
    minute, weekday = local_calendar(starts, ["utc", "mx"], {"mx": "America/Mexico_City"})
    assert minute[0].tolist() == [0, 18 * 60]  # 18:00 the day before in Mexico City
    assert weekday[0].tolist() == [3, 2]
