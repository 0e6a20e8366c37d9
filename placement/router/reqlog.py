"""The router's request log: one row per request, batched and written off the hot path.

The columns are ARCHITECTURE.md's request-log contract, which the forecaster reads:
``ts`` (arrival, UTC), ``adapter``, ``tenant``, ``prompt_tokens``, ``output_tokens``,
``pod``, ``outcome`` (gpu_hit, cpu_hit, cold_load; empty for a request that was
refused), ``ttft_ms``, plus the optional ``status`` (the HTTP status returned).

The hot path only appends a row to a list (at most ``max_pending_rows``: beyond, new
rows are dropped and counted, so a stuck disk cannot grow the router's memory), and
without a sink nothing is kept. A row is a ``LogRow``, a named tuple, cheap enough for
the proxy to build one per request. The log loop calls ``flush`` every
``flush_interval_s``; it hands the batch to a thread that drops the rows that cannot
be written (``row_problem``: counted, never a reason to lose the batch) and writes the
rest. A batch the file refused with an ``OSError`` (a
full disk) is kept for the next flush; any other error drops the batch (counted) and
is raised to the loop's supervisor. ``close`` flushes what is left and always closes
the sink, whatever the flush raised.

The sinks, and the layout of their files, are in ``placement.adapters.request_log_files``:

- ``ParquetRequestLog(directory)``: a part file per batch, compacted into one file
  per UTC hour, ``requests-YYYYMMDDTHH.parquet``; every file readable at any moment.
- ``JsonLinesRequestLog(path)``: appended per batch, rotated past a size.
- ``MemoryRequestLog``: keeps rows in memory, for tests and the demo.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from placement.adapters.request_log_files import (
    SCHEMA,
    JsonLinesRequestLog,
    LogRow,
    ParquetRequestLog,
    open_request_log,
    row_problem,
)
from placement.router.metrics import RouterMetrics

log = logging.getLogger("lorafleet.router")


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


class RequestLogger:
    """Collects rows on the event loop and flushes them in batches from a worker thread."""

    def __init__(
        self,
        sink: RequestLogSink | None,
        *,
        flush_interval_s: float,
        metrics: RouterMetrics,
        max_pending_rows: int,
    ) -> None:
        self.sink = sink
        self.flush_interval_s = flush_interval_s
        self.max_pending_rows = max_pending_rows
        self.metrics = metrics
        self._rows: list[LogRow] = []
        self._lock = asyncio.Lock()

    @property
    def description(self) -> str:
        sink = self.sink
        where = getattr(sink, "path", None) or getattr(sink, "directory", None)
        return f"request log {where}" if where is not None else "request log"

    def append(self, row: LogRow) -> None:
        if self.sink is None:
            return
        if len(self._rows) >= self.max_pending_rows:
            self.metrics.log_rows_dropped.labels(reason="overflow").inc()
            return
        self._rows.append(row)

    async def flush(self) -> None:
        """Write the rows collected so far; see the module's docstring for failures."""
        if self.sink is None or not self._rows:
            return
        rows, self._rows = self._rows, []
        async with self._lock:  # batches reach the file in the order they were taken
            try:
                await asyncio.to_thread(self._write, rows)
            except OSError:
                self._keep(rows)
                raise
            except Exception:
                self.metrics.log_rows_dropped.labels(reason="write_error").inc(len(rows))
                raise

    def _write(self, rows: list[LogRow]) -> None:
        assert self.sink is not None
        good = []
        for row in rows:
            problem = row_problem(row)
            if problem is None:
                good.append(row)
            else:
                self.metrics.log_rows_dropped.labels(reason="invalid").inc()
                log.warning("request-log row dropped (%s): %r", problem, row)
        if good:
            self.sink.write(good)

    def _keep(self, rows: list[LogRow]) -> None:
        """Put a refused batch back before the rows collected since; past the bound the
        newest go, as ``append`` drops them."""
        pending = rows + self._rows
        over = len(pending) - self.max_pending_rows
        if over > 0:
            self.metrics.log_rows_dropped.labels(reason="overflow").inc(over)
            pending = pending[: self.max_pending_rows]
        self._rows = pending

    async def close(self) -> None:
        """Flush what is left and close the sink, even if the flush fails."""
        try:
            await self.flush()
        except Exception as exc:
            lost, self._rows = len(self._rows), []
            self.metrics.log_rows_dropped.labels(reason="write_error").inc(lost)
            log.error(
                "the last flush of the %s failed, %d rows lost: %s", self.description, lost, exc
            )
        finally:
            if self.sink is not None:
                await asyncio.to_thread(self.sink.close)


__all__ = [
    "SCHEMA",
    "JsonLinesRequestLog",
    "LogRow",
    "MemoryRequestLog",
    "ParquetRequestLog",
    "RequestLogSink",
    "RequestLogger",
    "open_request_log",
]
