"""Event models: what a request or a tenant login makes likely in the next minutes.

Learned from a per-request log (``ts``, ``adapter``, ``tenant``):

- transitions: for one tenant, P(adapter b is requested within ``window_s`` after a
  request for a) and the delay to b's first request, next to the chance of that by
  coincidence (b's own rate); declared pipeline steps are merged in as a prior;
- logins: a tenant's session starts at its first request after ``idle_s`` of
  silence; for each of its adapters, P(requested within ``window_s`` of the start)
  and the lead time from the start to that first request.

These feed near-term preloads (:func:`preloads_after_request`,
:func:`preloads_after_login`), not the daily curve.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from models.series import FloatArray, epoch_seconds, to_utc


@dataclass(frozen=True, kw_only=True)
class Transition:
    tenant: str
    source: str
    target: str
    probability: float
    #: Source requests the probability was learned from (0 for a declared step only).
    support: int
    delay_median_s: float
    delay_p10_s: float
    #: P(target within the window after a random moment): the chance by coincidence.
    baseline_probability: float = 0.0
    declared: bool = False


@dataclass(frozen=True, kw_only=True)
class LoginAffinity:
    tenant: str
    adapter: str
    probability: float
    support: int
    lead_median_s: float
    lead_p10_s: float


@dataclass(frozen=True, kw_only=True)
class EventPreload:
    """Load ``adapter`` by ``due_s``: a request for it is likely soon after an event."""

    adapter: str
    due_s: float
    probability: float
    reason: str


def _times_by_tenant(frame: pd.DataFrame) -> dict[str, dict[str, FloatArray]]:
    """Sorted request times (seconds) per tenant and adapter; no tenant means its own."""
    ts_s = epoch_seconds(to_utc(frame["ts"], []))
    tenants = (
        frame["tenant"].fillna("").astype(str)
        if "tenant" in frame
        else pd.Series([""] * len(frame))
    )
    adapters = frame["adapter"].astype(str).to_numpy()
    table = pd.DataFrame({"t": ts_s, "tenant": tenants.to_numpy(), "adapter": adapters})
    out: dict[str, dict[str, FloatArray]] = {}
    for (tenant, adapter), group in table.groupby(["tenant", "adapter"], sort=True):
        out.setdefault(str(tenant), {})[str(adapter)] = np.sort(
            group["t"].to_numpy(dtype=np.float64)
        )
    return out


def _next_delays(
    sources: FloatArray, targets: FloatArray, *, side: Literal["left", "right"] = "right"
) -> FloatArray:
    """For each source time, the delay to the first target strictly after it (``side``
    "left": at or after it); inf if none."""
    if not len(targets):
        return np.full(len(sources), np.inf)
    index = np.searchsorted(targets, sources, side=side)
    found = index < len(targets)
    delays = np.full(len(sources), np.inf)
    delays[found] = targets[index[found]] - sources[found]
    return delays


def learn_transitions(
    frame: pd.DataFrame,
    *,
    window_s: float = 120.0,
    min_support: int = 5,
    min_probability: float = 0.05,
) -> tuple[Transition, ...]:
    """Transitions a→b within each tenant seen at least ``min_support`` times as a source."""
    found: list[Transition] = []
    for tenant, by_adapter in _times_by_tenant(frame).items():
        span_s = _span_s(by_adapter.values())
        for source, source_times in by_adapter.items():
            if len(source_times) < min_support:
                continue
            for target, target_times in by_adapter.items():
                if target == source:
                    continue
                delays = _next_delays(source_times, target_times)
                hits = delays[delays <= window_s]
                probability = len(hits) / len(source_times)
                if probability < min_probability:
                    continue
                found.append(
                    Transition(
                        tenant=tenant,
                        source=source,
                        target=target,
                        probability=probability,
                        support=len(source_times),
                        delay_median_s=float(np.median(hits)),
                        delay_p10_s=float(np.quantile(hits, 0.1)),
                        baseline_probability=_coincidence(len(target_times), span_s, window_s),
                    )
                )
    return tuple(found)


def _span_s(times: Iterable[FloatArray]) -> float:
    arrays = [t for t in times if len(t)]
    if not arrays:
        return 0.0
    return float(max(t[-1] for t in arrays) - min(t[0] for t in arrays))


def _coincidence(n_target: int, span_s: float, window_s: float) -> float:
    if span_s <= 0:
        return 1.0
    return float(1.0 - np.exp(-n_target / span_s * window_s))


def merge_declared(
    learned: Sequence[Transition], declared: Sequence[Transition], *, prior_weight: float = 10.0
) -> tuple[Transition, ...]:
    """Declared steps (pipelines.yaml) as a prior worth ``prior_weight`` observations.

    A learned pair with much support moves the declared probability towards what the
    log shows; a declared pair the log never showed keeps its declared value, shrunk
    by any contrary evidence; learned pairs nobody declared pass through.
    """
    by_key = {(t.tenant, t.source, t.target): t for t in learned}
    merged = dict(by_key)
    for step in declared:
        key = (step.tenant, step.source, step.target)
        seen = by_key.get(key)
        if seen is None:
            merged[key] = step
            continue
        hits = seen.probability * seen.support
        probability = (step.probability * prior_weight + hits) / (prior_weight + seen.support)
        merged[key] = Transition(
            tenant=step.tenant,
            source=step.source,
            target=step.target,
            probability=probability,
            support=seen.support,
            delay_median_s=seen.delay_median_s,
            delay_p10_s=seen.delay_p10_s,
            baseline_probability=seen.baseline_probability,
            declared=True,
        )
    return tuple(sorted(merged.values(), key=lambda t: (t.tenant, t.source, -t.probability)))


def learn_logins(
    frame: pd.DataFrame,
    *,
    idle_s: float = 1800.0,
    window_s: float = 1800.0,
    min_sessions: int = 3,
    min_probability: float = 0.1,
) -> tuple[LoginAffinity, ...]:
    """Per tenant, the adapters its sessions reach and how long after the session starts."""
    found: list[LoginAffinity] = []
    for tenant, by_adapter in _times_by_tenant(frame).items():
        if not tenant:
            continue  # without a tenant column there are no logins to learn
        starts = session_starts(np.sort(np.concatenate(list(by_adapter.values()))), idle_s=idle_s)
        if len(starts) < min_sessions:
            continue
        for adapter, times in by_adapter.items():
            # The first request of a session counts as reached at lead 0 (side="left").
            leads = _next_delays(starts, times, side="left")
            hits = leads[leads <= window_s]
            probability = len(hits) / len(starts)
            if probability >= min_probability:
                found.append(
                    LoginAffinity(
                        tenant=tenant,
                        adapter=adapter,
                        probability=probability,
                        support=len(starts),
                        lead_median_s=float(np.median(hits)),
                        lead_p10_s=float(np.quantile(hits, 0.1)),
                    )
                )
    return tuple(found)


def session_starts(times_s: FloatArray, *, idle_s: float) -> FloatArray:
    """The first request time of each run of requests with gaps shorter than ``idle_s``."""
    if not len(times_s):
        return times_s
    gaps = np.diff(times_s, prepend=-np.inf)
    return times_s[gaps >= idle_s]


def preloads_after_request(
    transitions: Sequence[Transition],
    *,
    tenant: str,
    adapter: str,
    at_s: float,
    min_probability: float = 0.3,
    min_lift: float = 1.5,
) -> tuple[EventPreload, ...]:
    """What to load after a request for ``adapter``: likely followers, due before they come."""
    out = [
        EventPreload(
            adapter=t.target,
            due_s=at_s + t.delay_p10_s,
            probability=t.probability,
            reason=(
                f"{t.probability:.0%} of {t.source} requests of {t.tenant or 'this tenant'} are "
                f"followed by {t.target} (median {t.delay_median_s:.0f} s later)"
            ),
        )
        for t in transitions
        if t.tenant == tenant
        and t.source == adapter
        and t.probability >= min_probability
        and t.probability >= min_lift * t.baseline_probability
    ]
    return _soonest_first(out)


def preloads_after_login(
    logins: Sequence[LoginAffinity], *, tenant: str, at_s: float, min_probability: float = 0.3
) -> tuple[EventPreload, ...]:
    """What to load when ``tenant`` logs in: its usual adapters, due by their usual lead."""
    out = [
        EventPreload(
            adapter=login.adapter,
            due_s=at_s + login.lead_p10_s,
            probability=login.probability,
            reason=(
                f"{login.probability:.0%} of {tenant}'s sessions use {login.adapter} "
                f"(median {login.lead_median_s:.0f} s after login)"
            ),
        )
        for login in logins
        if login.tenant == tenant and login.probability >= min_probability
    ]
    return _soonest_first(out)


def _soonest_first(preloads: list[EventPreload]) -> tuple[EventPreload, ...]:
    """Preloads by due time; of those due at once, the likelier first."""
    return tuple(sorted(preloads, key=lambda p: (p.due_s, -p.probability)))
