"""The requests the demo's client got no answer to are counted by the client's error and
said, not only missing from the router's log (the e2e check read "logged 1045 != sent
1088" with nothing on why)."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from placement.demo.measure import EventFigures, measure
from placement.demo.traffic import ShotResult

START = datetime(2026, 3, 10, 10, tzinfo=UTC)


def _measured(results: list[ShotResult]) -> tuple[str | None, tuple[tuple[str, int], ...]]:
    answered = [r for r in results if r.ok]
    log = pd.DataFrame(
        {
            "ts": pd.Series([pd.Timestamp(START)] * len(answered), dtype="datetime64[ns, UTC]"),
            "adapter": [r.adapter for r in answered],
            "tenant": "",
            "outcome": "gpu_hit",
            "ttft_ms": 10.0,
            "status": 200,
        }
    )
    result = measure(
        "lorafleet",
        log=log,
        served_model="base",
        measured_from=START,
        window_s=60.0,
        before=[],
        after=[],
        results=results,
        events=EventFigures(),
    )
    return result.unanswered_line(), result.unanswered


def test_every_request_answered_says_nothing() -> None:
    ok = [ShotResult(adapter="a1", ok=True, ttft_ms=5.0)] * 3
    assert _measured(ok) == (None, ())


def test_requests_without_an_answer_are_counted_by_the_client_s_error() -> None:
    results = [
        ShotResult(adapter="a1", ok=True, ttft_ms=5.0),
        ShotResult(adapter="a1", ok=False, ttft_ms=0.0, error="APITimeoutError"),
        ShotResult(adapter="a2", ok=False, ttft_ms=0.0, error="APITimeoutError"),
        ShotResult(adapter="a2", ok=False, ttft_ms=0.0, error="APIConnectionError"),
    ]
    line, unanswered = _measured(results)
    assert unanswered == (("APIConnectionError", 1), ("APITimeoutError", 2))
    assert line == (
        "lorafleet: 3 of 4 requests got no answer (APIConnectionError 1, APITimeoutError 2); "
        "the router logged 1 of the 4"
    )
