"""What the demo reports for one policy, measured from the pods and the router's log.

Owns the figures: GPU hits and TTFT from the router's request log (only the rows of the
measured window, after the warm-up), GPU loads, evictions and residencies from the
pods' own counters (``/admin/stats``, read when the window opens and when the traffic
ends), the controller's own actions in the window from its ``/metrics`` (read likewise),
how late the client sent its requests (whether this machine kept up), and, for the
requests that follow a pipeline step or a login, whether the first request of each
adapter after the event found it on a GPU. Never the simulator's figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from placement.demo.traffic import EventResult, Shot, ShotResult


@dataclass(frozen=True, kw_only=True)
class PodCounts:
    """What one emulated pod reports in /admin/stats that the demo measures."""

    activations: int
    evictions: int
    residency_ended_s: tuple[float, ...]
    residency_ongoing_s: tuple[float, ...]

    @classmethod
    def from_stats(cls, stats: dict[str, object]) -> PodCounts:
        counters = stats["counters"]
        residency = stats["residency_s"]
        assert isinstance(counters, dict) and isinstance(residency, dict)
        return cls(
            activations=int(counters.get("gpu_activations", 0)),
            evictions=int(counters.get("gpu_evictions", 0)),
            residency_ended_s=tuple(residency["ended"]),
            residency_ongoing_s=tuple(residency["ongoing"]),
        )


@dataclass(frozen=True, kw_only=True)
class EventFigures:
    """The events of the window: delivered to the webhook and what came of them."""

    #: Events sent, and those the webhook accepted (202, or 200 for a repeat).
    delivered: int = 0
    accepted: int = 0
    #: Preloads the controller decided for them (pod and adapter).
    preloads: int = 0
    #: First requests of an adapter after its event, and those that found it on a GPU.
    first_requests: int = 0
    first_hits: int = 0

    @property
    def first_hit_rate(self) -> float:
        return self.first_hits / self.first_requests if self.first_requests else 0.0


@dataclass(frozen=True, kw_only=True)
class PolicyResult:
    policy: str
    requests: int
    errors: int
    gpu_hit_rate: float
    activations: int
    evictions: int
    #: GPU activations per pod per second of the measured window (wall clock).
    loads_per_pod_s: float
    #: How long adapters stayed on a GPU slot, in wall seconds.
    residency_p50_s: float
    residency_p95_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    #: How late the client sent the window's requests against their schedule (p95).
    late_p95_ms: float = 0.0
    events: EventFigures = EventFigures()
    #: Requests sent in all (warm-up included), and rows the router logged for them.
    sent: int = 0
    logged: int = 0
    #: Requests the client got no answer to (a timeout, a connection refused or
    #: reset), by the client's error: they may be missing from the router's log.
    unanswered: tuple[tuple[str, int], ...] = ()
    #: What the controller ran on the pods in the window, by kind (load, unload,
    #: warmup); none without a controller. Its loads and warm-ups are among the pods'
    #: GPU loads and evictions.
    controller_actions: tuple[tuple[str, int], ...] = ()

    def unanswered_line(self) -> str | None:
        """What the client got no answer to, for people; None when it had every one."""
        if not self.unanswered:
            return None
        count = sum(n for _, n in self.unanswered)
        kinds = ", ".join(f"{error or 'unknown'} {n:,}" for error, n in self.unanswered)
        return (
            f"{self.policy}: {count:,} of {self.sent:,} requests got no answer ({kinds}); "
            f"the router logged {self.logged:,} of the {self.sent:,}"
        )

    def controller_ran(self, kind: str) -> int:
        return dict(self.controller_actions).get(kind, 0)


def controller_actions(metrics_text: str) -> Counter[str]:
    """The actions a controller's ``/metrics`` says it ran to the end, by kind."""
    ran: Counter[str] = Counter()
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "lorafleet_controller_actions":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("result") == "ok":
                ran[sample.labels["kind"]] += int(sample.value)
    return ran


def actions_between(
    before: Mapping[str, int], after: Mapping[str, int]
) -> tuple[tuple[str, int], ...]:
    """The actions run between two reads of the controller's counters, by kind."""
    return tuple(sorted((kind, after[kind] - before.get(kind, 0)) for kind in after))


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _residencies(before: Sequence[PodCounts], after: Sequence[PodCounts]) -> list[float]:
    """Stays that ended in the window, and those still going at its end."""
    stays: list[float] = []
    for old, new in zip(before, after, strict=True):
        stays += list(new.residency_ended_s[len(old.residency_ended_s) :])
        stays += list(new.residency_ongoing_s)
    return stays


def first_after_events(
    log: pd.DataFrame, shots: Sequence[Shot], *, start: datetime, speed: float
) -> tuple[int, int]:
    """Of the first request of each (event, adapter) in ``shots``, how many the router
    logged as a GPU hit: the log's earliest row of that adapter and tenant that arrived
    no earlier than the request's schedule (the router's clock is the demo's)."""
    firsts: dict[tuple[str, str], Shot] = {}
    for shot in shots:
        if shot.event_id:
            firsts.setdefault((shot.event_id, shot.adapter), shot)
    if not firsts or log.empty:
        return 0, 0
    origin = pd.Timestamp(start)
    rows = log.assign(offset_s=(log["ts"] - origin).dt.total_seconds() / speed).sort_values("ts")
    by_key = {key: group for key, group in rows.groupby(["adapter", "tenant"], observed=True)}
    found = hits = 0
    for shot in firsts.values():
        group = by_key.get((shot.adapter, shot.tenant))
        if group is None:
            continue
        # The router stamps arrival a little after the client's schedule, never before it
        # (a 50 ms allowance for the two clocks' reads).
        later = group[group["offset_s"] >= shot.at_s - 0.05]
        if later.empty:
            continue
        found += 1
        hits += int(later["outcome"].iloc[0] == "gpu_hit")
    return found, hits


def event_figures(
    answers: Sequence[EventResult],
    log: pd.DataFrame,
    shots: Sequence[Shot],
    *,
    start: datetime,
    speed: float,
) -> EventFigures:
    """The window's events: what the webhook answered, and their first requests' hits."""
    found, hits = first_after_events(log, shots, start=start, speed=speed)
    return EventFigures(
        delivered=len(answers),
        accepted=sum(a.status in (200, 202) for a in answers),
        preloads=sum(len(a.preloads) for a in answers),
        first_requests=found,
        first_hits=hits,
    )


def measure(
    policy: str,
    *,
    log: pd.DataFrame,
    served_model: str,
    measured_from: datetime,
    window_s: float,
    before: Sequence[PodCounts],
    after: Sequence[PodCounts],
    results: Sequence[ShotResult],
    events: EventFigures,
    controller: tuple[tuple[str, int], ...] = (),
) -> PolicyResult:
    """One policy's figures over the measured window (``window_s`` wall seconds)."""
    measured = log[(log["adapter"] != served_model) & (log["ts"] >= pd.Timestamp(measured_from))]
    outcomes = measured["outcome"].dropna()
    outcomes = outcomes[outcomes != ""]
    status = pd.to_numeric(
        measured.get("status", pd.Series(200, index=measured.index)), errors="coerce"
    )
    ttft = list(pd.to_numeric(measured["ttft_ms"], errors="coerce").dropna())
    activations = sum(a.activations - b.activations for a, b in zip(after, before, strict=True))
    stays = _residencies(before, after)
    return PolicyResult(
        policy=policy,
        requests=len(measured),
        errors=int((status >= 400).sum()),
        gpu_hit_rate=float((outcomes == "gpu_hit").mean()) if len(outcomes) else 0.0,
        activations=activations,
        evictions=sum(a.evictions - b.evictions for a, b in zip(after, before, strict=True)),
        loads_per_pod_s=activations / max(len(after), 1) / max(window_s, 1.0),
        residency_p50_s=_percentile(stays, 50),
        residency_p95_s=_percentile(stays, 95),
        ttft_p50_ms=_percentile(ttft, 50),
        ttft_p95_ms=_percentile(ttft, 95),
        late_p95_ms=_percentile([r.late_ms for r in results], 95),
        events=events,
        sent=len(results),
        logged=len(log),
        unanswered=tuple(sorted(Counter(r.error for r in results if not r.ok).items())),
        controller_actions=controller,
    )
