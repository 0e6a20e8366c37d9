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

The article's two fixes, as what-if variants of the war story's inputs:

- ``eight_slots``: 8 GPU adapter slots per pod instead of 4, paid for by the KV cache
  (30 GB down to 28 GB: the simulator's KV tokens and its batch cap scale by 28/30 and
  165/180, the article's "~180 to ~165 concurrent sequences"; the 2 GB go to adapters);
- ``top_production`` and ``pin_plan``: the top 10 production adapters (no
  ``-experiment`` suffix) by requests before a moment, pinned one pod each: the five
  highest over the first four pods, the next five over the other four (the article's
  "four pods received pinned assignments for the five highest-traffic adapters");
  ``pinned_catalog`` writes that catalog variant, and ``pinned_replay`` loads the pins
  on their pods before the first request and keeps them from eviction (vLLM's
  ``pin_lora``, an engine call the simulated engine model honours).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from placement.domain import Fleet
from placement.residency import Effects
from placement.settings import Settings
from placement.sim.engine import GPU_HIT, REJECTED, FleetReplay, SimLog
from placement.sim.pods import SimPod
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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


def request_window(
    workload: SimWorkload, log: SimLog, *, pods: int, start_s: float, end_s: float
) -> dict[str, float]:
    """The window's requests and loads: GPU hits (of the served), loads started per pod
    per second, TTFT p95 of the served; no eviction times needed."""
    arrival = np.asarray(workload.arrival_s)
    inside = (arrival >= start_s) & (arrival < end_s)
    outcome = np.asarray(log.outcome)[inside]
    served = outcome != REJECTED
    ttft = np.asarray(log.ttft_ms)[inside][served]
    loads = np.asarray([start for start, *_ in log.loads])
    span_s = max(end_s - start_s, 1.0)
    return {
        "requests": int(inside.sum()),
        "req_per_s": float(inside.sum()) / span_s,
        "hit": float(np.mean(outcome[served] == GPU_HIT)) if served.any() else 0.0,
        "swaps": float(((loads >= start_s) & (loads < end_s)).sum()) / (pods * span_s),
        "ttft_p95_ms": float(np.percentile(ttft, 95)) if ttft.size else 0.0,
        "rejected": int((~served).sum()),
    }


def window_seconds(workload: SimWorkload, window: Window) -> tuple[float, float]:
    """The window on the replay's clock (seconds since the log's first request)."""
    origin = pd.Timestamp(workload.start)
    start_s = (pd.Timestamp(window.start) - origin).total_seconds()
    return start_s, (pd.Timestamp(window.end) - origin).total_seconds()


def window_figures(
    workload: SimWorkload,
    log: SimLog,
    replay: TimedReplay,
    *,
    pods: int,
    window: Window,
    prefill_ms_per_token: float,
) -> dict[str, float]:
    start_s, end_s = window_seconds(workload, window)
    stays = np.asarray([stay for at, _, stay in replay.evictions if start_s <= at < end_s])
    return {
        **request_window(workload, log, pods=pods, start_s=start_s, end_s=end_s),
        "residency_p50_s": float(np.median(stays)) if stays.size else 0.0,
        "residency_slot_p50_s": _slot_median(replay.stays(), start_s, end_s),
        "critical_pods": _critical_pods(workload, log, pods, start_s, end_s, prefill_ms_per_token),
    }


def article_figures(
    workload: SimWorkload, log: SimLog, *, pods: int, prefill_ms_per_token: float
) -> dict[str, float]:
    """The article's figures but residency (which needs eviction times, ``TimedReplay``),
    keyed ``"window|figure"`` as ``ARTICLE`` names them."""
    windows = {w.name: w for w in article_windows()}
    figures: dict[str, float] = {}
    for name, key, _, _ in ARTICLE:
        if key.startswith("residency"):
            continue
        start_s, end_s = window_seconds(workload, windows[name])
        if key == "critical_pods":
            figures[f"{name}|{key}"] = _critical_pods(
                workload, log, pods, start_s, end_s, prefill_ms_per_token
            )
        else:
            window = request_window(workload, log, pods=pods, start_s=start_s, end_s=end_s)
            figures[f"{name}|{key}"] = window[key]
    return figures


# --- the article's two fixes, as what-ifs ------------------------------------------

#: Fix (a): the KV cache gives 2 GB (30 -> 28 GB) for 4 more slots; concurrency drops
#: from about 180 sequences to about 165.
KV_SHARE = 28.0 / 30.0
SEQS_SHARE = 165.0 / 180.0
GiB = 1 << 30


def eight_slots(fleet: Fleet, settings: Settings) -> tuple[Fleet, Settings]:
    """Fix (a): every pod with 8 GPU adapter slots, its KV cache 2 GB smaller."""
    pools = tuple(
        replace(
            pool,
            pods=tuple(
                replace(
                    pod,
                    max_loras=8,
                    max_cpu_loras=max(pod.max_cpu_loras, 8),
                    hbm_adapter_bytes=pod.hbm_adapter_bytes + 2 * GiB,
                )
                for pod in pool.pods
            ),
        )
        for pool in fleet.pools
    )
    sim = replace(
        settings.sim,
        kv_capacity_tokens=int(settings.sim.kv_capacity_tokens * KV_SHARE),
        max_num_seqs=max(1, round(settings.sim.max_num_seqs * SEQS_SHARE)),
    )
    return Fleet(pools=pools), replace(settings, sim=sim)


def top_production(
    workload: SimWorkload, *, before: pd.Timestamp, count: int = 10, suffix: str = "-experiment"
) -> list[str]:
    """The ``count`` adapters with the most requests before ``before``, variants left out."""
    end_s = (before - pd.Timestamp(workload.start)).total_seconds()
    arrival = np.asarray(workload.arrival_s)
    seen = Counter(workload.adapters[: int(np.searchsorted(arrival, end_s))])
    ranked = sorted(
        ((n, name) for name, n in seen.items() if not name.endswith(suffix)),
        key=lambda item: (-item[0], item[1]),
    )
    return [name for _, name in ranked[:count]]


def pin_plan(adapters: Sequence[str], pods: Sequence[str]) -> dict[str, str]:
    """Adapter -> the pod it is pinned on: the first half of ``adapters`` (the highest)
    round the first half of ``pods``, the rest round the other half."""
    half, pod_half = (len(adapters) + 1) // 2, max(len(pods) // 2, 1)
    first, second = pods[:pod_half], pods[pod_half:] or pods[:pod_half]
    plan = {name: first[i % len(first)] for i, name in enumerate(adapters[:half])}
    plan.update({name: second[i % len(second)] for i, name in enumerate(adapters[half:])})
    return plan


def pinned_catalog(catalog_path: Path, pins: Mapping[str, str], directory: Path) -> Path:
    """The catalog with each of ``pins`` pinned on its pod, written in ``directory``."""
    raw = yaml.safe_load(catalog_path.read_text())
    for entry in raw["adapters"]:
        if entry["name"] in pins:
            entry["pinned"] = [pins[entry["name"]]]
    path = directory / "catalog.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def pinned_replay(pins: Mapping[str, str]) -> type[FleetReplay]:
    """``engine_pinned_replay`` of one pod per pinned adapter (``{adapter: pod}``), under
    LRU only: the what-ifs pin what the engine's own eviction would have let go."""
    by_pod: dict[str, set[str]] = {}
    for adapter, pod_id in pins.items():
        by_pod.setdefault(pod_id, set()).add(adapter)
    return engine_pinned_replay(by_pod, lru_only=True)


def engine_pinned_replay(
    by_pod: Mapping[str, Collection[str]], *, lru_only: bool
) -> type[FleetReplay]:
    """A ``FleetReplay`` whose pods start with their pinned adapters (``{pod: adapters}``)
    on GPU slots, which the engine then evicts neither from its GPU slots nor from its
    host cache (vLLM's ``pin_lora`` pins both; leaving the host cache leaves the GPU
    too). A pin a restart would drop; the what-ifs have none. With ``lru_only`` the pins
    hold only under the engine's own eviction (LRU), not under a counterfactual one."""

    class PinnedReplay(FleetReplay):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for pod in self.pods:
                for adapter in sorted(by_pod.get(pod.pod_id, ())):
                    pod.load(adapter, now_s=0.0)
                    pod.model.pinned.add(adapter)

        def _fetch(self, pod: SimPod, adapter: str, now_s: float) -> Effects:
            pinned = by_pod.get(pod.pod_id)
            if not pinned or (lru_only and self.router_eviction is not EvictionPolicy.LRU):
                return super()._fetch(pod, adapter, now_s)
            # The engine model's vLLM host cache knows no pins: a pinned adapter is
            # passed as busy, which its eviction skips while it has another choice.
            busy = {*pod.running_adapters, *pod.waiting_adapters, *pinned}
            return pod.fetch(adapter, busy=busy, now_s=now_s)

    return PinnedReplay
