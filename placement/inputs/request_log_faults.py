"""What can be wrong in a request log's rows: the contract's columns and each fault.

The contract (ARCHITECTURE.md) is in the names here: the per-request columns, the
counts, the outcomes, and what an adapter's name may be. Each finder takes a raw frame
(as read, before any normalising) and returns its faults with the rows they are in, so
that ``placement.inputs.request_log`` can list them all (``check_request_log``), or
leave those rows out of a live log (``request_log_from_frame(skip_bad_rows=True)``).
A row is named by its line in the file where the reader gives each row's line (CSV,
JSON lines: ``lines``), else by its place in the frame from 1: a Parquet file's rows,
or a frame built in memory (no header, no lines).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import cast

import numpy as np
import pandas as pd

from placement.errors import Problem
from placement.inputs.csv_lines import CsvLines
from placement.inputs.json_lines import lines_entry

PER_REQUEST_COLUMNS = (
    "ts",
    "adapter",
    "tenant",
    "prompt_tokens",
    "output_tokens",
    "pod",
    "outcome",
    "ttft_ms",
)
COUNT_COLUMNS = ("prompt_tokens", "output_tokens", "ttft_ms", "requests")
#: Counts: whole numbers. ``requests`` (a bucket's count) is also never missing.
INTEGER_COLUMNS = frozenset({"prompt_tokens", "output_tokens", "requests"})
OUTCOMES = frozenset({"gpu_hit", "cpu_hit", "cold_load"})
#: An adapter (or served model) name as the engines and the router take it.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,252}\Z")  # \Z: "$" takes a "\n"
_SHOW_ROWS = 5
#: The seconds since the epoch a time can hold (pandas' nanoseconds, 1677 to 2262):
#: converting one past them raises OverflowError, even when asked to coerce.
_SECONDS_RANGE = (pd.Timestamp.min.timestamp(), pd.Timestamp.max.timestamp())


def parse_ts(column: pd.Series) -> pd.Series:
    """A ``ts`` column as UTC times: datetimes, seconds since the epoch, or ISO 8601
    text, or a mix of the last two (JSON lines, each row its own); what does not parse
    is NaT."""
    if pd.api.types.is_datetime64_any_dtype(column):
        return pd.to_datetime(column, utc=True)
    if pd.api.types.is_numeric_dtype(column):
        return _from_seconds(column)
    parsed = pd.to_datetime(column, utc=True, errors="coerce", format="ISO8601")
    unparsed = column[parsed.isna() & column.notna()]  # looked at value by value: few
    numbers = unparsed[unparsed.map(_is_number).astype(bool)]
    if len(numbers):
        parsed.loc[numbers.index] = _from_seconds(numbers)
    return parsed


def _from_seconds(values: pd.Series) -> pd.Series:
    """Seconds since the epoch as UTC times; NaT past the times a frame holds (a row
    of 1e300 seconds failed the whole read: OverflowError)."""
    seconds = pd.to_numeric(values, errors="coerce").astype(float)
    low, high = _SECONDS_RANGE
    within = seconds.where((seconds > low) & (seconds < high))
    return pd.to_datetime(within, unit="s", utc=True, errors="coerce")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rows(index: Iterable[int]) -> str:
    rows = [int(i) + 1 for i in index]  # from 1: a Parquet file has no header line
    shown = ", ".join(str(r) for r in rows[:_SHOW_ROWS])
    more = f" and {len(rows) - _SHOW_ROWS} more" if len(rows) > _SHOW_ROWS else ""
    label = "row" if len(rows) == 1 else "rows"
    return f"{label} {shown}{more}"


#: One fault: the field, what is wrong, and the rows it is in.
_Fault = tuple[str, str, pd.Index]


def _faulty_rows(field: str, rows: pd.Index, message: str) -> list[_Fault]:
    return [(field, f"{len(rows)} {message}", rows)] if len(rows) else []


def _timestamp_faults(frame: pd.DataFrame, *, by_line: bool) -> list[_Fault]:
    """The ``ts`` faults; one out of time order is earlier than the line (``by_line``)
    or the row before it."""
    ts = parse_ts(frame["ts"])
    valid = ts.dropna()
    return [
        fault
        for message, rows in unread_times(frame["ts"], ts)
        for fault in _faulty_rows("ts", rows, message)
    ] + _faulty_rows(
        "ts",
        valid.index[valid.diff() < pd.Timedelta(0)],
        f"timestamps earlier than the {'line' if by_line else 'row'} before (not in time order)",
    )


def unread_times(column: pd.Series, parsed: pd.Series) -> list[tuple[str, pd.Index]]:
    """The rows of a ``ts`` column that did not parse (NaT in ``parsed``, its
    ``parse_ts``), as two faults: values that are no time ('unparsable timestamps'),
    and times only out of the range a frame holds (said so, with the range)."""
    missing = column[parsed.isna()]  # looked at value by value: few
    beyond = missing.map(_beyond_the_range).astype(bool)
    return [
        ("unparsable timestamps", missing.index[~beyond]),
        (OUT_OF_RANGE, missing.index[beyond]),
    ]


#: What a time past pandas' range is: a log holds 1677-09-21 to 2262-04-11.
OUT_OF_RANGE = (
    f"timestamps outside the times a log can hold ({pd.Timestamp.min:%Y-%m-%d} to "
    f"{pd.Timestamp.max:%Y-%m-%d} UTC)"
)


def _beyond_the_range(value: object) -> bool:
    """Whether a ``ts`` that did not parse is a time, only out of pandas' range (a
    number of seconds, or ISO 8601 text of a year up to 9999): said so, not
    'unparsable'."""
    if _is_number(value):
        seconds = float(cast(float, value))
        return math.isfinite(seconds)
    if isinstance(value, str):
        try:
            datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return False
        return True
    return False


def _value_faults(frame: pd.DataFrame) -> list[_Fault]:
    adapters = frame["adapter"]
    present = adapters.notna() & (adapters.astype(str) != "")
    faults = _faulty_rows("adapter", frame.index[~present], "rows without an adapter")
    named = adapters[present].astype(str)
    faults += _faulty_rows(
        "adapter",
        named.index[~named.map(lambda name: ADAPTER_NAME.match(name) is not None)],
        "adapter names that are not valid names (letters, digits and ._:/@+-)",
    )
    for column in (c for c in COUNT_COLUMNS if c in frame.columns):
        faults += _count_faults(frame, column)
    faults += _nested_faults(frame)
    if "outcome" in frame.columns:
        outcomes = frame["outcome"]
        expected = ", ".join(sorted(OUTCOMES))
        faults += _faulty_rows(
            "outcome",
            frame.index[outcomes.notna() & ~outcomes.isin(OUTCOMES)],
            f"unknown outcomes (expected {expected})",
        )
    return faults


#: Columns whose other checks already name a list or an object in them as a fault.
_CHECKED = frozenset({"ts", "adapter", "outcome", *COUNT_COLUMNS})


def _nested_faults(frame: pd.DataFrame) -> list[_Fault]:
    """A list or an object (JSON's) where a text is due, as in ``tenant`` or ``pod``: it
    would make the rows unhashable, so that no duplicate could be dropped, and a live
    reader would fail at that line at every read."""
    faults: list[_Fault] = []
    for column in frame.columns:
        values = frame[column]
        if column in _CHECKED or values.dtype != object:
            continue
        try:
            pd.unique(values)  # the common case: every value hashable, at C speed
        except TypeError:
            nested = values.map(_unhashable).astype(bool)
            faults += _faulty_rows(
                str(column), frame.index[nested], "values that are lists or objects"
            )
    return faults


def _unhashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return True
    return False


def _count_faults(frame: pd.DataFrame, column: str) -> list[_Fault]:
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce").astype(float)
    text_nan = values.isna() & raw.notna()
    faults = _faulty_rows(column, frame.index[text_nan], "values that are not numbers")
    if column == "requests":
        faults += _faulty_rows(column, frame.index[raw.isna()], "missing counts")
    finite = np.isfinite(values)
    faults += _faulty_rows(
        column, frame.index[values.notna() & ~finite], "infinite values (inf is not a count)"
    )
    faults += _faulty_rows(column, frame.index[finite & (values < 0)], "negative values")
    if column in INTEGER_COLUMNS:
        fractional = finite & (values != np.floor(values.where(finite, 0.0)))
        faults += _faulty_rows(column, frame.index[fractional], "values that are not whole numbers")
    return faults


def _unknown_adapters(frame: pd.DataFrame, known: frozenset[str], shown: int = 20) -> list[str]:
    adapters = frame["adapter"].astype(str)
    unknown = adapters[~adapters.isin(known)].value_counts()
    lines = [
        f"adapter {name!r} is not in the catalog ({count} requests)"
        for name, count in unknown.head(shown).items()
    ]
    if len(unknown) > shown:
        lines.append(f"{len(unknown) - shown} more adapters are not in the catalog")
    return lines


def _missing_columns(frame: pd.DataFrame, source: str) -> list[Problem]:
    columns = ", ".join(map(str, frame.columns))
    return [
        Problem(
            source=source, field=c, message=f"missing required column {c!r} (columns: {columns})"
        )
        for c in ("ts", "adapter")
        if c not in frame.columns
    ]


def log_problems(
    frame: pd.DataFrame,
    source: str,
    known_adapters: frozenset[str] | None,
    *,
    lines: Sequence[int] | None = None,
) -> list[Problem]:
    """Every fault of a raw log frame; unknown adapters are warnings, the rest errors.
    ``lines``: each row's line in its file (CSV, JSON lines), named instead of a row."""
    missing = _missing_columns(frame, source)
    if missing:
        return missing
    problems = [
        Problem(
            source=source,
            field=field,
            message=message,
            entry=rows_entry(rows, lines),
        )
        for field, message, rows in _timestamp_faults(frame, by_line=lines is not None)
        + _value_faults(frame)
    ]
    if known_adapters is not None:
        problems += [
            Problem(source=source, field="adapter", message=message, severity="warning")
            for message in _unknown_adapters(frame, known_adapters)
        ]
    return problems


def fatal_faults(
    frame: pd.DataFrame,
    source: str,
    *,
    lines: Sequence[int] | None = None,
    file_rows: Sequence[int] | None = None,
) -> list[tuple[Problem, pd.Index | None]]:
    """Each fault as a Problem with its rows (None: the whole file, a missing column),
    named by row (its place in the file where ``file_rows`` gives it), or by line where
    ``lines`` gives each row's line in the file (a missing column then names every line
    of JSON lines, all without the key; a CSV's is its header's fault, no line's)."""
    missing = _missing_columns(frame, source)
    if missing and lines is not None and not isinstance(lines, CsvLines):
        missing = [replace(p, entry=lines_entry(list(lines))) for p in missing]
    if missing:
        return [(p, None) for p in missing]
    return [
        (
            Problem(
                source=source,
                field=name,
                message=message,
                entry=rows_entry(rows, lines, file_rows=file_rows),
            ),
            rows,
        )
        for name, message, rows in _timestamp_faults(frame, by_line=lines is not None)
        + _value_faults(frame)
    ]


def rows_entry(
    rows: pd.Index, lines: Sequence[int] | None = None, *, file_rows: Sequence[int] | None = None
) -> str:
    """A Problem's entry for rows of a frame: their lines where ``lines`` gives each
    row's line in its file (CSV, JSON lines), their rows in the file from 1 where
    ``file_rows`` gives each row's place there from 0 (a window cut from a Parquet
    file), else their places in the frame from 1 (a Parquet file's rows, or a frame's
    built in memory)."""
    if lines is not None:
        return lines_entry([lines[int(i)] for i in rows])
    if file_rows is not None:
        return _rows(sorted(int(file_rows[int(i)]) for i in rows))
    return _rows(rows)
