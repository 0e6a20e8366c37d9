"""Read request logs (Parquet, CSV, JSON lines), per request or pre-aggregated.

The contract (ARCHITECTURE.md): ``ts`` (UTC) and ``adapter``, and optionally
``tenant``, ``prompt_tokens``, ``output_tokens``, ``pod``, ``outcome``, ``ttft_ms``;
or, pre-aggregated, ``ts`` (bucket start), ``adapter`` and ``requests``.

``load_request_log`` is lenient where a forecast can still be made (it sorts
out-of-order rows and drops exact duplicates, and says so in ``notes``);
``check_request_log`` is strict and lists every fault for ``lorafleet validate``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from placement.errors import InputError, Problem

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
OUTCOMES = frozenset({"gpu_hit", "cpu_hit", "cold_load"})
_SHOW_ROWS = 5


@dataclass(frozen=True)
class RequestLog:
    """A request log as a frame sorted by ``ts`` (tz-aware UTC)."""

    frame: pd.DataFrame
    aggregated: bool
    source: str = "log"
    notes: tuple[str, ...] = field(default=())

    def counts(self, bucket_s: int) -> pd.DataFrame:
        """Requests per adapter per bucket: columns ``ts``, ``adapter``, ``requests``."""
        if self.frame.empty:
            return pd.DataFrame(
                {
                    "ts": pd.Series([], dtype="datetime64[ns, UTC]"),
                    "adapter": pd.Series([], dtype=str),
                    "requests": pd.Series([], dtype="int64"),
                }
            )
        bucket = self.frame["ts"].dt.floor(f"{bucket_s}s")
        weights = (
            self.frame["requests"] if self.aggregated else pd.Series(1, index=self.frame.index)
        )
        grouped = weights.groupby([bucket, self.frame["adapter"]], observed=True).sum()
        result = grouped.rename("requests").reset_index()
        result.columns = ["ts", "adapter", "requests"]
        result["requests"] = result["requests"].astype("int64")
        return result


def _read_raw(path: Path) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]).lower()
    try:
        if suffix.endswith(".parquet"):
            return pd.read_parquet(path)
        if suffix.endswith((".csv", ".csv.gz")):
            return pd.read_csv(path)
        if suffix.endswith((".jsonl", ".ndjson", ".json", ".jsonl.gz")):
            return pd.read_json(path, lines=True)
    except FileNotFoundError:
        raise InputError([Problem(source=str(path), message="no such file")]) from None
    except Exception as exc:  # every reader raises its own types
        raise InputError([Problem(source=str(path), message=f"cannot read: {exc}")]) from None
    raise InputError(
        [Problem(source=str(path), message="unknown format: use .parquet, .csv or .jsonl")]
    )


def _parse_ts(column: pd.Series) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(column):
        parsed = pd.to_datetime(column, utc=True)
    elif pd.api.types.is_numeric_dtype(column):
        parsed = pd.to_datetime(column, unit="s", utc=True, errors="coerce")
    else:
        parsed = pd.to_datetime(column, utc=True, errors="coerce", format="ISO8601")
    return parsed


def _rows(index: Iterable[int]) -> str:
    rows = [int(i) + 2 for i in index]  # +2: a header line, and rows count from 1
    shown = ", ".join(str(r) for r in rows[:_SHOW_ROWS])
    more = f" and {len(rows) - _SHOW_ROWS} more" if len(rows) > _SHOW_ROWS else ""
    label = "row" if len(rows) == 1 else "rows"
    return f"{label} {shown}{more}"


#: One fault: the field, what is wrong, and the rows it is in.
_Fault = tuple[str, str, pd.Index]


def _faulty_rows(field: str, rows: pd.Index, message: str) -> list[_Fault]:
    return [(field, f"{len(rows)} {message}", rows)] if len(rows) else []


def _timestamp_faults(frame: pd.DataFrame) -> list[_Fault]:
    ts = _parse_ts(frame["ts"])
    valid = ts.dropna()
    return _faulty_rows("ts", frame.index[ts.isna()], "unparsable timestamps") + _faulty_rows(
        "ts",
        valid.index[valid.diff() < pd.Timedelta(0)],
        "timestamps earlier than the row before (not in time order)",
    )


def _value_faults(frame: pd.DataFrame) -> list[_Fault]:
    adapters = frame["adapter"]
    faults = _faulty_rows(
        "adapter",
        frame.index[adapters.isna() | (adapters.astype(str) == "")],
        "rows without an adapter",
    )
    for column in (c for c in COUNT_COLUMNS if c in frame.columns):
        values = pd.to_numeric(frame[column], errors="coerce")
        faults += _faulty_rows(
            column,
            frame.index[values.isna() & frame[column].notna()],
            "values that are not numbers",
        )
        faults += _faulty_rows(column, frame.index[values < 0], "negative values")
    if "outcome" in frame.columns:
        outcomes = frame["outcome"]
        expected = ", ".join(sorted(OUTCOMES))
        faults += _faulty_rows(
            "outcome",
            frame.index[outcomes.notna() & ~outcomes.isin(OUTCOMES)],
            f"unknown outcomes (expected {expected})",
        )
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


def _problems(
    frame: pd.DataFrame, source: str, known_adapters: frozenset[str] | None
) -> list[Problem]:
    """Every fault of a raw log frame; unknown adapters are warnings, the rest errors."""
    columns = ", ".join(map(str, frame.columns))
    missing = [c for c in ("ts", "adapter") if c not in frame.columns]
    if missing:
        return [
            Problem(
                source=source,
                field=c,
                message=f"missing required column {c!r} (columns: {columns})",
            )
            for c in missing
        ]
    problems = [
        Problem(
            source=source,
            field=field,
            message=message,
            entry=_rows(rows),
        )
        for field, message, rows in _timestamp_faults(frame) + _value_faults(frame)
    ]
    if known_adapters is not None:
        problems += [
            Problem(source=source, field="adapter", message=message, severity="warning")
            for message in _unknown_adapters(frame, known_adapters)
        ]
    return problems


def check_request_log(path: Path, *, known_adapters: frozenset[str] | None = None) -> list[Problem]:
    """Every fault in a log file, strictly: for ``lorafleet validate``."""
    try:
        frame = _read_raw(path)
    except InputError as exc:
        return list(exc.problems)
    return _problems(frame.reset_index(drop=True), str(path), known_adapters)


def request_log_from_frame(frame: pd.DataFrame, *, source: str = "log") -> RequestLog:
    """Normalise a raw frame into a RequestLog, sorting and de-duplicating with notes."""
    frame = frame.reset_index(drop=True)
    fatal = [
        p
        for p in _problems(frame, source, None)
        if p.severity == "error" and "time order" not in p.message
    ]
    if fatal:
        raise InputError(fatal)
    notes: list[str] = []
    frame = frame.assign(ts=_parse_ts(frame["ts"]), adapter=frame["adapter"].astype(str))
    if not frame["ts"].is_monotonic_increasing:
        notes.append("rows were not in time order; sorted by ts")
        frame = frame.sort_values("ts", kind="stable").reset_index(drop=True)
    aggregated = "requests" in frame.columns
    if aggregated:
        frame["requests"] = pd.to_numeric(frame["requests"]).astype("int64")
        duplicated = frame.duplicated(["ts", "adapter"])
        if duplicated.any():
            notes.append(f"{int(duplicated.sum())} repeated (ts, adapter) buckets summed")
            frame = frame.groupby(["ts", "adapter"], as_index=False, sort=True).agg(
                requests=("requests", "sum")
            )
    else:
        duplicated = frame.duplicated()
        if duplicated.any():
            notes.append(f"{int(duplicated.sum())} duplicate rows dropped")
            frame = frame.loc[~duplicated].reset_index(drop=True)
    return RequestLog(frame=frame, aggregated=aggregated, source=source, notes=tuple(notes))


def load_request_log(path: str | Path) -> RequestLog:
    """Read a log file; InputError lists what makes it unusable."""
    source = Path(path)
    return request_log_from_frame(_read_raw(source), source=str(source))


def write_request_log(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a log compactly: Parquet with delta-encoded times and tokens, CSV or JSON lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = Path(path)
    suffix = target.suffix.lower()
    if suffix == ".csv":
        frame.to_csv(target, index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ")
        return
    if suffix in (".jsonl", ".ndjson"):
        frame.to_json(target, orient="records", lines=True, date_format="iso")
        return
    if suffix != ".parquet":
        raise InputError(
            [Problem(source=str(target), message="unknown format: use .parquet, .csv or .jsonl")]
        )
    frame = frame.assign(ts=frame["ts"].astype("datetime64[ms, UTC]"))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    integer_columns = [
        name
        for name in ("prompt_tokens", "output_tokens", "requests")
        if name in frame.columns and pd.api.types.is_integer_dtype(frame[name])
    ]
    text_columns = [name for name in frame.columns if name not in integer_columns and name != "ts"]
    pq.write_table(
        table,
        target,
        compression="zstd",
        compression_level=9,
        use_dictionary=text_columns,
        column_encoding={name: "DELTA_BINARY_PACKED" for name in ["ts", *integer_columns]},
    )
