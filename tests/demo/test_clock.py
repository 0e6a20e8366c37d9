"""The warped clock runs a scenario's time faster than the wall clock, from a chosen start."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from placement.clock import clock_from_options, warped_clock


def test_a_warped_clock_starts_at_its_moment_and_runs_speed_times_faster() -> None:
    wall = iter([1000.0, 1000.0, 1010.0])
    start = datetime(2026, 3, 12, 14, 0, tzinfo=UTC)
    now = warped_clock(start=start, speed=360.0, wall=lambda: next(wall))
    assert now() == start.timestamp()
    assert now() - start.timestamp() == pytest.approx(3600.0)


def test_the_default_is_the_wall_clock() -> None:
    assert clock_from_options(None, 1.0) is time.time


def test_a_speed_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        warped_clock(start=datetime(2026, 3, 12, tzinfo=UTC), speed=0.0)


def test_before_its_origin_a_warped_clock_reads_earlier_than_its_start() -> None:
    start = datetime(2026, 3, 12, 13, 0, tzinfo=UTC)
    now = warped_clock(start=start, speed=100.0, wall=lambda: 990.0, wall_origin_s=1000.0)
    assert now() == start.timestamp() - 1000.0
