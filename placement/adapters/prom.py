"""Prometheus as a request-history source: per-adapter request counts per time bucket.

Owns the HTTP conversation with Prometheus' ``/api/v1/query_range`` and its
translation into the pre-aggregated request-log frame of ARCHITECTURE.md (``ts``
bucket start, ``adapter``, ``requests``), so that the controller can forecast from
the router's ``lorafleet_requests_total`` counters instead of log files.

Counts are exact differences of the raw counters sampled at bucket boundaries, per
series (router replica x adapter x outcome), with counter resets handled, then summed
per adapter. ``increase()`` is not used: it extrapolates to the window's edges and
gives fractional, slightly inflated counts. A series absent at the range's first step
was created inside the range, so its first value counts from zero.

Errors: Prometheus down, timing out or answering 5xx raise
``RetryableHistorySourceError``; an answer that is not JSON (nested too deeply
included), a ``status: error`` or a body missing its fields raise
``HistorySourceError`` naming the URL and the problem. A sample that is not a finite
number (NaN, ±Inf) is left out, as Prometheus itself leaves out a stale one, and so
is a series whose ``adapter`` label is not a name an engine takes: one bad series
never costs the whole history.
Must not decide anything; the caller chooses the range and the bucket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pandas as pd

from placement.errors import HistorySourceError, RetryableHistorySourceError
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.inputs.request_log_faults import ADAPTER_NAME

REQUESTS_METRIC = "lorafleet_requests_total"
#: Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS = 10_000


@dataclass(frozen=True, kw_only=True)
class Series:
    """One counter series as Prometheus returned it: its labels and (unix s, value)s."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


class PromHistorySource:
    """Reads per-adapter request counts from a Prometheus server with httpx.

    ``selector`` narrows the counter (``'namespace="ml"'``); ``client`` is injected in
    tests (``httpx.MockTransport``) and owned by the caller when given.
    """

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
        metric: str = REQUESTS_METRIC,
        selector: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client or httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self.metric = metric
        self.selector = selector

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> PromHistorySource:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request_counts(self, *, start: datetime, end: datetime, bucket_s: int) -> pd.DataFrame:
        """Requests per adapter per bucket in [start, end): ``ts``, ``adapter``, ``requests``.

        ``start`` is floored to a bucket boundary; buckets without requests are absent.
        """
        if bucket_s <= 0:
            raise ValueError("bucket_s must be positive")
        first_s = math.floor(start.timestamp() / bucket_s) * bucket_s
        end_s = end.timestamp()
        series: list[Series] = []
        for chunk_start, chunk_end in _chunks(first_s, end_s, bucket_s):
            series.extend(self.query_range(self._query(), chunk_start, chunk_end, bucket_s))
        return counts_frame(merge_series(series), first_s=first_s, bucket_s=bucket_s)

    def request_log(self, *, start: datetime, end: datetime, bucket_s: int) -> RequestLog:
        """The counts as a pre-aggregated ``RequestLog``, as ``load_request_log`` gives."""
        frame = self.request_counts(start=start, end=end, bucket_s=bucket_s)
        return request_log_from_frame(frame, source=f"prometheus {self.base_url}")

    def query_range(self, query: str, start_s: float, end_s: float, step_s: int) -> list[Series]:
        """One ``/api/v1/query_range`` call, parsed; raises on anything unusable."""
        url = f"{self.base_url}/api/v1/query_range"
        params: dict[str, str | int] = {
            "query": query,
            "start": f"{start_s:.3f}",
            "end": f"{end_s:.3f}",
            "step": step_s,
        }
        try:
            answer = self._client.get(url, params=params)
        except httpx.TransportError as exc:
            raise RetryableHistorySourceError(
                f"Prometheus at {self.base_url} did not answer: {exc.__class__.__name__}: {exc}"
            ) from exc
        return parse_matrix(answer, url=url)

    def _query(self) -> str:
        # The raw counter, not increase(): differences are taken here, per series.
        return f"{self.metric}{{{self.selector}}}" if self.selector else self.metric


def _chunks(first_s: float, end_s: float, bucket_s: int) -> list[tuple[float, float]]:
    """The bucket boundaries from first_s to the last one at or before end_s, cut into
    query ranges of at most MAX_POINTS steps that share their boundary points (so that
    no bucket's difference falls between two chunks). Empty under one whole bucket."""
    last_s = first_s + math.floor((end_s - first_s) / bucket_s) * bucket_s
    chunks = []
    moment = first_s
    while moment < last_s:
        stop = min(moment + MAX_POINTS * bucket_s, last_s)
        chunks.append((moment, stop))
        moment = stop
    return chunks


def _fail(url: str, message: str) -> HistorySourceError:
    return HistorySourceError(f"Prometheus {url}: {message}")


def parse_matrix(answer: httpx.Response, *, url: str) -> list[Series]:
    """The ``data.result`` of a range query as ``Series``; errors name what is wrong."""
    if answer.status_code >= 500:
        raise RetryableHistorySourceError(
            f"Prometheus {url}: HTTP {answer.status_code}: {answer.text[:200]}"
        )
    try:
        body = answer.json()
    except (ValueError, RecursionError):
        raise _fail(
            url, f"answer is not JSON (HTTP {answer.status_code}): {answer.text[:200]!r}"
        ) from None
    if not isinstance(body, dict):
        raise _fail(url, f"answer is not a JSON object: {type(body).__name__}")
    if body.get("status") != "success":
        kind = body.get("errorType", "unknown")
        raise _fail(url, f"query failed ({kind}, HTTP {answer.status_code}): {body.get('error')}")
    data = body.get("data")
    if not isinstance(data, dict) or "result" not in data:
        raise _fail(url, "answer has no data.result")
    if data.get("resultType") != "matrix":
        raise _fail(url, f"expected a matrix result, got {data.get('resultType')!r}")
    if not isinstance(data["result"], list):
        raise _fail(url, "data.result is not a list")
    return [_series(raw, url, index) for index, raw in enumerate(data["result"])]


def _series(raw: Any, url: str, index: int) -> Series:
    where = f"data.result[{index}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("metric"), dict):
        raise _fail(url, f"{where} has no metric labels")
    values = raw.get("values")
    if not isinstance(values, list):
        raise _fail(url, f"{where} has no values")
    points = []
    for i, pair in enumerate(values):
        try:
            moment, text = pair
            point = (float(moment), float(text))
        except (TypeError, ValueError):
            raise _fail(url, f"{where}.values[{i}] is not [time, value]: {pair!r:.80}") from None
        if math.isfinite(point[0]) and math.isfinite(point[1]):
            points.append(point)
    labels = {str(key): str(value) for key, value in raw["metric"].items()}
    return Series(labels=labels, points=tuple(points))


def merge_series(series: Sequence[Series]) -> list[Series]:
    """Join the pieces of each series that chunked queries returned (a boundary step
    appears in both chunks) so that no later piece looks like a new series."""
    joined: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    for one in series:
        joined.setdefault(tuple(sorted(one.labels.items())), {}).update(one.points)
    return [
        Series(labels=dict(key), points=tuple(sorted(points.items())))
        for key, points in joined.items()
    ]


def counts_frame(series: Sequence[Series], *, first_s: float, bucket_s: int) -> pd.DataFrame:
    """Sum the per-series increases by adapter and bucket into the counts frame."""
    totals: dict[tuple[float, str], float] = {}
    for one in series:
        adapter = one.labels.get("adapter")
        if not adapter or ADAPTER_NAME.match(adapter) is None:
            continue
        for moment, grown in _bucket_increases(one, first_s, bucket_s).items():
            totals[(moment, adapter)] = totals.get((moment, adapter), 0.0) + grown
    rows = [(moment, adapter, round(n)) for (moment, adapter), n in sorted(totals.items())]
    rows = [row for row in rows if row[2] > 0]
    return pd.DataFrame(
        {
            "ts": pd.to_datetime([r[0] for r in rows], unit="s", utc=True).astype(
                "datetime64[ns, UTC]"
            ),
            "adapter": pd.Series([r[1] for r in rows], dtype=object),
            "requests": pd.Series([r[2] for r in rows], dtype="int64"),
        }
    )


def _bucket_increases(one: Series, first_s: float, bucket_s: int) -> dict[float, float]:
    """Increases keyed by bucket start; a series' first point, when it appears late,
    belongs to the bucket that ends at that point."""
    result: dict[float, float] = {}
    previous: tuple[float, float] | None = None
    for moment, value in one.points:
        if previous is None:
            if moment > first_s:
                result[moment - bucket_s] = value
        else:
            grown = value - previous[1]
            result[previous[0]] = result.get(previous[0], 0.0) + (grown if grown >= 0 else value)
        previous = (moment, value)
    return result
