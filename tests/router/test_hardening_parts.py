"""The hardening's parts on their own: the front door's checks, bounded labels, the
request-log files and reading them live, the logger's bounds."""

from __future__ import annotations

import json
import math
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from placement.adapters.live_request_log import LiveRequestLog
from placement.adapters.request_log_files import (
    JsonLinesRequestLog,
    LogRow,
    ParquetRequestLog,
    row_problem,
)
from placement.inputs.request_log import load_request_log
from placement.router.forward import Exchange
from placement.router.front import Receive, Refusal, parse_request, read_body, too_deep
from placement.router.metrics import UNKNOWN_ADAPTER, RouterMetrics
from placement.router.reqlog import RequestLogger

pytestmark = pytest.mark.anyio

HOUR_S = 3600.0
T0 = 1_773_288_000.0  # 2026-03-12T04:00:00Z


def _row(ts_s: float, tenant: str = "t", adapter: str = "alpha") -> LogRow:
    return LogRow(ts_s, adapter, tenant, 3, 4, "pod-0", "gpu_hit", 12.5, 200)


# --- the front door ---------------------------------------------------------------------


def _messages(*chunks: bytes) -> Receive:
    remaining = list(chunks)

    async def receive() -> MutableMapping[str, Any]:
        body = remaining.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(remaining)}

    return receive


async def test_a_body_is_read_only_up_to_the_limit() -> None:
    receive = _messages(b"a" * 60, b"b" * 60, b"never read")
    refusal = await read_body(receive, (), max_bytes=100)
    assert isinstance(refusal, Refusal) and refusal.status == 413
    assert await read_body(_messages(b"a" * 100), (), max_bytes=100) == b"a" * 100
    declared = await read_body(_messages(), [(b"content-length", b"101")], max_bytes=100)
    assert isinstance(declared, Refusal)  # refused before receiving anything


@given(
    st.recursive(st.integers(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner))
)
def test_too_deep_agrees_with_the_nesting(payload: object) -> None:
    def depth(value: object) -> int:
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        if isinstance(value, dict):
            return 1 + max((depth(v) for v in value.values()), default=0)
        return 0

    for limit in range(0, 6):
        assert too_deep(payload, max_depth=limit) == (depth(payload) > limit)


def test_names_are_adapter_names_or_a_served_base_model() -> None:
    def parse(model: object) -> str | None:
        exchange = Exchange(started_s=0.0, arrived_s=0.0, path="/v1/completions")
        exchange.body = json.dumps({"model": model}).encode()
        refusal = parse_request(exchange, (), max_depth=8, base_models={"org/Base-8B"})
        return None if refusal is None else refusal.reason

    assert [parse(m) for m in ("alpha", "a-1", "org/Base-8B", "x" * 63)] == [None] * 4
    bad = ("", "Alpha", "x" * 64, "-a", "a-", "a_b", "alpha\n", "org/base-8b", 7, None)
    assert {parse(m) for m in bad} == {"bad_model"}


def test_metrics_give_unknown_and_surplus_names_one_label() -> None:
    metrics = RouterMetrics(CollectorRegistry(), max_adapter_labels=2)
    labels = [metrics.adapter_label(name, known=True) for name in ("a", "b", "c", "a")]
    assert labels == ["a", "b", UNKNOWN_ADAPTER, "a"]
    assert metrics.adapter_label("a", known=False) == UNKNOWN_ADAPTER


# --- the Parquet layout -------------------------------------------------------------------


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_parquet_parts_per_write_compacted_when_the_hour_is_over(tmp_path: Path) -> None:
    sink = ParquetRequestLog(tmp_path)
    sink.write([_row(T0 + 1), _row(T0 + 2)])
    sink.write([_row(T0 + 3)])
    assert _names(tmp_path) == [
        "requests-20260312T04.part000001.parquet",
        "requests-20260312T04.part000002.parquet",
    ]
    sink.write([_row(T0 + HOUR_S + 1)])  # the next hour: 04 is compacted
    assert _names(tmp_path) == [
        "requests-20260312T04.parquet",
        "requests-20260312T05.part000001.parquet",
    ]
    sink.write([_row(T0 + 4)])  # a late row of 04 (a long stream) joins it
    sink.close()
    assert _names(tmp_path) == ["requests-20260312T04.parquet", "requests-20260312T05.parquet"]
    hour = load_request_log(tmp_path / "requests-20260312T04.parquet").frame
    assert len(hour) == 4 and hour["ts"].is_monotonic_increasing


def test_a_restart_removes_debris_and_parts_a_compacted_file_holds(tmp_path: Path) -> None:
    sink = ParquetRequestLog(tmp_path)
    sink.write([_row(T0 + 1)])
    sink.write([_row(T0 + 2)])
    parts = [tmp_path / name for name in _names(tmp_path)]
    kept = [p.read_bytes() for p in parts]
    sink.close()  # compacted: the parts are gone; bring them back as a kill would leave them
    for part, data in zip(parts, kept, strict=True):
        part.write_bytes(data)
    (tmp_path / ".requests-20260312T04.part000003.parquet.x1y2.tmp").write_bytes(b"PAR1 half")
    restarted = ParquetRequestLog(tmp_path)
    assert _names(tmp_path) == ["requests-20260312T04.parquet"]
    restarted.write([_row(T0 + 3)])  # numbered after the parts the compacted file holds
    assert "requests-20260312T04.part000003.parquet" in _names(tmp_path)
    restarted.close()
    assert len(load_request_log(tmp_path / "requests-20260312T04.parquet").frame) == 3


# --- JSON lines ---------------------------------------------------------------------------


def test_json_lines_rotate_past_the_size_and_a_half_line_is_cut_at_start(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path, rotate_bytes=500)
    for index in range(8):
        sink.write([_row(T0 + index, tenant=f"t{index}"), _row(T0 + index + 0.5)])
    sink.close()
    rotated = sorted(p.name for p in tmp_path.iterdir() if p.name != "router.jsonl")
    assert rotated and all(name.startswith("router.20260312T04") for name in rotated)
    with path.open("ab") as handle:
        handle.write(b'{"ts": "2026-03-12T04:')  # a kill in the middle of a line
    JsonLinesRequestLog(path).close()
    assert path.read_bytes().endswith(b"\n") or path.read_bytes() == b""
    live = LiveRequestLog(path).read()
    assert len(live.frame) == 16 and live.skipped_rows == 0


# --- reading it live --------------------------------------------------------------------


def test_only_new_bytes_and_new_files_are_read(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path, rotate_bytes=10**9)
    sink.write([_row(T0 + i, tenant=f"t{i}") for i in range(10)])
    reader = LiveRequestLog(path)
    assert len(reader.read().frame) == 10
    # Bytes already read, but the file's first KiB (its fingerprint) and the last 64
    # bytes: a reader that read them again would see junk.
    _garble(path, keep_head=1024, keep_tail=64)
    sink.write([_row(T0 + 10, tenant="t10")])
    log = reader.read()
    assert list(log.frame["tenant"]) == [f"t{i}" for i in range(11)]
    assert log.skipped_rows == 0
    sink.rotate_bytes = 1  # the next write rotates: same file (inode), a new name
    sink.write([_row(T0 + 11, tenant="t11")])
    sink.write([_row(T0 + 12, tenant="t12")])
    sink.close()
    assert list(reader.read().frame["tenant"])[-3:] == ["t10", "t11", "t12"]


def _garble(path: Path, *, keep_head: int, keep_tail: int) -> None:
    """Overwrite a file's bytes in place (same inode), all but the first ``keep_head``
    and the last ``keep_tail``."""
    data = path.read_bytes()
    with path.open("rb+") as handle:
        handle.seek(keep_head)
        handle.write(b"#" * (len(data) - keep_head - keep_tail))


def test_bad_rows_and_lines_are_skipped_and_reported_and_a_rewrite_is_read_anew(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live.jsonl"
    good = '{"ts": "2026-03-12T05:00:00Z", "adapter": "legal"}'
    path.write_text(
        "\n".join([good, '{"ts": "2026-03-12T05:00:01Z", "adapter": ""}', "{half"]) + "\n"
    )
    reader = LiveRequestLog(path)
    log = reader.read()
    assert len(log.frame) == 1 and log.skipped_rows == 2
    assert any(str(p).endswith("line 3: 1 lines that are not JSON objects") for p in log.skipped)
    path.write_text(good + "\n" + good.replace("05:00:00", "05:00:09") + "\n")  # rewritten
    log = reader.read()
    assert len(log.frame) == 2 and log.skipped_rows == 0


def test_a_parquet_directory_is_read_file_by_file_and_each_row_once(tmp_path: Path) -> None:
    sink = ParquetRequestLog(tmp_path)
    reader = LiveRequestLog(tmp_path)
    sink.write([_row(T0 + 1, tenant="a")])
    assert list(reader.read().frame["tenant"]) == ["a"]
    sink.write([_row(T0 + 2, tenant="b")])
    parts = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    sink.close()
    for name, data in parts.items():  # a kill between the compaction and the deletes
        (tmp_path / name).write_bytes(data)
    assert list(reader.read().frame["tenant"]) == ["a", "b"]
    (tmp_path / "requests-20260312T09.parquet").write_bytes(b"not parquet")
    log = reader.read()
    assert list(log.frame["tenant"]) == ["a", "b"]
    assert any("cannot read" in str(problem) for problem in log.skipped)


# --- the logger ---------------------------------------------------------------------------


class Sink:
    def __init__(self, failures: Sequence[Exception] = ()) -> None:
        self.rows: list[LogRow] = []
        self.failures = list(failures)
        self.closed = False

    def write(self, rows: Sequence[LogRow]) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.rows.extend(rows)

    def close(self) -> None:
        self.closed = True


def _dropped(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("lorafleet_router_log_rows_dropped_total", {"reason": reason})
    return value or 0.0


async def test_a_row_that_cannot_be_written_is_dropped_and_counted_not_its_batch() -> None:
    registry = CollectorRegistry()
    sink = Sink()
    logger = RequestLogger(
        sink, flush_interval_s=1.0, metrics=RouterMetrics(registry), max_pending_rows=100
    )
    bad = [
        _row(T0, adapter="\ud800"),
        _row(T0, tenant="\udfff"),
        _row(math.nan),
        LogRow(T0, "alpha", None, -1, None, None, None, None, 200),
        LogRow(T0, "alpha", None, None, None, None, None, math.inf, 200),
    ]
    for row in [_row(T0 + 1), *bad, _row(T0 + 2)]:
        logger.append(row)
    await logger.flush()
    assert sink.rows == [_row(T0 + 1), _row(T0 + 2)]
    assert _dropped(registry, "invalid") == len(bad)
    assert all(row_problem(row) for row in bad)


async def test_a_full_disk_keeps_the_rows_within_the_bound_and_close_always_closes() -> None:
    registry = CollectorRegistry()
    sink = Sink([OSError(28, "No space left on device")])
    logger = RequestLogger(
        sink, flush_interval_s=1.0, metrics=RouterMetrics(registry), max_pending_rows=3
    )
    for index in range(5):
        logger.append(_row(T0 + index))
    assert _dropped(registry, "overflow") == 2.0  # the hot path never holds more than 3
    with pytest.raises(OSError):
        await logger.flush()
    logger.append(_row(T0 + 9))  # the refused batch is kept: no room for a new row
    assert _dropped(registry, "overflow") == 3.0
    await logger.flush()
    assert [row.ts_s for row in sink.rows] == [T0, T0 + 1, T0 + 2]
    sink.failures.append(RuntimeError("broken"))
    logger.append(_row(T0 + 10))
    await logger.close()
    assert sink.closed and _dropped(registry, "write_error") == 1.0


def test_a_compacted_hour_is_what_the_forecasters_reader_reads(tmp_path: Path) -> None:
    sink = ParquetRequestLog(tmp_path)
    sink.write([_row(T0 + 1)])
    sink.close()
    [only] = list(tmp_path.iterdir())
    frame = load_request_log(only).frame
    assert list(frame.columns[:8]) == [
        "ts", "adapter", "tenant", "prompt_tokens", "output_tokens", "pod", "outcome", "ttft_ms",
    ]  # fmt: skip
    assert pq.read_schema(only).field("ts").type.tz == "UTC"
    assert frame["ts"].iloc[0] == pd.Timestamp(T0 + 1, unit="s", tz="UTC")
