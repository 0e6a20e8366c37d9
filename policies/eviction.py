"""Eviction: which adapter leaves a full cache (GPU slots or host RAM) for a new one.

Owns the victim choice of LRU, LFU, time-weighted LRU over a sliding window (10 minutes
by default), Chameleon's score (0.45 frequency + 0.10 recency + 0.45 size, lowest
evicted), a forecast-aware rule (forecast rate plus a fading session term) and Belady's
clairvoyant rule (evict the adapter needed furthest in the future).
Every policy is pinned-aware unless asked not to be: pinned adapters are never
chosen, and adapters in use (requests running) are chosen only when nothing else can
go, as Chameleon's reference counting does.

Pure: the caller keeps the entries and passes ``now_s``; nothing here stores state.
Must not import ``placement``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class EvictionPolicy(enum.StrEnum):
    LRU = "lru"
    LFU = "lfu"
    TIME_WEIGHTED_LRU = "tw-lru"
    CHAMELEON = "chameleon"
    FORECAST = "forecast"
    BELADY = "belady"


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheEntry:
    """One adapter held in a cache, with what the policies weigh."""

    adapter: str
    last_used_s: float
    uses: int = 0
    #: Times of recent uses (only the sliding window matters; older ones are ignored).
    recent_uses_s: Sequence[float] = ()
    size_bytes: int = 0
    pinned: bool = False
    in_use: bool = False
    #: FORECAST only: the adapter's forecast request rate on this fleet (req/s).
    forecast_rps: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class EvictionSettings:
    #: Frequency counts only requests of the last 10 minutes, so old counts fade.
    window_s: float = 600.0
    frequency_weight: float = 1.0
    recency_weight: float = 1.0
    #: Chameleon's weights from offline profiling (research-anchors.md).
    chameleon_frequency: float = 0.45
    chameleon_recency: float = 0.10
    chameleon_size: float = 0.45
    pinned_aware: bool = True
    #: FORECAST: a request is followed by another of its session with this chance,
    #: after a gap of about ``session_gap_s`` (the synthetic logs' sessions: 3 requests,
    #: 15 s apart).
    session_continue: float = 0.67
    session_gap_s: float = 15.0


@dataclass(frozen=True, kw_only=True, slots=True)
class EvictionContext:
    """The cache's entries and what the chosen policy needs to rank them."""

    entries: Sequence[CacheEntry]
    now_s: float
    policy: EvictionPolicy = EvictionPolicy.LRU
    settings: EvictionSettings = field(default_factory=EvictionSettings)
    #: Belady only: the time each adapter is next requested (absent = never).
    next_use_s: Mapping[str, float] = field(default_factory=dict)


def window_uses(entry: CacheEntry, *, now_s: float, window_s: float) -> int:
    since = now_s - window_s
    return sum(1 for moment in entry.recent_uses_s if since <= moment <= now_s)


def time_weighted_score(entry: CacheEntry, *, now_s: float, settings: EvictionSettings) -> float:
    """The retention score: frequency in the window plus inverse idle time."""
    idle_s = max(now_s - entry.last_used_s, 1e-3)
    frequency = window_uses(entry, now_s=now_s, window_s=settings.window_s)
    return settings.frequency_weight * frequency + settings.recency_weight / idle_s


def chameleon_scores(
    entries: Sequence[CacheEntry], *, now_s: float, settings: EvictionSettings
) -> list[float]:
    """F·frequency + R·recency + S·size, each normalised to [0, 1] over the entries.

    Frequency is uses in the window; recency is 1 for the most recent use and 0 for
    the oldest; size favours keeping large adapters, which cost most to bring back.
    """
    freqs = [window_uses(e, now_s=now_s, window_s=settings.window_s) for e in entries]
    ages = [max(now_s - e.last_used_s, 0.0) for e in entries]
    max_freq = max(freqs, default=0) or 1
    max_age = max(ages, default=0.0) or 1.0
    max_size = max((e.size_bytes for e in entries), default=0) or 1
    return [
        settings.chameleon_frequency * freq / max_freq
        + settings.chameleon_recency * (1.0 - age / max_age)
        + settings.chameleon_size * entry.size_bytes / max_size
        for entry, freq, age in zip(entries, freqs, ages, strict=True)
    ]


def forecast_retention(entry: CacheEntry, *, now_s: float, settings: EvictionSettings) -> float:
    """Expected requests per second soon: the forecast rate plus the chance that the
    current session goes on, fading as the adapter stays idle (a learned stand-in for
    Belady's next use: a finished session's adapter goes first, a popular one stays)."""
    idle_s = max(now_s - entry.last_used_s, 0.0)
    session = settings.session_continue * math.exp(-idle_s / settings.session_gap_s)
    return entry.forecast_rps + session / settings.session_gap_s


def _retention(ctx: EvictionContext, candidates: Sequence[CacheEntry]) -> list[float]:
    """Higher means keep. The victim is the lowest."""
    policy, now_s, settings = ctx.policy, ctx.now_s, ctx.settings
    if policy is EvictionPolicy.LRU:
        return [entry.last_used_s for entry in candidates]
    if policy is EvictionPolicy.LFU:
        # Ties in frequency go to recency, so a fresh entry is not always the victim.
        return [entry.uses + entry.last_used_s * 1e-12 for entry in candidates]
    if policy is EvictionPolicy.TIME_WEIGHTED_LRU:
        return [time_weighted_score(entry, now_s=now_s, settings=settings) for entry in candidates]
    if policy is EvictionPolicy.CHAMELEON:
        return chameleon_scores(candidates, now_s=now_s, settings=settings)
    if policy is EvictionPolicy.FORECAST:
        return [forecast_retention(entry, now_s=now_s, settings=settings) for entry in candidates]
    # Belady: the further the next use, the lower the retention.
    return [-ctx.next_use_s.get(entry.adapter, math.inf) for entry in candidates]


def evictable(ctx: EvictionContext) -> list[CacheEntry]:
    """Entries the policy may evict: never pinned ones; in-use ones only as a last resort."""
    entries = list(ctx.entries)
    if ctx.settings.pinned_aware:
        entries = [entry for entry in entries if not entry.pinned]
    idle = [entry for entry in entries if not entry.in_use]
    return idle or entries


def choose_victim(ctx: EvictionContext) -> str | None:
    """The adapter to evict, or ``None`` when every entry is pinned (or there are none).

    Ties go to the entry listed first, so callers list entries oldest first.
    """
    candidates = evictable(ctx)
    if not candidates:
        return None
    scores = _retention(ctx, candidates)
    lowest = min(range(len(candidates)), key=scores.__getitem__)
    return candidates[lowest].adapter


def replay_cache(
    trace: Sequence[str],
    *,
    capacity: int,
    policy: EvictionPolicy,
    settings: EvictionSettings | None = None,
    sizes: Mapping[str, int] | None = None,
    pinned: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Misses per adapter of one cache of ``capacity`` slots serving ``trace``.

    One use per step, time = step index. A reference model for tests and for comparing
    policies on small traces (Belady's lookahead is quadratic); the simulator keeps its
    own caches for speed.
    """
    chosen_settings = settings or EvictionSettings()
    entries: dict[str, CacheEntry] = {}
    uses: dict[str, list[float]] = {}
    next_use = _next_uses(trace)
    misses: dict[str, int] = {}
    for step, adapter in enumerate(trace):
        now_s = float(step)
        if adapter not in entries:
            misses[adapter] = misses.get(adapter, 0) + 1
            if len(entries) >= capacity:
                ctx = EvictionContext(
                    entries=list(entries.values()),
                    now_s=now_s,
                    policy=policy,
                    settings=chosen_settings,
                    next_use_s={name: next_use[step].get(name, math.inf) for name in entries},
                )
                victim = choose_victim(ctx)
                if victim is None:
                    continue  # everything pinned: serve without caching
                del entries[victim]
        uses.setdefault(adapter, []).append(now_s)
        entries[adapter] = CacheEntry(
            adapter=adapter,
            last_used_s=now_s,
            uses=len(uses[adapter]),
            recent_uses_s=tuple(uses[adapter]),
            size_bytes=(sizes or {}).get(adapter, 0),
            pinned=adapter in pinned,
        )
    return misses


def _next_uses(trace: Sequence[str]) -> list[dict[str, float]]:
    """For each step, the next step (after it) at which each adapter is used."""
    result: list[dict[str, float]] = [{} for _ in trace]
    upcoming: dict[str, float] = {}
    for step in range(len(trace) - 1, -1, -1):
        result[step] = dict(upcoming)
        upcoming[trace[step]] = float(step)
    return result
