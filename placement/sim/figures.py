"""The figures operators watch for thrashing, computed from one replay's log.

Owns the metric names (the ``--json`` keys) and their definitions:

- ``requests``, ``served``, ``rejected`` (not served) and ``shed`` (of those, refused
  outright by the router with a 503: EPP's saturation or the memory-pressure reject
  tier); every figure of requests below counts the served ones alone, as a dashboard
  of served requests does.
- ``gpu_hit_rate``: share of served requests whose adapter was on a GPU slot of their
  pod when they arrived there and stayed until admission; ``cpu_hit_rate``: served
  requests that waited for a load from host RAM; the rest waited for a storage load.
- ``cold_loads_on_critical_path``: served requests that waited for a load from
  storage (a cold load, not host RAM) before their first token: the requests behind
  ``cold_load_rate``, counted: the engine's COLD_LOAD outcome (the adapter was
  loading from storage when the request reached its pod, or was neither on its GPU
  nor in its host RAM, or its adapter left the GPU (a hit) or the host cache (a host
  hit) before the load it waited for, which then read storage).
  Several requests may wait for one load: this counts requests, ``cold_loads`` loads.
- ``loads`` (all adapter loads, preloads included), ``cold_loads`` (from storage),
  ``loads_per_pod_s`` (over the whole replay) and ``loads_per_pod_s_peak`` (the worst
  ``metrics_window_s`` window).
- ``residency_p50_s``/``_p95_s``: how long an adapter stayed on a GPU slot, load to
  eviction (or the end of the replay).
- ``ttft_*_ms``: overall, and ``_hit``/``_miss`` by class.
- ``load_wait_share``: share of pod time spent draining and loading adapters.
- ``throughput_rps``: served requests over the replay's span.
- ``distinct_adapters_per_pod``: mean distinct adapters each pod served.
- with events delivered, ``events``: ``count`` (delivered), ``first_request_gpu_share``
  and ``first_request_ttft_p95_ms`` (the first request carrying each delivered event's
  id: found its adapter on the GPU; its TTFT), ``preloads`` (loads an event's Warmup
  started) and ``preloads_unused_share`` (of those, the ones no request for that
  adapter reached on that pod before it left the GPU or the replay ended),
  ``cold_loads_on_critical_path`` (of every request carrying a delivered event's id,
  not only the first), ``by_kind`` (``pipeline`` and ``login``, both always: ``count``,
  the two first-request figures and the cold loads, for that kind's events alone) and
  ``login_surge_ttft_p95_ms`` (per tenant: the TTFT p95 of the served requests for
  the tenant's adapters, by the catalog's ``tenant``, arriving during one of its login
  surges; a surge clusters a tenant's logins less than ``SURGE_GAP_S`` (10 min) apart
  and lasts from its first login to ``SURGE_TAIL_S`` (10 min) after its last; a lone
  login is a surge of one; a tenant with no served request in a surge is left out).
- with ``RouterSettings.class_priority`` (``lorafleet replay --class-priority``),
  ``by_class`` (``class_figures``: per catalog class, ``requests``, ``served``,
  ``gpu_hit_rate`` and ``ttft_p50/p95/p99_ms``) and ``class_warmups`` (the warm-ups the
  router sent, ``SimLog.warmups``).
- ``convoy``: a cascade happened: some window had at least ``convoy_loads_per_pod_s``
  loads per pod per second while half or more of the pods were loading at once.

Two figures beside them, for the questions a replay's totals do not answer:
``storage_read_bound`` (how few storage reads the fleet's host places allow at all,
``cold_loads`` can be read against it) and ``after_pod_loss`` (the requests arriving
just after each pod restart or outage of ``--faults``: what availability replicas are for).

With a ``window`` (replay seconds, ``lorafleet replay --from/--to``) every figure is of
that window alone, the replay having run the whole log: requests arriving in it, loads
starting in it, stays on a GPU slot ending in it (evicted, or still there when the
replay ended), rates over its length.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np

from placement.forecast.event_preloads import EventKind
from placement.settings import SimSettings
from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT, REJECTED, SimLog
from placement.sim.events import SimEvent
from placement.sim.faults import DOWN, RESTART, FaultStep
from placement.sim.pods import SimPod
from placement.sim.workload import SimWorkload

Metrics = dict[str, float | int | bool]
#: Logins of one tenant less than this apart are one surge ...
SURGE_GAP_S = 600.0
#: ... which lasts until this long after its last login.
SURGE_TAIL_S = 600.0


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def _ttft(ttft: np.ndarray, mask: np.ndarray, prefix: str) -> Metrics:
    chosen = ttft[mask]
    return {f"{prefix}_p{q}_ms": round(_pct(chosen, q), 3) for q in (50, 95, 99)}


def _max_concurrent(starts: np.ndarray, ends: np.ndarray) -> int:
    if not starts.size:
        return 0
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones_like(starts), -np.ones_like(ends)])
    order = np.lexsort((steps, times))  # at equal times, ends (-1) first
    return int(np.cumsum(steps[order]).max())


def _load_metrics(
    log: SimLog, pods: int, span_s: float, sim: SimSettings, bounds: tuple[float, float]
) -> Metrics:
    loads = np.array(log.loads, dtype=float).reshape(-1, 4)
    loads = loads[(loads[:, 0] >= bounds[0]) & (loads[:, 0] <= bounds[1])]
    starts, ends = loads[:, 0], loads[:, 1]
    window = sim.metrics_window_s
    peak = 0.0
    convoy = False
    if starts.size:
        buckets = (starts // window).astype(np.int64)
        per_window = np.bincount(buckets)
        peak = float(per_window.max()) / (pods * window)
        for bucket in np.nonzero(per_window / (pods * window) >= sim.convoy_loads_per_pod_s)[0]:
            inside = buckets == bucket
            if _max_concurrent(starts[inside], ends[inside]) * 2 >= pods:
                convoy = True
                break
    return {
        "loads": int(starts.size),
        "cold_loads": int(loads[:, 3].sum()),
        "loads_per_pod_s": round(starts.size / (pods * span_s), 6),
        "loads_per_pod_s_peak": round(peak, 6),
        "load_wait_share": round(float((ends - starts).sum()) / (pods * span_s), 6),
        "max_pods_loading": _max_concurrent(starts, ends),
        "convoy": convoy,
    }


def compute_metrics(
    log: SimLog,
    pods: list[SimPod],
    arrival_s: list[float],
    *,
    sim: SimSettings,
    window: tuple[float, float] | None = None,
) -> Metrics:
    arrivals = np.asarray(arrival_s, dtype=float)
    first = float(arrivals[0]) if arrivals.size else 0.0
    last_end = max(log.end_s, default=0.0)
    lo, hi = window if window is not None else (-np.inf, np.inf)
    inside = (arrivals >= lo) & (arrivals <= hi)
    outcome = np.asarray(log.outcome, dtype=np.int8)[inside]
    ttft = np.asarray(log.ttft_ms, dtype=float)[inside]
    served = outcome != REJECTED
    count = int(served.sum())
    hits = outcome == GPU_HIT
    span_s = max(min(hi, last_end) - max(lo, first), 1e-9)
    ends = np.asarray(log.residency_end_s, dtype=float)
    residency = np.asarray(log.residency_s, dtype=float)[(ends >= lo) & (ends <= hi)]
    metrics: Metrics = {
        "requests": len(outcome),
        "served": count,
        "rejected": len(outcome) - count,
        "shed": int(inside[np.asarray(log.shed, dtype=np.int64)].sum()),
        "gpu_hit_rate": round(float(hits.sum()) / max(count, 1), 6),
        "cpu_hit_rate": round(float((outcome == CPU_HIT).sum()) / max(count, 1), 6),
        "cold_load_rate": round(float((outcome == COLD_LOAD).sum()) / max(count, 1), 6),
        "cold_loads_on_critical_path": int((outcome == COLD_LOAD).sum()),
    }
    metrics.update(_load_metrics(log, len(pods), span_s, sim, (lo, hi)))
    metrics["residency_p50_s"] = round(_pct(residency, 50), 3)
    metrics["residency_p95_s"] = round(_pct(residency, 95), 3)
    metrics.update(_ttft(ttft, served, "ttft"))
    metrics.update(_ttft(ttft, hits, "ttft_hit"))
    metrics.update(_ttft(ttft, served & ~hits, "ttft_miss"))
    metrics["throughput_rps"] = round(count / span_s, 6)
    metrics["distinct_adapters_per_pod"] = round(
        sum(len(pod.served) for pod in pods) / max(len(pods), 1), 3
    )
    metrics["plans"] = log.plans
    return metrics


def login_surges(
    events: Sequence[SimEvent], *, gap_s: float = SURGE_GAP_S, tail_s: float = SURGE_TAIL_S
) -> dict[str, list[tuple[float, float]]]:
    """Per tenant, its login surges as (start_s, end_s) in time order: its logins
    clustered where they are less than ``gap_s`` apart, each surge from its first login
    to ``tail_s`` after its last. A lone login is a surge of one."""
    logins: dict[str, list[float]] = {}
    for sim_event in events:
        event = sim_event.event
        if event.kind is EventKind.LOGIN and event.tenant:
            logins.setdefault(str(event.tenant), []).append(sim_event.at_s)
    surges: dict[str, list[tuple[float, float]]] = {}
    for tenant, times in sorted(logins.items()):
        times.sort()
        spans: list[tuple[float, float]] = []
        first = last = times[0]
        for at_s in times[1:]:
            if at_s - last >= gap_s:
                spans.append((first, last + tail_s))
                first = at_s
            last = at_s
        spans.append((first, last + tail_s))
        surges[tenant] = spans
    return surges


def _within(arrivals: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    """Which arrivals fall in one of ``spans`` (sorted, and disjoint or overlapping)."""
    starts = np.asarray([start for start, _ in spans], dtype=float)
    ends = np.maximum.accumulate(np.asarray([end for _, end in spans], dtype=float))
    k = np.searchsorted(starts, arrivals, side="right") - 1
    return (k >= 0) & (arrivals <= ends[np.maximum(k, 0)])


def surge_ttft_p95_ms(
    log: SimLog,
    workload: SimWorkload,
    events: Sequence[SimEvent],
    *,
    adapter_tenants: Mapping[str, str],
    window: tuple[float, float] | None = None,
) -> dict[str, float]:
    """Per tenant, the TTFT p95 of the served requests for its adapters (the catalog's
    ``tenant``) arriving during one of its login surges (``login_surges``) and in
    ``window``; a tenant none of whose requests is in a surge is left out."""
    lo, hi = window if window is not None else (-np.inf, np.inf)
    arrivals = np.asarray(workload.arrival_s, dtype=float)
    tenants = np.asarray([adapter_tenants.get(a, "") for a in workload.adapters], dtype=object)
    served = (np.asarray(log.outcome) != REJECTED) & (arrivals >= lo) & (arrivals <= hi)
    ttft = np.asarray(log.ttft_ms, dtype=float)
    figures: dict[str, float] = {}
    for tenant, spans in login_surges(events).items():
        chosen = served & (tenants == tenant) & _within(arrivals, spans)
        if chosen.any():
            figures[tenant] = round(_pct(ttft[chosen], 95), 3)
    return figures


def _first_requests(log: SimLog, workload: SimWorkload, delivered: set[str]) -> Metrics:
    """``count``, the first-request figures and the cold loads on the critical path of
    the requests the ``delivered`` events caused."""
    first: dict[str, int] = {}
    cold = 0
    for r, event_id in enumerate(workload.event_ids):
        if event_id is None or event_id not in delivered:
            continue
        first.setdefault(event_id, r)
        cold += int(log.outcome[r] == COLD_LOAD)
    chosen = [r for r in first.values() if log.outcome[r] != REJECTED]
    outcome = np.asarray([log.outcome[r] for r in chosen], dtype=np.int8)
    ttft = np.asarray([log.ttft_ms[r] for r in chosen], dtype=float)
    return {
        "count": len(delivered),
        "first_request_gpu_share": round(
            float((outcome == GPU_HIT).sum()) / max(len(chosen), 1), 6
        ),
        "first_request_ttft_p95_ms": round(_pct(ttft, 95), 3),
        "cold_loads_on_critical_path": cold,
    }


def event_metrics(
    log: SimLog,
    workload: SimWorkload,
    events: Sequence[SimEvent],
    *,
    window: tuple[float, float] | None = None,
) -> Metrics:
    """The per-event figures of one replay (see the module's docstring)."""
    lo, hi = window if window is not None else (-np.inf, np.inf)
    at_s = {sim_event.event.id: sim_event.at_s for sim_event in events}
    delivered = {k for k in log.events if lo <= at_s.get(k, lo) <= hi}
    figures = _first_requests(log, workload, delivered)
    used = [u for u, at in zip(log.preload_used, log.preload_at_s, strict=True) if lo <= at <= hi]
    figures["preloads"] = len(used)
    figures["preloads_unused_share"] = round(sum(1 for u in used if not u) / max(len(used), 1), 6)
    return figures


def event_metrics_by_kind(
    log: SimLog,
    workload: SimWorkload,
    events: Sequence[SimEvent],
    *,
    window: tuple[float, float] | None = None,
) -> dict[str, Metrics]:
    """``_first_requests``'s figures for each kind of event, both kinds always."""
    lo, hi = window if window is not None else (-np.inf, np.inf)
    kind_of = {e.event.id: e.event.kind for e in events if lo <= e.at_s <= hi}
    return {
        kind.value: _first_requests(
            log, workload, {k for k in log.events if kind_of.get(k) is kind}
        )
        for kind in (EventKind.PIPELINE, EventKind.LOGIN)
    }


def storage_read_bound(adapters: Sequence[str], places: int) -> int:
    """The fewest storage reads a policy that reads an adapter only when a request asks
    for it can make: Belady's misses (evict the adapter asked for again furthest in the
    future) over one cache of ``places`` adapters, the fleet's host places
    (``max_cpu_loras`` summed over its pods). Splitting the places among pods and an
    engine's LRU only add reads. Only a load ahead of need (a preload) does better on
    the critical path, and only by knowing which adapter comes next."""
    if places <= 0:
        return len(adapters)
    next_use = [0] * len(adapters)
    seen: dict[str, int] = {}
    for i in range(len(adapters) - 1, -1, -1):
        next_use[i] = seen.get(adapters[i], len(adapters))
        seen[adapters[i]] = i
    held: dict[str, int] = {}  # adapter -> its next use; the heap may hold stale entries
    heap: list[tuple[int, str]] = []
    reads = 0
    for i, adapter in enumerate(adapters):
        if adapter not in held:
            reads += 1
            while len(held) >= places:
                furthest, name = heapq.heappop(heap)
                if held.get(name) == -furthest:
                    del held[name]
        held[adapter] = next_use[i]
        heapq.heappush(heap, (-next_use[i], adapter))
    return reads


def after_pod_loss(
    log: SimLog, arrival_s: Sequence[float], steps: Sequence[FaultStep], *, after_s: float
) -> Metrics:
    """The requests arriving within ``after_s`` of a pod's loss (a restart, or an
    outage's start): ``requests``, ``served_share``, ``gpu_hit_rate`` and
    ``cold_loads_on_critical_path`` of the served ones, and their ``ttft_p95_ms``."""
    arrivals = np.asarray(arrival_s, dtype=float)
    lost = sorted(step.at_s for step in steps if step.kind in (RESTART, DOWN))
    inside = _within(arrivals, [(at_s, at_s + after_s) for at_s in lost]) if lost else arrivals < 0
    outcome = np.asarray(log.outcome, dtype=np.int8)[inside]
    served = outcome != REJECTED
    count = int(served.sum())
    return {
        "pod_losses": len(lost),
        "requests": len(outcome),
        "served_share": round(count / max(len(outcome), 1), 6),
        "gpu_hit_rate": round(float((outcome == GPU_HIT).sum()) / max(count, 1), 6),
        "cold_loads_on_critical_path": int((outcome == COLD_LOAD).sum()),
        "ttft_p95_ms": round(_pct(np.asarray(log.ttft_ms, dtype=float)[inside][served], 95), 3),
    }


def class_figures(
    log: SimLog,
    workload: SimWorkload,
    class_of: Mapping[str, str],
    *,
    window: tuple[float, float] | None = None,
) -> dict[str, Metrics]:
    """Per catalog ``class`` (``class_of``: adapter -> class; an adapter it lacks counts
    as production), the requests arriving in ``window``: ``requests``, ``served``,
    ``gpu_hit_rate`` and the TTFT percentiles of the served ones; the trade that
    ``RouterSettings.class_priority`` makes (production's hits for the lower classes')."""
    arrivals = np.asarray(workload.arrival_s, dtype=float)
    lo, hi = window if window is not None else (-np.inf, np.inf)
    inside = (arrivals >= lo) & (arrivals <= hi)
    outcome = np.asarray(log.outcome, dtype=np.int8)
    ttft = np.asarray(log.ttft_ms, dtype=float)
    names = np.asarray([class_of.get(name, "production") for name in workload.adapters])
    figures: dict[str, Metrics] = {}
    for name in sorted(set(names[inside].tolist())):
        chosen = inside & (names == name)
        served = chosen & (outcome != REJECTED)
        count = int(served.sum())
        hits = int((served & (outcome == GPU_HIT)).sum())
        figures[name] = {
            "requests": int(chosen.sum()),
            "served": count,
            "gpu_hit_rate": round(hits / max(count, 1), 6),
            **_ttft(ttft, served, "ttft"),
        }
    return figures
