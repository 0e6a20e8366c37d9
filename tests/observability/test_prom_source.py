"""The Prometheus history source at the wire: httpx.MockTransport answers query_range."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pandas as pd
import pytest

from placement.adapters.prom import PromHistorySource
from placement.errors import HistorySourceError, RetryableHistorySourceError

T0 = datetime(2026, 3, 12, 10, 0, tzinfo=UTC)
T0_S = T0.timestamp()
BUCKET_S = 600


def matrix(*series: tuple[dict[str, str], list[tuple[float, float]]]) -> dict[str, object]:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": labels, "values": [[t, str(v)] for t, v in points]}
                for labels, points in series
            ],
        },
    }


def source_answering(
    handler: Callable[[httpx.Request], httpx.Response],
) -> PromHistorySource:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return PromHistorySource("http://prom.test:9090/", client=client)


def json_answer(body: object, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json=body)


def at(step: int) -> float:
    return T0_S + step * BUCKET_S


def counts_of(frame: pd.DataFrame) -> dict[tuple[str, str], int]:
    times = frame["ts"].dt.strftime("%H:%M").tolist()
    return {
        (str(moment), str(adapter)): int(n)
        for moment, adapter, n in zip(times, frame["adapter"], frame["requests"], strict=True)
    }


def test_counts_are_differences_per_series_summed_per_adapter() -> None:
    body = matrix(
        # Two router replicas serve adapter a; outcomes are separate series.
        (
            {"adapter": "a", "outcome": "gpu_hit", "instance": "r1"},
            [(at(0), 100), (at(1), 110), (at(2), 130)],
        ),
        (
            {"adapter": "a", "outcome": "cold_load", "instance": "r1"},
            [(at(0), 5), (at(1), 6), (at(2), 6)],
        ),
        (
            {"adapter": "a", "outcome": "gpu_hit", "instance": "r2"},
            [(at(0), 40), (at(1), 43), (at(2), 50)],
        ),
        (
            {"adapter": "b", "outcome": "gpu_hit", "instance": "r1"},
            [(at(0), 7), (at(1), 7), (at(2), 9)],
        ),
    )
    frame = source_answering(json_answer(body)).request_counts(
        start=T0, end=datetime(2026, 3, 12, 10, 20, tzinfo=UTC), bucket_s=BUCKET_S
    )
    assert list(frame.columns) == ["ts", "adapter", "requests"]
    assert str(frame["ts"].dtype) == "datetime64[ns, UTC]"
    assert counts_of(frame) == {
        ("10:00", "a"): 10 + 1 + 3,
        ("10:10", "a"): 20 + 0 + 7,
        ("10:10", "b"): 2,
    }


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # A router restart resets its counter: the value after the drop is the increase.
        ([(at(0), 50), (at(1), 60), (at(2), 4)], {("10:00", "a"): 10, ("10:10", "a"): 4}),
        # A series that first appears after the range start was created then: from zero.
        ([(at(1), 8), (at(2), 11)], {("10:00", "a"): 8, ("10:10", "a"): 3}),
        # Present at the start: the first value is history before the range, not counted.
        ([(at(0), 8), (at(1), 8), (at(2), 11)], {("10:10", "a"): 3}),
    ],
    ids=["counter-reset", "created-in-range", "baseline-at-start"],
)
def test_resets_and_new_series(
    points: list[tuple[float, float]], expected: dict[tuple[str, str], int]
) -> None:
    body = matrix(({"adapter": "a", "outcome": "gpu_hit"}, points))
    frame = source_answering(json_answer(body)).request_counts(
        start=T0, end=datetime(2026, 3, 12, 10, 20, tzinfo=UTC), bucket_s=BUCKET_S
    )
    assert counts_of(frame) == expected


def test_query_asks_for_the_raw_counter_on_bucket_boundaries() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=matrix())

    source = source_answering(handler)
    source.selector = 'namespace="ml"'
    frame = source.request_counts(
        start=datetime(2026, 3, 12, 10, 3, tzinfo=UTC),
        end=datetime(2026, 3, 12, 11, 0, tzinfo=UTC),
        bucket_s=BUCKET_S,
    )
    assert frame.empty and list(frame.columns) == ["ts", "adapter", "requests"]
    (request,) = seen
    assert request.url.path == "/api/v1/query_range"
    params = request.url.params
    assert params["query"] == 'lorafleet_requests_total{namespace="ml"}'
    assert float(params["start"]) == T0_S  # floored to the bucket
    assert float(params["end"]) == at(6)
    assert params["step"] == "600"


def test_long_ranges_are_chunked_without_losing_the_boundary_bucket() -> None:
    steps = 25_000

    def handler(request: httpx.Request) -> httpx.Response:
        start = float(request.url.params["start"])
        end = float(request.url.params["end"])
        # A counter that grows by one per step over the whole range.
        points = []
        moment = start
        while moment <= end:
            points.append((moment, (moment - T0_S) / 60))
            moment += 60
        return httpx.Response(200, json=matrix(({"adapter": "a"}, points)))

    source = source_answering(handler)
    frame = source.request_counts(
        start=T0, end=datetime.fromtimestamp(T0_S + steps * 60, tz=UTC), bucket_s=60
    )
    assert len(frame) == steps
    assert frame["requests"].sum() == steps


def test_request_log_is_a_pre_aggregated_log() -> None:
    body = matrix(({"adapter": "a"}, [(at(0), 1), (at(1), 4)]))
    log = source_answering(json_answer(body)).request_log(
        start=T0, end=datetime(2026, 3, 12, 10, 10, tzinfo=UTC), bucket_s=BUCKET_S
    )
    assert log.aggregated
    assert log.source == "prometheus http://prom.test:9090"
    assert log.counts(BUCKET_S)["requests"].tolist() == [3]


def _raise_connect(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _raise_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


@pytest.mark.parametrize(
    ("handler", "error", "words"),
    [
        (_raise_connect, RetryableHistorySourceError, "did not answer: ConnectError"),
        (_raise_timeout, RetryableHistorySourceError, "did not answer: ReadTimeout"),
        (
            lambda r: httpx.Response(503, text="service unavailable"),
            RetryableHistorySourceError,
            "HTTP 503",
        ),
        (lambda r: httpx.Response(200, text="<html>proxy</html>"), HistorySourceError, "not JSON"),
        (json_answer([1, 2]), HistorySourceError, "not a JSON object"),
        (
            json_answer(
                {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, 400
            ),
            HistorySourceError,
            "query failed (bad_data, HTTP 400): parse error at char 3",
        ),
        (json_answer({"status": "success"}), HistorySourceError, "no data.result"),
        (
            json_answer({"status": "success", "data": {"resultType": "vector", "result": []}}),
            HistorySourceError,
            "expected a matrix result, got 'vector'",
        ),
        (
            json_answer({"status": "success", "data": {"resultType": "matrix", "result": [{}]}}),
            HistorySourceError,
            "data.result[0] has no metric labels",
        ),
        (
            json_answer(
                {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [{"metric": {"adapter": "a"}, "values": [[1.0, "x"]]}],
                    },
                }
            ),
            HistorySourceError,
            "data.result[0].values[0] is not [time, value]",
        ),
    ],
    ids=[
        "down",
        "timeout",
        "5xx",
        "not-json",
        "not-object",
        "status-error",
        "no-data",
        "not-matrix",
        "no-labels",
        "bad-value",
    ],
)
def test_bad_answers_raise_clear_errors(
    handler: Callable[[httpx.Request], httpx.Response],
    error: type[HistorySourceError],
    words: str,
) -> None:
    source = source_answering(handler)
    with pytest.raises(error) as caught:
        source.request_counts(
            start=T0, end=datetime(2026, 3, 12, 11, 0, tzinfo=UTC), bucket_s=BUCKET_S
        )
    assert words in str(caught.value)
    assert "prom.test:9090" in str(caught.value)
    if error is HistorySourceError:
        assert not isinstance(caught.value, RetryableHistorySourceError)
