"""The controller's ingest of the router's request log as the router now lays it out
(``placement.adapters.request_log_files``): a JSON-lines file that rotates, a directory
of Parquet parts that become hours. ``FileHistory`` (the controller's port) reads only
what is new at each ingest, and skips and reports bad rows instead of the whole log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from placement.adapters.kube_memory import MemoryPlanStore, MemoryStateStore
from placement.adapters.request_log_files import JsonLinesRequestLog, LogRow, ParquetRequestLog
from placement.controller.live_ports import FileHistory, PrometheusObserver
from placement.controller.ports import Actuator, ControllerPorts, Job, TickOutcome
from placement.controller.ticks import Controller
from placement.forecast.demand import DemandForecaster
from placement.forecast.event_preloads import Predictor
from placement.settings import Settings
from placement.solver.planner import Planner
from tests import factories
from tests.controller.controller_support import make_fleet
from tests.factories import FakeClock

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


def test_an_ingest_mid_rotation_keeps_the_live_log(tmp_path: Path) -> None:
    """Between the rename of a rotation and the new file's open the active file is
    not there: the ingest then took the history alone, the live rows gone for a tick."""
    live = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(live)
    history = FileHistory(_history(tmp_path), bucket_s=600, live=live)
    sink.write(_rows(0, 3))
    sink.close()
    assert len(history().frame) == 1 + 3
    live.rename(tmp_path / "router.20260312T040002.jsonl")
    assert len(history().frame) == 1 + 3


@pytest.mark.anyio
async def test_a_live_log_file_that_cannot_be_read_is_a_warning_and_a_gauge_not_a_failed_ingest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = tmp_path / "router.jsonl"
    rotated = tmp_path / "router.20260312T040002.jsonl"
    rotated.symlink_to(rotated.name)  # a link to itself: it cannot be opened (ELOOP)
    sink = JsonLinesRequestLog(live)
    sink.write(_rows(0, 3))
    sink.close()
    registry = CollectorRegistry()
    ports = ControllerPorts(
        catalog=factories.catalog(factories.adapter("legal")),
        fleet=make_fleet(),
        history=FileHistory(_history(tmp_path), bucket_s=600, live=live),
        forecaster=cast(DemandForecaster, None),  # the ingest forecasts nothing
        planner=cast(Planner, None),
        actuator=cast(Actuator, None),
        plans=MemoryPlanStore(),
        state=MemoryStateStore(),
        predictor=cast(Predictor, None),
    )
    observer = PrometheusObserver(registry, bucket_s=600)
    controller = Controller(ports, settings=Settings(), clock=FakeClock(T0), metrics=observer)
    with caplog.at_level(logging.WARNING, logger="placement.controller.ticks"):
        assert await controller.guarded(Job.INGEST, controller.ingest) is TickOutcome.DONE
    assert controller.state.history is not None and len(controller.state.history.frame) == 1 + 3
    assert registry.get_sample_value("lorafleet_controller_history_unread_files") == 1
    [warning] = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert f"1 files not read: {rotated}: cannot read (retried at the next read): " in warning
    rotated.unlink()
    assert await controller.guarded(Job.INGEST, controller.ingest) is TickOutcome.DONE
    assert registry.get_sample_value("lorafleet_controller_history_unread_files") == 0
