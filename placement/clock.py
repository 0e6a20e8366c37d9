"""Clocks for processes: the wall clock, or a warped one for demos and replays.

A warped clock starts at a chosen moment of a scenario and runs ``speed`` times faster
than the wall clock, so that the router stamps its request log and the controller
plans on the same scenario time while a day of traffic is replayed in minutes.
Entry points build the clock and pass it down; nothing else reads the time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

Clock = Callable[[], float]


def warped_clock(
    *, start: datetime, speed: float, wall: Clock = time.time, wall_origin_s: float | None = None
) -> Clock:
    """Epoch seconds that read ``start`` at wall time ``wall_origin_s`` (default: now) and
    pass ``speed`` times faster; before the origin they read earlier than ``start``."""
    if speed <= 0:
        raise ValueError(f"a clock speed must be positive, got {speed}")
    origin_s = start.timestamp()
    if wall_origin_s is None:
        wall_origin_s = wall()

    def now() -> float:
        return origin_s + (wall() - wall_origin_s) * speed

    return now


def clock_from_options(
    start: datetime | None, speed: float, *, wall_origin_s: float | None = None
) -> Clock:
    """The wall clock, unless a start or a speed other than 1 warps it."""
    if start is None and speed == 1.0:
        return time.time
    begin = start or datetime.fromtimestamp(time.time()).astimezone()
    return warped_clock(start=begin, speed=speed, wall_origin_s=wall_origin_s)


class ManualClock:
    """A clock that moves only when told to: for tests and step-by-step replays."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back, got {seconds} s")
        self.now_s += seconds
