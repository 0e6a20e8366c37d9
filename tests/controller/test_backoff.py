"""Backoff: doubles to a cap, and no clock jump can strand a job."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from placement.controller.ports import Backoff

BASE_S, MAX_S = 30.0, 900.0


def test_waits_double_up_to_the_cap() -> None:
    backoff, waits = Backoff(), []
    for _ in range(8):
        backoff = backoff.failed("boom", now_s=0.0, base_s=BASE_S, max_s=MAX_S)
        waits.append(backoff.retry_at_s)
    assert waits == [30.0, 60.0, 120.0, 240.0, 480.0, 900.0, 900.0, 900.0]


@given(
    failures=st.integers(1, 20),
    failed_at_s=st.floats(-1e9, 1e9),
    jump_s=st.floats(-1e9, 1e9),
)
def test_a_job_is_due_again_within_the_cap_whatever_the_clock_did(
    failures: int, failed_at_s: float, jump_s: float
) -> None:
    backoff = Backoff()
    for _ in range(failures):
        backoff = backoff.failed("boom", now_s=failed_at_s, base_s=BASE_S, max_s=MAX_S)
    now_s = failed_at_s + jump_s
    # Not due only inside [retry_at - max, retry_at): never longer than the cap.
    assert backoff.due(now_s, max_s=MAX_S) or backoff.due(now_s + MAX_S, max_s=MAX_S)
    assert not backoff.due(failed_at_s, max_s=MAX_S)
