"""The war story's figures in windows of local time, as the article reports them.

One replay of the war story (``placement.sim``) gives per-request outcomes and TTFTs,
and per-load start and end times; this module cuts them into the article's windows
(Thursday 08:00-10:15 New York time as "before", the quarters at noon, 13:00, 14:30,
15:00 and 15:15, and 14:30-15:30 as the cascade) and computes, per window:

- ``hit``: share of the window's requests that found their adapter on the GPU;
- ``swaps``: GPU loads started in the window, per pod per second;
- ``residency_p50_s``: median time on a GPU slot of the adapters evicted in the window,
  one sample per eviction (the simulator's ``residency_p50_s``, windowed);
- ``residency_slot_p50_s``: the median slot-second's stay: every stay on a GPU slot
  that overlaps the window (evicted or not), weighted by its overlap, valued at its
  whole length (what sampling the slots at random moments of the window reads);
- ``ttft_p95_ms``: TTFT p95 of the window's requests;
- ``critical_pods``: pods whose queue stood at or above EPP's max queue depth (8, where
  EPP stops routing to a pod) for at least a minute in the window.

Eviction times are not in ``SimLog``; ``TimedReplay`` records them by watching each
pod's ``residencies_s`` (a benchmark's instrument, not the simulator's interface).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd

from placement.sim.engine import GPU_HIT, REJECTED, FleetReplay, SimLog
from placement.sim.workload import SimWorkload

ZONE = "America/New_York"
#: EPP filters out a pod with this many queued requests (``route_epp``).
CRITICAL_QUEUE = 8
CRITICAL_S = 60.0


class _Evictions(list[float]):
    """A pod's ``residencies_s`` that also notes when each stay ended."""

    def __init__(self, replay: FleetReplay, pod: int, ended: list[tuple[float, int, float]]):
        super().__init__()
        self.replay, self.pod, self.ended = replay, pod, ended

    def append(self, value: float) -> None:
        super().append(value)
        self.ended.append((self.replay.now_s, self.pod, value))


class TimedReplay(FleetReplay):
    """A ``FleetReplay`` that keeps (eviction time, pod, stay) for every eviction."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.evictions: list[tuple[float, int, float]] = []
        for p, pod in enumerate(self.pods):
            pod.residencies_s = _Evictions(self, p, self.evictions)

    def stays(self) -> np.ndarray:
        """(landed, left) seconds of every stay on a GPU slot; one still there at the
        end of the replay left then."""
        ended = [(at - stay, at) for at, _, stay in self.evictions]
        still = [(landed, self.now_s) for pod in self.pods for landed in pod.gpu_adapters.values()]
        return np.asarray(ended + still, dtype=float).reshape(-1, 2)


@dataclass(frozen=True, kw_only=True)
class Window:
    name: str
    start: datetime
    end: datetime


def thursday(hhmm: str) -> pd.Timestamp:
    return pd.Timestamp(f"2026-03-12T{hhmm}:00").tz_localize(ZONE)


def article_windows() -> list[Window]:
    """The windows the article's figures are read in. A latency "at 15:15" is what a
    dashboard shows then: the 5 minutes up to that moment (Prometheus' ``rate[5m]``)."""

    def w(name: str, start: str, end: str) -> Window:
        return Window(name=name, start=thursday(start), end=thursday(end))

    return [
        w("before 08:00-10:15", "08:00", "10:15"),
        w("10:15-11:15", "10:15", "11:15"),
        w("at 12:00", "11:55", "12:00"),
        w("at 13:00", "12:55", "13:00"),
        w("at 14:30", "14:25", "14:30"),
        w("at 15:00", "14:55", "15:00"),
        w("at 15:15", "15:10", "15:15"),
        w("cascade 14:30-15:30", "14:30", "15:30"),
        w("16:00-17:00", "16:00", "17:00"),
    ]


#: The article's figures: (window name, figure, value, how it reads).
ARTICLE = (
    ("before 08:00-10:15", "hit", 0.92, "over 92% GPU hits"),
    ("before 08:00-10:15", "residency_p50_s", 2700.0, "residency about 45 min"),
    ("before 08:00-10:15", "swaps", 0.04, "0.04 swaps/s/pod"),
    ("before 08:00-10:15", "ttft_p95_ms", 220.0, "TTFT p95 220 ms"),
    ("at 12:00", "ttft_p95_ms", 310.0, "p95 310 ms at noon"),
    ("at 13:00", "ttft_p95_ms", 380.0, "p95 380 ms at 13:00"),
    ("at 14:30", "ttft_p95_ms", 600.0, "p95 600 ms at 14:30"),
    ("at 15:00", "ttft_p95_ms", 1200.0, "p95 1.2 s at 15:00"),
    ("at 15:15", "ttft_p95_ms", 2200.0, "p95 2.2 s at 15:15"),
    ("cascade 14:30-15:30", "residency_p50_s", 40.0, "residency down to 40 s"),
    ("cascade 14:30-15:30", "swaps", 1.8, "1.8 swaps/s/pod"),
    ("at 15:15", "critical_pods", 6.0, "6 of 8 queues critical"),
)


def within(figure: str, measured: float, article: float, tolerance: float = 0.3) -> bool:
    """The calibration's test: within 30% of the article (a hit rate: at least it)."""
    if figure == "hit":
        return measured >= article
    return abs(measured - article) <= tolerance * article


def _slot_median(stays: np.ndarray, start_s: float, end_s: float) -> float:
    """The median of stay lengths weighted by each stay's overlap with the window."""
    overlap = np.clip(np.minimum(stays[:, 1], end_s) - np.maximum(stays[:, 0], start_s), 0, None)
    inside = overlap > 0
    if not inside.any():
        return 0.0
    lengths, weights = (stays[:, 1] - stays[:, 0])[inside], overlap[inside]
    order = np.argsort(lengths)
    cumulative = np.cumsum(weights[order])
    return float(lengths[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def _critical_pods(
    workload: SimWorkload,
    log: SimLog,
    pods: int,
    start_s: float,
    end_s: float,
    prefill_ms_per_token: float,
) -> int:
    """Pods whose queue held >= CRITICAL_QUEUE requests for CRITICAL_S in the window.

    A request waits in its pod's queue from arrival to admission; admission is its
    TTFT less its prefill (the engine's arithmetic)."""
    arrival = np.asarray(workload.arrival_s)
    pod = np.asarray(log.pod)
    served = (np.asarray(log.outcome) != REJECTED) & (pod >= 0)
    prefill_s = np.asarray(workload.prompt_tokens) * prefill_ms_per_token / 1000.0
    admitted = arrival + np.asarray(log.ttft_ms) / 1000.0 - prefill_s
    count = 0
    for p in range(pods):
        mine = served & (pod == p) & (admitted > start_s) & (arrival < end_s)
        times = np.concatenate([arrival[mine], admitted[mine]])
        steps = np.concatenate([np.ones(mine.sum()), -np.ones(mine.sum())])
        order = np.lexsort((steps, times))
        times, depth = times[order], np.cumsum(steps[order])
        ends = np.append(times[1:], end_s)
        lo, hi = np.clip(times, start_s, end_s), np.clip(ends, start_s, end_s)
        if float(((hi - lo) * (depth >= CRITICAL_QUEUE)).sum()) >= CRITICAL_S:
            count += 1
    return count


def window_figures(
    workload: SimWorkload,
    log: SimLog,
    replay: TimedReplay,
    *,
    pods: int,
    window: Window,
    prefill_ms_per_token: float,
) -> dict[str, float]:
    origin = pd.Timestamp(workload.start)
    start_s = (pd.Timestamp(window.start) - origin).total_seconds()
    end_s = (pd.Timestamp(window.end) - origin).total_seconds()
    arrival = np.asarray(workload.arrival_s)
    inside = (arrival >= start_s) & (arrival < end_s)
    outcome = np.asarray(log.outcome)[inside]
    served = outcome != REJECTED
    ttft = np.asarray(log.ttft_ms)[inside][served]
    loads = np.asarray([start for start, *_ in log.loads])
    stays = np.asarray([stay for at, _, stay in replay.evictions if start_s <= at < end_s])
    span_s = max(end_s - start_s, 1.0)
    return {
        "requests": int(inside.sum()),
        "req_per_s": float(inside.sum()) / span_s,
        "hit": float(np.mean(outcome[served] == GPU_HIT)) if served.any() else 0.0,
        "swaps": float(((loads >= start_s) & (loads < end_s)).sum()) / (pods * span_s),
        "residency_p50_s": float(np.median(stays)) if stays.size else 0.0,
        "residency_slot_p50_s": _slot_median(replay.stays(), start_s, end_s),
        "ttft_p95_ms": float(np.percentile(ttft, 95)) if ttft.size else 0.0,
        "critical_pods": _critical_pods(workload, log, pods, start_s, end_s, prefill_ms_per_token),
        "rejected": int((~served).sum()),
    }
