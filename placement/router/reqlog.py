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

At shutdown (``Router.stop``) the log loop is cancelled, possibly in the middle of a
flush whose batch is already with the worker thread (which cannot be stopped). Such a
flush outlasts its cancellation: it waits for the thread, settles the batch as above,
then ends cancelled; and ``close`` closes the sink only once no batch is in a thread.
(Before, the cancellation let go of the batch: one not yet started in its thread was
never written, one started could find the file closed under it, in silence.) A row
appended after ``close`` cannot be written: it is counted (``reason="closed"``) and
warned about, never kept unseen.

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
        #: ``append``'s bound: ``max_pending_rows``, 0 once closed (a row then takes the
        #: refusal's branch, so the open log's ``append`` tests nothing more).
        self._room = max_pending_rows
        self._closed = False
        self._lock = asyncio.Lock()

    @property
    def description(self) -> str:
        sink = self.sink
        where = getattr(sink, "path", None) or getattr(sink, "directory", None)
        return f"request log {where}" if where is not None else "request log"

    def append(self, row: LogRow) -> None:
        if self.sink is None:
            return
        if len(self._rows) >= self._room:
            self._refuse(row)
            return
        self._rows.append(row)

    def _refuse(self, row: LogRow) -> None:
        if not self._closed:
            self.metrics.log_rows_dropped.labels(reason="overflow").inc()
            return
        self.metrics.log_rows_dropped.labels(reason="closed").inc()
        log.warning("request-log row dropped: the %s is closed: %r", self.description, row)

    async def flush(self) -> None:
        """Write the rows collected so far; see the module's docstring for failures and
        for a flush cancelled while its batch is in the worker thread."""
        if self.sink is None or not self._rows:
            return
        async with self._lock:  # batches reach the file in the order they were taken
            # Taken under the lock: a flush cancelled while it waits for it takes none.
            rows, self._rows = self._rows, []
            if not rows:
                return
            writing = asyncio.get_running_loop().run_in_executor(None, self._write, rows)
            stopped = await _outlast(writing)
            try:
                writing.result()
            except OSError:
                self._keep(rows)
                if stopped is None:
                    raise
            except Exception as exc:
                self.metrics.log_rows_dropped.labels(reason="write_error").inc(len(rows))
                if stopped is None:
                    raise
                log.error("%d rows of the %s lost: %s", len(rows), self.description, exc)
            if stopped is not None:
                raise stopped

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
        """Flush what is left and close the sink, even if the flush fails; once no batch
        is in the worker thread. Rows appended from now on are counted and dropped."""
        try:
            while self._rows:  # and any appended while the last batch was being written
                await self.flush()
        except Exception as exc:
            lost, self._rows = len(self._rows), []
            self.metrics.log_rows_dropped.labels(reason="write_error").inc(lost)
            log.error(
                "the last flush of the %s failed, %d rows lost: %s", self.description, lost, exc
            )
        finally:
            self._closed, self._room = True, 0
            if self.sink is not None:
                async with self._lock:  # after any batch still in its thread
                    await asyncio.to_thread(self.sink.close)


async def _outlast(future: asyncio.Future[None]) -> asyncio.CancelledError | None:
    """Wait until ``future`` is done, however often the waiting task is cancelled
    meanwhile (``asyncio.wait`` does not cancel what it waits for); the cancellation, if
    there was one, for the caller to raise once it has dealt with the future's end."""
    stopped: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.wait((future,))
        except asyncio.CancelledError as exc:
            stopped = exc
    return stopped


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
