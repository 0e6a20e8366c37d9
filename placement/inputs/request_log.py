"""Read request logs (Parquet, CSV, JSON lines), per request or pre-aggregated.

The contract (ARCHITECTURE.md): ``ts`` (UTC) and ``adapter``, and optionally
``tenant``, ``prompt_tokens``, ``output_tokens``, ``pod``, ``outcome``, ``ttft_ms``;
or, pre-aggregated, ``ts`` (bucket start), ``adapter`` and ``requests``.

``load_request_log`` is lenient where a forecast can still be made (it sorts
out-of-order rows and drops exact duplicates, and says so in ``notes``);
``check_request_log`` is strict and lists every fault for ``lorafleet validate``.
What a fault is, and the contract's names, are in ``placement.inputs.request_log_faults``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from placement.errors import InputError, Problem
from placement.inputs.csv_lines import CsvLines
from placement.inputs.files import write_through
from placement.inputs.json_lines import (
    is_json_lines,
    not_objects,
    read_json_lines,
    read_json_lines_strictly,
)
from placement.inputs.request_log_faults import fatal_faults, log_problems, parse_ts


@dataclass(frozen=True)
class RequestLog:
    """A request log as a frame sorted by ``ts`` (tz-aware UTC)."""

    frame: pd.DataFrame
    aggregated: bool
    source: str = "log"
    notes: tuple[str, ...] = field(default=())
    #: Rows left out when read with ``skip_bad_rows``, each fault with its rows.
    skipped: tuple[Problem, ...] = field(default=())
    skipped_rows: int = 0
    #: Files of a live log this read could not read (each also in ``skipped``, with
    #: why); their rows read before stand, and they are tried again at the next read.
    unread_files: tuple[str, ...] = field(default=())

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


def _is_csv(path: Path) -> bool:
    return "".join(path.suffixes[-2:]).lower().endswith((".csv", ".csv.gz"))


def _read_raw(path: Path) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]).lower()
    try:
        if suffix.endswith(".parquet"):
            frame = pd.read_parquet(path)
            if path.is_dir() and not len(frame.columns):
                raise InputError(
                    [Problem(source=str(path), message="a directory with no Parquet files")]
                )
            return frame
        if _is_csv(path):
            return pd.read_csv(path)
    except FileNotFoundError:
        raise InputError([Problem(source=str(path), message="no such file")]) from None
    except InputError:
        raise
    except Exception as exc:  # every reader raises its own types
        raise InputError([Problem(source=str(path), message=f"cannot read: {exc}")]) from None
    raise InputError(
        [Problem(source=str(path), message="unknown format: use .parquet, .csv or .jsonl")]
    )


def check_request_log(path: Path, *, known_adapters: frozenset[str] | None = None) -> list[Problem]:
    """Every fault in a log file, strictly: for ``lorafleet validate``."""
    try:
        frame, lines = _read_strictly(path)
    except InputError as exc:
        return list(exc.problems)
    if frame.empty:  # a header and no rows: "ok" here, then no forecast from it
        return [empty_log_problem(path)]
    return log_problems(frame.reset_index(drop=True), str(path), known_adapters, lines=lines)


def empty_log_problem(path: Path) -> Problem:
    """The problem of a log file with no rows (a Parquet schema or a CSV header alone)."""
    return Problem(source=str(path), message="no requests: the log has no rows")


def _read_strictly(path: Path) -> tuple[pd.DataFrame, Sequence[int] | None]:
    """A log file's raw frame and, for JSON lines and CSV, each row's line (the
    problems name lines: a JSON-lines file has no header, and a CSV's blank lines and
    fields across lines are no rows); a line that is not a JSON object is an
    InputError naming it."""
    if not is_json_lines(path):
        frame = _read_raw(path)
        return frame, CsvLines(path, rows=len(frame)) if _is_csv(path) else None
    read = read_json_lines_strictly(path)
    return _frame(read.records), read.lines


def request_log_from_frame(
    frame: pd.DataFrame,
    *,
    source: str = "log",
    skip_bad_rows: bool = False,
    lines: Sequence[int] | None = None,
    file_rows: Sequence[int] | None = None,
) -> RequestLog:
    """Normalise a raw frame into a RequestLog, sorting and de-duplicating with notes.

    A faulty row (no adapter, a name no engine takes, a count that is not a whole
    number) makes the log unusable, unless ``skip_bad_rows``: then those rows are left
    out and listed in ``skipped`` (a live log the router is still writing). ``lines``:
    each row's line in its file, which the problems then name instead of a row; without
    them a row is named by its place in ``frame`` from 1 ("row 2" for the second), or,
    where ``file_rows`` gives each row's place in its file from 0 (a window of a Parquet
    file), by its row in the file from 1."""
    frame = frame.reset_index(drop=True)
    fatal = [
        (p, rows)
        for p, rows in fatal_faults(frame, source, lines=lines, file_rows=file_rows)
        if p.severity == "error" and "time order" not in p.message
    ]
    skipped: tuple[Problem, ...] = ()
    skipped_rows = 0
    if fatal and not skip_bad_rows:
        raise InputError([p for p, _ in fatal])
    if fatal:
        if any(rows is None for _, rows in fatal):  # a missing column: nothing to keep
            raise InputError([p for p, _ in fatal])
        bad = frame.index.isin(
            np.concatenate([rows.to_numpy() for _, rows in fatal if rows is not None])
        )
        skipped, skipped_rows = tuple(p for p, _ in fatal), int(bad.sum())
        frame = frame.loc[~bad].reset_index(drop=True)
    notes: list[str] = []
    if skipped_rows:
        notes.append(f"{skipped_rows} faulty rows skipped")
    frame = frame.assign(ts=parse_ts(frame["ts"]), adapter=frame["adapter"].astype(str))
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
    return RequestLog(
        frame=frame,
        aggregated=aggregated,
        source=source,
        notes=tuple(notes),
        skipped=skipped,
        skipped_rows=skipped_rows,
    )


def load_request_log(path: str | Path, *, skip_bad_rows: bool = False) -> RequestLog:
    """Read a log file; InputError lists what makes it unusable. With ``skip_bad_rows``
    faulty rows, and JSON lines that do not parse (one the router is half-way through
    writing), are left out and reported in ``skipped`` instead."""
    source = Path(path)
    if skip_bad_rows and is_json_lines(source):
        read = read_json_lines(source)
        log = request_log_from_frame(
            _frame(read.records), source=str(source), skip_bad_rows=True, lines=read.lines
        )
        bad_lines = read.bad_lines
        if not bad_lines:
            return log
        problem = not_objects(source, bad_lines)
        return replace(
            log,
            skipped=(problem, *log.skipped),
            skipped_rows=log.skipped_rows + len(bad_lines),
            notes=(*log.notes, f"{len(bad_lines)} unreadable lines skipped"),
        )
    raw, rows_lines = _read_strictly(source)
    return request_log_from_frame(
        raw, source=str(source), skip_bad_rows=skip_bad_rows, lines=rows_lines
    )


def _frame(records: list[dict[str, object]]) -> pd.DataFrame:
    """A JSON-lines log's raw frame (an empty one still has the required columns)."""
    return (
        pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=["ts", "adapter"])
    )


def write_request_log(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a log compactly: Parquet with delta-encoded times and tokens, CSV or JSON
    lines; atomically (``placement.inputs.files.write_through``), so a reader never
    meets half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = Path(path)
    suffix = target.suffix.lower()
    if suffix == ".csv":
        write_through(
            target,
            lambda out: frame.to_csv(out, index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ"),
        )
        return
    if suffix in (".jsonl", ".ndjson"):
        write_through(
            target,
            lambda out: frame.to_json(out, orient="records", lines=True, date_format="iso"),
        )
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
    write_through(
        target,
        lambda out: pq.write_table(
            table,
            out,
            compression="zstd",
            compression_level=9,
            use_dictionary=text_columns,
            column_encoding={name: "DELTA_BINARY_PACKED" for name in ["ts", *integer_columns]},
        ),
    )
