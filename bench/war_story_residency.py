"""Residency as a dashboard would show it, on the war story under EPP (one replay).

The replay's ``residency_p50_s`` is the median stay of the adapters evicted in a
window, one sample per eviction. On 4-slot pods that median cannot reach the article's
45 minutes (the mean stay is 4 / swaps per pod per second, and the evictions are
dominated by the tail adapters that come and go). A dashboard samples what is resident
instead; this script reads two such figures per window of Thursday (New York time):

- ``resident_age_p50_s``: every adapter on a GPU slot, its age (seconds since it
  landed) sampled at each minute mark of the window; the median of those samples;
- ``served_age_p50_s``: the same minute samples weighted by requests: each request
  admitted in the minute after a mark adds one sample, the age at that mark of its
  adapter on its pod (a request whose adapter landed during the minute adds none):
  how long the adapters that served the traffic had been resident.

It also prints per window the requests shed (EPP's 503s at saturation) and how many
pods held a queue at or past a line for a minute or more: EPP's max depth (8, the
calibration table's "critical") and the saturation detector's line (more than 5).

    .venv/bin/python bench/war_story_residency.py [--data DIR]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from placement.inputs import load_catalog, load_fleet
from placement.inputs.request_log import load_request_log
from placement.settings import Settings
from placement.sim.engine import REJECTED, FleetReplay, SimLog
from placement.sim.pods import SimPod
from placement.sim.replay import run_policy
from placement.sim.workload import SimWorkload, workload_from_log

DATA = Path("data/war-story")
ZONE = "America/New_York"
MINUTE_S = 60.0
#: Queue lines: EPP's max depth, and one past the saturation detector's threshold.
LINES = (8, 6)


class AgedReplay(FleetReplay):
    """A ``FleetReplay`` that notes, per admitted request, when it was admitted and
    when its adapter had landed on its pod (a benchmark's instrument)."""

    last: AgedReplay | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        count = len(self.workload)
        self.admitted_s = np.full(count, np.nan)
        self.landed_s = np.full(count, np.nan)
        AgedReplay.last = self

    def _admit(self, pod: SimPod, p: int, r: int, adapter: str, need: int, now_s: float) -> None:
        self.admitted_s[r] = now_s
        self.landed_s[r] = pod.gpu_adapters.get(adapter, now_s)
        super()._admit(pod, p, r, adapter, need, now_s)


@dataclass(frozen=True)
class Window:
    name: str
    start: str
    end: str


WINDOWS = (
    Window("before 08:00-10:15", "08:00", "10:15"),
    Window("10:15-11:15", "10:15", "11:15"),
    Window("at 15:00", "14:55", "15:00"),
    Window("at 15:15", "15:10", "15:15"),
    Window("cascade 14:30-15:30", "14:30", "15:30"),
)


def _seconds(workload: SimWorkload, hhmm: str) -> float:
    moment = pd.Timestamp(f"2026-03-12T{hhmm}:00").tz_localize(ZONE)
    return (moment - pd.Timestamp(workload.start)).total_seconds()


def resident_age_p50_s(log: SimLog, start_s: float, end_s: float) -> float:
    """Median age of the adapters on GPU slots, sampled at each minute mark."""
    ended = np.asarray(log.residency_end_s, dtype=float)
    landed = ended - np.asarray(log.residency_s, dtype=float)
    ages = [
        mark - landed[(landed <= mark) & (ended > mark)]
        for mark in np.arange(start_s, end_s, MINUTE_S)
    ]
    samples = np.concatenate(ages) if ages else np.empty(0)
    return float(np.median(samples)) if samples.size else 0.0


def served_age_p50_s(replay: AgedReplay, start_s: float, end_s: float) -> float:
    """The minute samples of ``resident_age_p50_s``, one per request admitted in the
    minute after each mark."""
    admitted, landed = replay.admitted_s, replay.landed_s
    inside = (admitted >= start_s) & (admitted < end_s)
    marks = start_s + np.floor((admitted[inside] - start_s) / MINUTE_S) * MINUTE_S
    ages = marks - landed[inside]
    ages = ages[ages >= 0.0]
    return float(np.median(ages)) if ages.size else 0.0


def pods_over_line(replay: AgedReplay, log: SimLog, start_s: float, end_s: float, line: int) -> int:
    """Pods whose waiting queue held ``line`` or more requests for a minute or more of
    the window (a request waits from its arrival to its admission)."""
    arrival = np.asarray(replay.workload.arrival_s)
    pod = np.asarray(log.pod)
    served = (np.asarray(log.outcome) != REJECTED) & (pod >= 0)
    count = 0
    for p in range(len(replay.pods)):
        mine = served & (pod == p) & (replay.admitted_s > start_s) & (arrival < end_s)
        times = np.concatenate([arrival[mine], replay.admitted_s[mine]])
        steps = np.concatenate([np.ones(mine.sum()), -np.ones(mine.sum())])
        order = np.lexsort((steps, times))
        times, depth = times[order], np.cumsum(steps[order])
        lo = np.clip(times, start_s, end_s)
        hi = np.clip(np.append(times[1:], end_s), start_s, end_s)
        count += int(float(((hi - lo) * (depth >= line)).sum()) >= MINUTE_S)
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    settings = Settings()
    fleet = load_fleet(args.data / "fleet.yaml")
    catalog = load_catalog(args.data / "catalog.yaml", fleet=fleet)
    log = load_request_log(args.data / "requests.parquet")
    load = workload_from_log(log, catalog, bucket_s=settings.forecast.bucket_s)
    began = time.perf_counter()
    result = run_policy("epp", load, fleet, settings=settings, replay_type=AgedReplay)
    replay = AgedReplay.last
    assert replay is not None
    print(f"epp on {len(load):,} requests in {time.perf_counter() - began:.0f} s")
    arrival = np.asarray(load.arrival_s)
    shed = np.zeros(len(arrival), dtype=bool)
    shed[np.asarray(result.log.shed, dtype=np.int64)] = True
    print(
        "\n| window | resident age p50 s | request-weighted age p50 s | evicted stay p50 s"
        f" | shed | pods >= {LINES[0]} | pods >= {LINES[1]} |\n|---|---|---|---|---|---|---|"
    )
    for window in WINDOWS:
        lo, hi = _seconds(load, window.start), _seconds(load, window.end)
        inside = (arrival >= lo) & (arrival < hi)
        ended = np.asarray(result.log.residency_end_s)
        evicted = np.asarray(result.log.residency_s)[(ended >= lo) & (ended < hi)]
        over = [pods_over_line(replay, result.log, lo, hi, line) for line in LINES]
        print(
            f"| {window.name} | {resident_age_p50_s(result.log, lo, hi):.0f}"
            f" | {served_age_p50_s(replay, lo, hi):.0f}"
            f" | {float(np.median(evicted)) if evicted.size else 0.0:.1f}"
            f" | {int(shed[inside].sum()):,} of {int(inside.sum()):,}"
            f" | {over[0]} | {over[1]} |"
        )


if __name__ == "__main__":
    main()
