"""The router's request log: one row per request, batched and written off the hot path.

The columns are ARCHITECTURE.md's request-log contract, which the forecaster reads:
``ts`` (arrival, UTC), ``adapter``, ``tenant``, ``prompt_tokens``, ``output_tokens``,
``pod``, ``outcome`` (gpu_hit, cpu_hit, cold_load; empty for a request that was
refused), ``ttft_ms``, plus the optional ``status`` (the HTTP status returned).

The hot path only appends a tuple to a list. A background task swaps the list every
``flush_interval_s`` and hands the batch to a thread that writes it:

- ``ParquetRequestLog(directory)``: one file per UTC hour,
  ``requests-YYYYMMDDTHH.parquet``, each batch a row group. A file is complete (has
  its footer) once its hour has rotated or the router stopped.
- ``JsonLinesRequestLog(path)``: appended and flushed per batch, readable at any time.
- ``MemoryRequestLog``: keeps rows in memory, for tests and the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Protocol

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True, slots=True)
class LogRow:
    ts_s: float
    adapter: str
    tenant: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    pod: str | None
    outcome: str | None
    ttft_ms: float | None
    status: int


SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("us", tz="UTC")),
        ("adapter", pa.string()),
        ("tenant", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("pod", pa.string()),
        ("outcome", pa.string()),
        ("ttft_ms", pa.float64()),
        ("status", pa.int32()),
    ]
)


class RequestLogSink(Protocol):
    """Where batches of rows go. ``write`` runs in a worker thread, never on the loop."""

    def write(self, rows: Sequence[LogRow]) -> None: ...

    def close(self) -> None: ...


class MemoryRequestLog:
    def __init__(self) -> None:
        self.rows: list[LogRow] = []
        self._lock = threading.Lock()

    def write(self, rows: Sequence[LogRow]) -> None:
        with self._lock:
            self.rows.extend(rows)

    def close(self) -> None:
        return None


def _iso(ts_s: float) -> str:
    return datetime.fromtimestamp(ts_s, tz=UTC).isoformat().replace("+00:00", "Z")


class JsonLinesRequestLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a", encoding="utf-8")

    def write(self, rows: Sequence[LogRow]) -> None:
        lines = []
        for row in rows:
            record = {
                "ts": _iso(row.ts_s),
                "adapter": row.adapter,
                "tenant": row.tenant,
                "prompt_tokens": row.prompt_tokens,
                "output_tokens": row.output_tokens,
                "pod": row.pod,
                "outcome": row.outcome,
                "ttft_ms": None if row.ttft_ms is None else round(row.ttft_ms, 3),
                "status": row.status,
            }
            lines.append(json.dumps(record, separators=(",", ":")))
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ParquetRequestLog:
    """Hourly Parquet files in ``directory``; each written batch is one row group."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._hour: str | None = None
        self._writer: pq.ParquetWriter | None = None

    def path_for(self, hour: str) -> Path:
        path = self.directory / f"requests-{hour}.parquet"
        index = 1
        while self._hour != hour and path.exists():
            # A file closed by an earlier run stays intact; this run writes beside it.
            path = self.directory / f"requests-{hour}.{index}.parquet"
            index += 1
        return path

    def write(self, rows: Sequence[LogRow]) -> None:
        by_hour: dict[str, list[LogRow]] = {}
        for row in rows:
            hour = datetime.fromtimestamp(row.ts_s, tz=UTC).strftime("%Y%m%dT%H")
            by_hour.setdefault(hour, []).append(row)
        for hour, batch in sorted(by_hour.items()):
            self._writer_for(hour).write_table(_table(batch))

    def _writer_for(self, hour: str) -> pq.ParquetWriter:
        if self._writer is None or self._hour != hour:
            self.close()
            self._writer = pq.ParquetWriter(str(self.path_for(hour)), SCHEMA)
            self._hour = hour
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _table(rows: Sequence[LogRow]) -> pa.Table:
    ordered = sorted(rows, key=lambda row: row.ts_s)
    return pa.table(
        {
            "ts": pa.array([int(r.ts_s * 1_000_000) for r in ordered], pa.timestamp("us", "UTC")),
            "adapter": [r.adapter for r in ordered],
            "tenant": [r.tenant for r in ordered],
            "prompt_tokens": pa.array([r.prompt_tokens for r in ordered], pa.int64()),
            "output_tokens": pa.array([r.output_tokens for r in ordered], pa.int64()),
            "pod": [r.pod for r in ordered],
            "outcome": [r.outcome for r in ordered],
            "ttft_ms": pa.array([r.ttft_ms for r in ordered], pa.float64()),
            "status": pa.array([r.status for r in ordered], pa.int32()),
        },
        schema=SCHEMA,
    )


def open_request_log(target: str | Path) -> RequestLogSink:
    """A ``.jsonl`` path appends JSON lines; anything else is a directory of Parquet files."""
    path = Path(target)
    if path.suffix in (".jsonl", ".ndjson"):
        return JsonLinesRequestLog(path)
    return ParquetRequestLog(path)


class RequestLogger:
    """Collects rows on the event loop and flushes them in batches from a worker thread."""

    def __init__(self, sink: RequestLogSink | None, *, flush_interval_s: float) -> None:
        self.sink = sink
        self.flush_interval_s = flush_interval_s
        self._rows: list[LogRow] = []
        self._lock = asyncio.Lock()

    def append(self, row: LogRow) -> None:
        if self.sink is not None:
            self._rows.append(row)

    async def flush(self) -> None:
        if self.sink is None or not self._rows:
            return
        rows, self._rows = self._rows, []
        async with self._lock:  # batches reach the file in the order they were taken
            await asyncio.to_thread(self.sink.write, rows)

    async def run(self) -> None:
        """Flush forever; the caller cancels it and then calls ``close``."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            with contextlib.suppress(OSError):
                await self.flush()

    async def close(self) -> None:
        await self.flush()
        if self.sink is not None:
            await asyncio.to_thread(self.sink.close)
