"""The controller's ingest of the router's request log as the router now lays it out
(``placement.adapters.request_log_files``): a JSON-lines file that rotates, a directory
of Parquet parts that become hours. ``FileHistory`` (the controller's port) reads only
what is new at each ingest, and skips and reports bad rows instead of the whole log.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from placement.adapters.request_log_files import JsonLinesRequestLog, LogRow, ParquetRequestLog
from placement.controller.live_ports import FileHistory

T0 = 1_773_288_000.0  # 2026-03-12T04:00:00Z, after the history below


def _history(tmp_path: Path) -> Path:
    path = tmp_path / "requests.parquet"
    frame = pd.DataFrame(
        {"ts": pd.to_datetime(["2026-03-12T03:00:00Z"], utc=True), "adapter": ["legal"]}
    )
    frame.to_parquet(path)
    return path


def _rows(first: int, count: int) -> list[LogRow]:
    return [
        LogRow(T0 + i, "legal", f"t{i}", 3, 4, "pod-0", "gpu_hit", 1.0, 200)
        for i in range(first, first + count)
    ]


def test_a_rotating_json_lines_log_is_read_whole_once_and_bad_lines_are_skipped(
    tmp_path: Path,
) -> None:
    live = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(live, rotate_bytes=600)
    history = FileHistory(_history(tmp_path), bucket_s=600, live=live)
    sink.write(_rows(0, 4))
    assert len(history().frame) == 1 + 4
    for first in range(4, 20, 4):  # rotates on the way
        sink.write(_rows(first, 4))
    with live.open("ab") as handle:
        handle.write(b'{"ts": "2026-03-12T04:10:00Z", "adapter": ""}\n{"half')
    log = history()
    assert len(list(tmp_path.glob("router.2026*.jsonl"))) >= 2
    live_ts = log.frame["ts"].iloc[1:]  # after the history's one row
    assert list(live_ts) == [pd.Timestamp(T0 + i, unit="s", tz="UTC") for i in range(20)]
    assert log.skipped_rows == 1  # the empty name; the half line waits for its end
    sink.close()  # a restart would cut the half line; the next ingest adds nothing twice
    JsonLinesRequestLog(live).close()
    again = history()
    assert len(again.frame) == 1 + 20 and again.skipped_rows == 1


def test_a_parquet_directory_is_read_as_its_parts_become_hours(tmp_path: Path) -> None:
    directory = tmp_path / "requests"
    sink = ParquetRequestLog(directory)
    history = FileHistory(_history(tmp_path), bucket_s=600, live=directory)
    sink.write(_rows(0, 3))
    sink.write(_rows(3, 3))
    assert len(history().frame) == 1 + 6
    sink.write([LogRow(T0 + 3600.0, "legal", "next-hour", None, None, None, None, None, 200)])
    sink.close()  # the parts of both hours are now two compacted files
    assert sorted(p.name for p in directory.iterdir()) == [
        "requests-20260312T04.parquet",
        "requests-20260312T05.parquet",
    ]
    log = history()
    assert len(log.frame) == 1 + 7 and log.frame["ts"].is_monotonic_increasing
