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


def _problems(
    frame: pd.DataFrame, source: str, known_adapters: frozenset[str] | None
) -> list[Problem]:
    problems: list[Problem] = []

    def add(
        message: str, *, field_: str | None = None, entry: str | None = None, warn: bool = False
    ) -> None:
        problems.append(
            Problem(
                source=source,
                entry=entry,
                field=field_,
                message=message,
                severity="warning" if warn else "error",
            )
        )

    for column in ("ts", "adapter"):
        if column not in frame.columns:
            columns = ", ".join(map(str, frame.columns))
            add(
                f"missing required column {column!r} (columns: {columns})",
                field_=column,
            )
    if problems:
        return problems
    ts = _parse_ts(frame["ts"])
    bad_ts = frame.index[ts.isna()]
    if len(bad_ts):
        add(f"{len(bad_ts)} unparsable timestamps", field_="ts", entry=_rows(bad_ts))
    valid = ts.dropna()
    backwards = valid.index[valid.diff() < pd.Timedelta(0)]
    if len(backwards):
        add(
            f"{len(backwards)} timestamps earlier than the row before (not in time order)",
            field_="ts",
            entry=_rows(backwards),
        )
    missing_adapter = frame.index[frame["adapter"].isna() | (frame["adapter"].astype(str) == "")]
    if len(missing_adapter):
        add(
            f"{len(missing_adapter)} rows without an adapter",
            field_="adapter",
            entry=_rows(missing_adapter),
        )
    for column in COUNT_COLUMNS:
        if column in frame.columns:
            values = pd.to_numeric(frame[column], errors="coerce")
            bad = frame.index[values.isna() & frame[column].notna()]
            negative = frame.index[values < 0]
            if len(bad):
                add(
                    f"{len(bad)} values that are not numbers",
                    field_=column,
                    entry=_rows(bad),
                )
            if len(negative):
                add(
                    f"{len(negative)} negative values",
                    field_=column,
                    entry=_rows(negative),
                )
    if "outcome" in frame.columns:
        bad_outcome = frame.index[frame["outcome"].notna() & ~frame["outcome"].isin(OUTCOMES)]
        if len(bad_outcome):
            add(
                f"{len(bad_outcome)} unknown outcomes (expected {', '.join(sorted(OUTCOMES))})",
                field_="outcome",
                entry=_rows(bad_outcome),
            )
    if known_adapters is not None:
        adapters = frame["adapter"].astype(str)
        unknown = adapters[~adapters.isin(known_adapters)].value_counts()
        for name, count in unknown.head(20).items():
            add(
                f"adapter {name!r} is not in the catalog ({count} requests)",
                field_="adapter",
                warn=True,
            )
        if len(unknown) > 20:
            add(
                f"{len(unknown) - 20} more adapters are not in the catalog",
                field_="adapter",
                warn=True,
            )
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
