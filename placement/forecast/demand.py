"""Per-adapter demand for one plan window, from a forecast file or from a request log.

The solver wants two numbers per adapter for the plan's validity window: the mean rate
(for expected misses) and an upper quantile (q90, for capacity), in requests per
second. A forecast (Parquet: ``ts``, ``adapter``, ``mean``, ``q50``, ``q90``, ``q99``,
``p_nonzero``, in requests per bucket) gives them directly: the mean of ``mean`` over
the window's buckets, and the largest ``q90`` (the plan must carry the window's peak).

A log is first forecast by ``placement.forecast.forecaster.forecast_demand``, whose frame
``demand_from_forecast`` then reads like a file's. ``DemandForecaster`` is the port the
controller and the replay simulator forecast through (``ModelForecaster`` its real
implementation).

``read_forecast`` is the only function here that reads a file; the others are pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from placement.domain import AdapterId
from placement.errors import ForecastError, InputError, Problem
from placement.inputs.request_log import RequestLog
from placement.solver.problem import Demand

FORECAST_COLUMNS = ("ts", "adapter", "mean", "q90")
_SHOW_BUCKETS = 3


class DemandForecaster(Protocol):
    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        """Each adapter's traffic over [start, start + duration_s)."""
        ...


def read_forecast(path: str | Path) -> pd.DataFrame:
    """Read a forecast Parquet file; InputError names the file and each fault: a missing
    column, a ``ts`` that is missing, no time or without a timezone (by its row and
    adapter), a rate (``mean``, ``q90``, and ``q50``, ``q99`` where given) that is no
    number >= 0, a ``p_nonzero`` (where given) that is no probability in [0, 1], a
    quantile below the one before it (by its bucket)."""
    source = Path(path)
    try:
        frame = pd.read_parquet(source)
    except (OSError, ValueError) as exc:
        raise InputError([Problem(source=str(source), message=f"cannot read: {exc}")]) from None
    missing = [c for c in FORECAST_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(
            [
                Problem(
                    source=str(source),
                    message=f"missing columns {', '.join(missing)} "
                    f"(a forecast has {', '.join(FORECAST_COLUMNS)}, q50, q99, p_nonzero)",
                )
            ]
        )
    times, time_faults = _times(frame["ts"])
    frame = frame.assign(ts=times, adapter=frame["adapter"].astype(str))
    problems = (
        [
            Problem(source=str(source), entry=_rows(frame, rows), field="ts", message=message)
            for message, rows in time_faults
        ]
        + [
            Problem(source=str(source), entry=entry, field=column, message=message)
            for column in _rate_columns(frame)
            for entry, message in _rate_faults(frame, column)
        ]
        + [
            Problem(source=str(source), entry=entry, field=_PROBABILITY, message=message)
            for entry, message in _probability_faults(frame)
        ]
    )
    if not problems:
        problems = [
            Problem(source=str(source), entry=entry, field=column, message=message)
            for column, entry, message in _crossing_quantiles(frame)
        ]
    if problems:
        raise InputError(problems)
    return frame


#: The rate columns, required first: each a number >= 0 where the file has it.
_RATES = ("mean", "q90", "q50", "q99")
#: The quantiles in their order; a distribution's quantiles never fall.
_QUANTILES = ("q50", "q90", "q99")


def _rate_columns(frame: pd.DataFrame) -> list[str]:
    return [column for column in _RATES if column in frame.columns]


def _crossing_quantiles(frame: pd.DataFrame) -> list[tuple[str, str, str]]:
    """Each quantile below the one before it (``q99`` under ``q90``, ``q90`` under
    ``q50``), by bucket. ``q90`` under ``mean`` is not a fault: a sparse adapter's
    count is 0 in more than 90% of its buckets, so its q90 is 0 and its mean is not
    (``lorafleet forecast --model ewma`` writes such buckets; the plan takes the larger)."""
    present = [column for column in _QUANTILES if column in frame.columns]
    faults = []
    for lower, upper in itertools.pairwise(present):
        below = frame[upper].to_numpy(dtype=float) < frame[lower].to_numpy(dtype=float)
        if below.any():
            entry = _buckets(frame.iloc[np.flatnonzero(below)])
            message = f"{below.sum()} below {lower} (quantiles rise: q50 <= q90 <= q99)"
            faults.append((upper, entry, message))
    return faults


def _times(values: pd.Series) -> tuple[pd.Series, list[tuple[str, np.ndarray | None]]]:
    """``ts`` as UTC times (NaT where it is no time), and what is wrong in it, each with
    the rows it is in (None: the whole column). A time without a timezone is refused,
    not read as UTC: a local time taken for UTC shifts every bucket by hours."""
    if pd.api.types.is_datetime64_any_dtype(values):
        if getattr(values.dtype, "tz", None) is None:
            return pd.Series(pd.NaT, index=values.index, dtype="datetime64[ns, UTC]"), [
                (f"times without a timezone (a column of {values.dtype}); {_TIMES}", None)
            ]
        times = values.dt.tz_convert("UTC")
        return times, _faults((("times missing", np.flatnonzero(times.isna()), []),))
    if not (pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)):
        return pd.Series(pd.NaT, index=values.index, dtype="datetime64[ns, UTC]"), [
            (f"not times (a column of {values.dtype}); {_TIMES}", None)
        ]
    parsed = [_time(value) for value in values]
    kinds = np.array([kind for kind, _ in parsed])
    times = pd.Series([time for _, time in parsed], index=values.index, dtype="datetime64[ns, UTC]")
    shown = values.to_numpy()
    return times, _faults(
        (message, np.flatnonzero(kinds == kind), list(shown[kinds == kind]) if show else [])
        for kind, message, show in (
            ("missing", "times missing", False),
            ("not a time", "values that are not times", True),
            ("no timezone", "times without a timezone", True),
        )
    )


#: What a forecast's ``ts`` is, said where it is not.
_TIMES = "a forecast's times are timestamps with a timezone, or ISO 8601 text with an offset"


def _time(value: object) -> tuple[str, pd.Timestamp | None]:
    """One ``ts`` value of a column of objects or text: ("ok", its UTC time), or what
    is wrong with it ("missing", "not a time", "no timezone") and None."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NaT:
        return "missing", None
    if not isinstance(value, str | datetime):
        return "not a time", None
    try:
        time = pd.Timestamp(value)
    except ValueError:  # DateParseError, OutOfBoundsDatetime
        return "not a time", None
    if pd.isna(time):  # the empty text
        return "missing", None
    if time.tzinfo is None:
        return "no timezone", None
    return "ok", time.tz_convert("UTC")


def _faults(
    found: Iterable[tuple[str, np.ndarray, list[object]]],
) -> list[tuple[str, np.ndarray | None]]:
    """Each fault found in ``ts`` with its rows: its count, what it is, the first
    values (where they say more than 'missing')."""
    faults: list[tuple[str, np.ndarray | None]] = []
    for message, rows, values in found:
        if not len(rows):
            continue
        examples = ", ".join(repr(v) for v in values[:_SHOW_BUCKETS])
        faults.append((f"{len(rows)} {message}" + (f" ({examples})" if values else ""), rows))
    return faults


def _rows(frame: pd.DataFrame, rows: np.ndarray | None) -> str | None:
    """A Problem's entry for rows of a forecast whose time is at fault: their number in
    the file (from 1, in the order written; not the index's labels) and adapter, as
    "row 3 (a1)"; None for the whole column."""
    if rows is None:
        return None
    adapters = frame["adapter"].to_numpy()
    shown = ", ".join(f"{int(i) + 1} ({adapters[i]})" for i in rows[:_SHOW_BUCKETS])
    more = f" and {len(rows) - _SHOW_BUCKETS} more" if len(rows) > _SHOW_BUCKETS else ""
    return f"{'row' if len(rows) == 1 else 'rows'} {shown}{more}"


def _numbers(values: pd.Series) -> np.ndarray | str:
    """A numeric column as floats (missing as NaN), or why it is not one."""
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        return f"not numbers (a column of {values.dtype})"
    return values.to_numpy(dtype=float, na_value=np.nan)


def _rate_faults(frame: pd.DataFrame, column: str) -> list[tuple[str | None, str]]:
    """What is wrong in a rate column (per bucket, so a number >= 0), each with the
    buckets it is in, named by adapter and time: a Parquet file has no lines, and its
    rows' numbers are whatever index it was written with."""
    numbers = _numbers(frame[column])
    if isinstance(numbers, str):
        return [(None, f"{numbers}; rates are numbers >= 0")]
    return _bucket_faults(
        frame,
        (
            ("rates that are not numbers (NaN)", np.isnan(numbers)),
            ("infinite rates", np.isinf(numbers)),
            ("negative rates", np.isfinite(numbers) & (numbers < 0)),
        ),
    )


#: The probability column, optional: P(any request in the bucket).
_PROBABILITY = "p_nonzero"


def _probability_faults(frame: pd.DataFrame) -> list[tuple[str | None, str]]:
    """What is wrong in ``p_nonzero`` where the file has it (a probability, so a number
    in [0, 1]), each with its buckets as in ``_rate_faults``. The forecasters clip it to
    [0, 1] (``models.base.sanitize``): a file outside it was not written by them."""
    if _PROBABILITY not in frame.columns:
        return []
    numbers = _numbers(frame[_PROBABILITY])
    if isinstance(numbers, str):
        return [(None, f"{numbers}; {_PROBABILITIES}")]
    return _bucket_faults(
        frame,
        (
            (f"probabilities that are not numbers (NaN); {_PROBABILITIES}", np.isnan(numbers)),
            (f"probabilities below 0; {_PROBABILITIES}", numbers < 0),
            (f"probabilities above 1; {_PROBABILITIES}", numbers > 1),
        ),
    )


#: What a forecast's ``p_nonzero`` is, said where it is not.
_PROBABILITIES = "p_nonzero is P(any request in the bucket), a number in [0, 1]"


def _bucket_faults(
    frame: pd.DataFrame, found: Iterable[tuple[str, np.ndarray]]
) -> list[tuple[str | None, str]]:
    """Each fault found in a column of numbers with its count and its buckets."""
    return [
        (_buckets(frame.iloc[np.flatnonzero(bad)]), f"{bad.sum()} {message}")
        for message, bad in found
        if bad.any()
    ]


def _buckets(rows: pd.DataFrame) -> str:
    """A Problem's entry for forecast buckets: "bucket a1 at 2026-03-09T04:00:00+00:00"."""
    shown = ", ".join(
        f"{adapter} at {'no time' if pd.isna(ts) else ts.isoformat()}"
        for adapter, ts in rows[["adapter", "ts"]].head(_SHOW_BUCKETS).itertuples(index=False)
    )
    more = f" and {len(rows) - _SHOW_BUCKETS} more" if len(rows) > _SHOW_BUCKETS else ""
    return f"{'bucket' if len(rows) == 1 else 'buckets'} {shown}{more}"


def bucket_seconds(frame: pd.DataFrame, *, default_s: int) -> int:
    """The spacing of the forecast's buckets (smallest step of one adapter's times)."""
    steps = frame.sort_values("ts").groupby("adapter")["ts"].diff().dropna()
    steps = steps[steps > pd.Timedelta(0)]
    return int(steps.min().total_seconds()) if not steps.empty else default_s


def demand_from_forecast(
    frame: pd.DataFrame, *, at: datetime, validity_s: int, bucket_s: int
) -> dict[AdapterId, Demand]:
    """Mean and peak q90 rates over the window ``[at, at + validity_s)``."""
    end = at + timedelta(seconds=validity_s)
    window = frame[(frame["ts"] >= at) & (frame["ts"] < end)]
    if window.empty:
        first, last = frame["ts"].min(), frame["ts"].max()
        raise ForecastError(
            f"the forecast has no bucket between {at.isoformat()} and {end.isoformat()}; "
            f"it covers {first} to {last}: forecast further ahead or plan inside its range"
        )
    grouped = window.groupby("adapter")
    means = grouped["mean"].mean() / bucket_s
    peaks = grouped["q90"].max() / bucket_s
    return {
        AdapterId(str(name)): Demand(
            mean_rps=float(means[name]), q90_rps=float(max(peaks[name], means[name]))
        )
        for name in sorted(means.index)
    }
