"""The request logs of ``lorafleet router --workers N`` read back as one: worker 0's
path and every further worker's log beside it (``worker_log_path``), found again at
each read (``WorkersRequestLog``), as the controller's ingest and ``forecast --log``
read them. Before, the controller read worker 0's log alone: with two workers it saw
about half the traffic."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement.adapters.live_request_log import WorkersRequestLog
from placement.adapters.request_log_files import (
    JsonLinesRequestLog,
    LogRow,
    ParquetRequestLog,
    worker_log_path,
    worker_logs,
)
from placement.controller.live_ports import FileHistory
from placement.controller.recent_use import RouterLogUse
from placement.errors import InputError

T0 = 1_773_288_000.0  # 2026-03-12T04:00:00Z


def _row(ts_s: float, tenant: str) -> LogRow:
    return LogRow(ts_s, "alpha", tenant, 3, 4, "pod-0", "gpu_hit", 12.5, 200)


def _write(path: Path, rows: list[LogRow]) -> None:
    sink = JsonLinesRequestLog(path) if path.suffix == ".jsonl" else ParquetRequestLog(path)
    sink.write(rows)
    sink.close()


@pytest.mark.parametrize("name", ["requests.jsonl", "requests"])
def test_every_worker_s_log_is_read_with_worker_0_s(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    log = WorkersRequestLog(path)
    _write(path, [_row(T0, "w0-a"), _row(T0 + 3, "w0-b")])
    _write(worker_log_path(path, 1), [_row(T0 + 1, "w1-a")])
    assert list(log.read().frame["tenant"]) == ["w0-a", "w1-a", "w0-b"]
    _write(worker_log_path(path, 2), [_row(T0 + 2, "w2-a")])  # a worker that came later
    _write(worker_log_path(path, 1), [_row(T0 + 4, "w1-b")])
    assert list(log.read().frame["tenant"]) == ["w0-a", "w1-a", "w2-a", "w0-b", "w1-b"]


def test_only_the_workers_names_are_worker_logs(tmp_path: Path) -> None:
    active = tmp_path / "requests.jsonl"
    for name in ("requests.w1.jsonl", "requests.w10.jsonl", "requests.w2.jsonl",
                 "requests.20260312T040000.jsonl",  # worker 0's rotation
                 "requests.w1.20260312T040000.jsonl",  # worker 1's: its own reader's
                 "other.w1.jsonl", "requests.w0.jsonl"):  # fmt: skip
        (tmp_path / name).write_text("")
    assert [p.name for p in worker_logs(active)] == [
        "requests.w1.jsonl",
        "requests.w2.jsonl",
        "requests.w10.jsonl",
    ]
    directory = tmp_path / "dir"
    for name in ("w1", "w3", "wx", "w0"):
        (directory / name).mkdir(parents=True)
    (directory / "w2").write_text("")  # a file, not a worker's directory
    assert [p.name for p in worker_logs(directory)] == ["w1", "w3"]
    assert worker_logs(tmp_path / "requests.parquet") == []


def test_counts_beside_worker_logs_are_refused_naming_the_log(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha", "requests": 3}\n')
    _write(worker_log_path(path, 1), [_row(T0, "w1-a")])
    with pytest.raises(InputError, match="pre-aggregated counts beside worker logs"):
        WorkersRequestLog(path).read()


def test_the_controller_s_history_counts_every_worker_s_requests(tmp_path: Path) -> None:
    history_path = tmp_path / "history.jsonl"
    _write(history_path, [_row(T0 - 3600, "old")])
    live = tmp_path / "router.jsonl"
    _write(live, [_row(T0, "w0")])
    _write(worker_log_path(live, 1), [_row(T0 + 1, "w1")])
    history = FileHistory(history_path, bucket_s=600, live=live)
    assert sorted(history().frame["tenant"]) == ["old", "w0", "w1"]


def test_an_event_s_recent_use_counts_every_worker_s_requests(tmp_path: Path) -> None:
    live = tmp_path / "router.jsonl"
    _write(live, [_row(T0, "w0")])
    _write(worker_log_path(live, 1), [_row(T0 + 5, "w1")])  # the pod's latest use
    uses = RouterLogUse(live, refresh_s=0.0)()
    assert uses == {"pod-0": {"alpha": T0 + 5}}
