"""read_forecast: a bad rate in a forecast file is named by its bucket (adapter and time).

A Parquet file has no lines a person can go to, and the numbers of its rows are the
index it was written with (a frame filtered before ``to_parquet`` keeps its labels), so
a bad bucket is named by what the person wrote: its adapter and its time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from placement.errors import InputError
from placement.forecast.demand import read_forecast

T0 = pd.Timestamp("2026-03-09T04:00:00Z")


def _forecast(
    path: Path,
    mean: Sequence[object],
    q90: Sequence[object],
    ts: Sequence[object] | None = None,
    *,
    q50: object = 0.0,
    q99: object = 100.0,
    p_nonzero: object = 1.0,
) -> Path:
    """Buckets of 600 s for a1, a2, a1, ..., written with the index 10, 11, ... (the
    labels of a frame cut from a larger one); ``ts`` instead of those times."""
    count = len(mean)
    frame = pd.DataFrame(
        {
            "ts": [T0 + pd.Timedelta(seconds=600 * (i // 2)) for i in range(count)]
            if ts is None
            else ts,
            "adapter": ["a1" if i % 2 == 0 else "a2" for i in range(count)],
            "mean": mean,
            "q50": q50,
            "q90": q90,
            "q99": q99,
            "p_nonzero": p_nonzero,
        },
        index=range(10, 10 + count),
    )
    frame.to_parquet(path)
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(InputError) as caught:
        read_forecast(path)
    return [str(problem) for problem in caught.value.problems]


def test_a_negative_mean_names_its_adapter_and_time_not_a_row_index(tmp_path: Path) -> None:
    path = _forecast(tmp_path / "f.parquet", [1.0, 1.0, 1.0, -2.0], [2.0] * 4)
    assert _problems(path) == [
        f"{path}: bucket a2 at 2026-03-09T04:10:00+00:00: mean: 1 negative rates"
    ]


def test_a_missing_q90_is_refused_as_a_missing_mean_is(tmp_path: Path) -> None:
    """A q90 of NaN passed (only mean was checked for NaN): a NaN q90 for the solver."""
    path = _forecast(tmp_path / "f.parquet", [1.0, np.nan, 1.0, 1.0], [2.0, 2.0, np.nan, 2.0])
    assert _problems(path) == [
        f"{path}: bucket a2 at 2026-03-09T04:00:00+00:00: mean: 1 rates that are not numbers (NaN)",
        f"{path}: bucket a1 at 2026-03-09T04:10:00+00:00: q90: 1 rates that are not numbers (NaN)",
    ]


def test_many_bad_buckets_are_counted_and_the_first_shown(tmp_path: Path) -> None:
    path = _forecast(tmp_path / "f.parquet", [1.0] * 8, [-1.0] * 7 + [np.inf])
    (infinite, negative) = _problems(path)
    assert negative == (
        f"{path}: buckets a1 at 2026-03-09T04:00:00+00:00, a2 at 2026-03-09T04:00:00+00:00, "
        "a1 at 2026-03-09T04:10:00+00:00 and 4 more: q90: 7 negative rates"
    )
    assert infinite.startswith(f"{path}: bucket a2 at 2026-03-09T04:30:00+00:00: q90: 1 infinite")


def test_a_rate_column_of_text_is_one_problem_not_a_type_error(tmp_path: Path) -> None:
    path = _forecast(tmp_path / "f.parquet", ["1.0", "fast"], [2.0, 2.0])
    assert _problems(path) == [
        f"{path}: mean: not numbers (a column of object); rates are numbers >= 0"
    ]


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        pytest.param(
            ["2026-03-09T04:00:00Z", "soon", None, ""],
            [
                "rows 3 (a1), 4 (a2): ts: 2 times missing",
                "row 2 (a2): ts: 1 values that are not times ('soon')",
            ],
            id="text-not-times-and-missing",
        ),
        pytest.param(
            ["2026-03-09T04:00:00Z", "2026-03-09T04:00:00", "2026-03-09T04:10:00+01:00", "later"],
            [
                "row 4 (a2): ts: 1 values that are not times ('later')",
                "row 2 (a2): ts: 1 times without a timezone ('2026-03-09T04:00:00')",
            ],
            id="text-without-timezone",
        ),
        pytest.param(
            [pd.Timestamp("2026-03-09T04:00:00")] * 4,
            [
                "ts: times without a timezone (a column of datetime64[ns]); a forecast's "
                "times are timestamps with a timezone, or ISO 8601 text with an offset"
            ],
            id="naive-timestamps",
        ),
        pytest.param(
            [1773028800] * 4,
            [
                "ts: not times (a column of int64); a forecast's times are timestamps with "
                "a timezone, or ISO 8601 text with an offset"
            ],
            id="numbers",
        ),
        pytest.param([T0, pd.NaT, T0, T0], ["row 2 (a2): ts: 1 times missing"], id="NaT"),
    ],
)
def test_a_bad_time_is_named_by_its_row_and_adapter(
    tmp_path: Path, ts: list[object], expected: list[str]
) -> None:
    """A ts that is missing, no time or has no timezone was read: NaT, or a local time
    taken for UTC; text that is no time was a DateParseError traceback."""
    path = _forecast(tmp_path / "f.parquet", [1.0] * 4, [2.0] * 4, ts=ts)
    assert sorted(_problems(path)) == sorted(f"{path}: {line}" for line in expected)


def test_times_with_a_timezone_are_read_as_utc(tmp_path: Path) -> None:
    ts = ["2026-03-09T05:00:00+01:00", "2026-03-09T04:00:00Z"]
    frame = read_forecast(_forecast(tmp_path / "f.parquet", [1.0] * 2, [2.0] * 2, ts=ts))
    assert list(frame["ts"]) == [T0, T0]


def test_a_good_forecast_is_read(tmp_path: Path) -> None:
    path = _forecast(tmp_path / "f.parquet", [0.0, 1.0], [0.0, 2.0])
    frame = read_forecast(path)
    assert list(frame["adapter"]) == ["a1", "a2"]


@pytest.mark.parametrize(
    ("q50", "q90", "q99", "expected"),
    [
        pytest.param(
            0.0,
            [2.0, 2.0, 5.0, 2.0],
            [3.0, 3.0, 4.0, 3.0],
            "bucket a1 at 2026-03-09T04:10:00+00:00: q99: 1 below q90 (quantiles rise: q50 <="
            " q90 <= q99)",
            id="q99-below-q90",
        ),
        pytest.param(
            [1.0, 3.0, 1.0, 3.0],
            [2.0] * 4,
            9.0,
            "buckets a2 at 2026-03-09T04:00:00+00:00, a2 at 2026-03-09T04:10:00+00:00: q90: 2"
            " below q50 (quantiles rise: q50 <= q90 <= q99)",
            id="q90-below-q50",
        ),
        pytest.param(
            0.0,
            [2.0] * 4,
            [3.0, -1.0, 3.0, 3.0],
            "bucket a2 at 2026-03-09T04:00:00+00:00: q99: 1 negative rates",
            id="negative-q99",
        ),
        pytest.param(
            [0.0, 0.0, np.nan, 0.0],
            [2.0] * 4,
            3.0,
            "bucket a1 at 2026-03-09T04:10:00+00:00: q50: 1 rates that are not numbers (NaN)",
            id="nan-q50",
        ),
    ],
)
def test_quantiles_that_fall_or_are_no_rates_are_named_by_their_bucket(
    tmp_path: Path, q50: object, q90: list[float], q99: object, expected: str
) -> None:
    """Only mean and q90 were checked: a q99 under q90, a q90 under q50 (no
    distribution has them) and a negative or NaN q50 or q99 were read as they were."""
    path = _forecast(tmp_path / "f.parquet", [1.0] * 4, q90, q50=q50, q99=q99)
    assert _problems(path) == [f"{path}: {expected}"]


def test_a_q90_below_the_mean_is_read(tmp_path: Path) -> None:
    """Not a fault: a sparse adapter's count is 0 in most buckets, so its q90 is 0 while
    its mean is not; ``lorafleet forecast --model ewma`` writes such buckets."""
    path = _forecast(tmp_path / "f.parquet", [0.07, 1.0], [0.0, 2.0], q99=3.0)
    assert list(read_forecast(path)["q90"]) == [0.0, 2.0]


_P_NONZERO = "p_nonzero is P(any request in the bucket), a number in [0, 1]"


@pytest.mark.parametrize(
    ("p_nonzero", "expected"),
    [
        pytest.param(
            [0.5, 1.5, 0.5, 0.5],
            ["bucket a2 at 2026-03-09T04:00:00+00:00: p_nonzero: 1 probabilities above 1"],
            id="above-one",
        ),
        pytest.param(
            [0.5, 0.5, -0.1, np.inf],
            [
                "bucket a1 at 2026-03-09T04:10:00+00:00: p_nonzero: 1 probabilities below 0",
                "bucket a2 at 2026-03-09T04:10:00+00:00: p_nonzero: 1 probabilities above 1",
            ],
            id="negative-and-infinite",
        ),
        pytest.param(
            [np.nan, 0.5, 0.5, 0.5],
            [
                "bucket a1 at 2026-03-09T04:00:00+00:00: p_nonzero: 1 probabilities that are not"
                " numbers (NaN)"
            ],
            id="nan",
        ),
        pytest.param(
            ["0.5", "likely", "0.5", "0.5"],
            ["p_nonzero: not numbers (a column of object)"],
            id="text",
        ),
    ],
)
def test_a_p_nonzero_that_is_no_probability_is_named_by_its_bucket(
    tmp_path: Path, p_nonzero: list[object], expected: list[str]
) -> None:
    """p_nonzero was not checked at all: a 1.5, a -0.1, a NaN or text was read as it was."""
    path = _forecast(tmp_path / "f.parquet", [1.0] * 4, [2.0] * 4, p_nonzero=p_nonzero)
    assert _problems(path) == [f"{path}: {line}; {_P_NONZERO}" for line in expected]


def test_a_forecast_without_p_nonzero_or_with_its_bounds_is_read(tmp_path: Path) -> None:
    """0 and 1 are probabilities; a file without the column is read as before."""
    path = _forecast(tmp_path / "f.parquet", [0.0, 1.0], [0.0, 2.0], p_nonzero=[0.0, 1.0])
    assert list(read_forecast(path)["p_nonzero"]) == [0.0, 1.0]
    pd.read_parquet(path).drop(columns="p_nonzero").to_parquet(path)
    assert "p_nonzero" not in read_forecast(path).columns
