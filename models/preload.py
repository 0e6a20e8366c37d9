"""The preload schedule: when each adapter must start loading to be hot for its rise.

An adapter rises into the hot tier at the first bucket where its forecast crosses
the hot threshold (mean requests per bucket, or the chance of any request); it
leaves again only once it falls below a lower threshold, so that a wobble around
the line does not schedule a load every bucket. Each rise is moved earlier by the
adapter's lead time, which covers its load (start loading at 8:45 for a 9:00
peak). A rise too close to the origin to honour the lead is scheduled at
the origin and says it is late.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from models.base import PanelForecast


@dataclass(frozen=True, kw_only=True)
class HotRule:
    """Hot when the mean reaches ``mean_per_bucket`` or P(any request) reaches ``p_nonzero``."""

    mean_per_bucket: float = 1.0
    p_nonzero: float = 0.5
    #: Leave hot only below this share of both thresholds (hysteresis).
    exit_share: float = 0.8


@dataclass(frozen=True, kw_only=True)
class PreloadItem:
    adapter: str
    #: When to start loading (seconds since the epoch, UTC).
    load_at_s: int
    #: The start of the bucket where the adapter turns hot.
    needed_at_s: int
    expected_requests: float
    p_nonzero: float
    reason: str


def hot_flags(forecast: PanelForecast, rule: HotRule) -> np.ndarray:
    """Boolean ``(step, adapter)``: hot in that bucket, with hysteresis on the way down."""
    enter = (forecast.mean >= rule.mean_per_bucket) | (forecast.p_nonzero >= rule.p_nonzero)
    stay = (forecast.mean >= rule.exit_share * rule.mean_per_bucket) | (
        forecast.p_nonzero >= rule.exit_share * rule.p_nonzero
    )
    hot = np.zeros_like(enter)
    state = np.zeros(enter.shape[1], dtype=bool)
    for step in range(enter.shape[0]):
        state = np.where(state, stay[step], enter[step])
        hot[step] = state
    return hot


def preload_schedule(
    forecast: PanelForecast,
    *,
    lead_s: int | Mapping[str, int],
    rule: HotRule | None = None,
    hot_now: frozenset[str] = frozenset(),
) -> tuple[PreloadItem, ...]:
    """Every rise into the hot tier within the horizon, with its load time; sorted by time.

    ``hot_now`` names adapters already hot at the origin: they have no rise at step 0.
    """
    hot = hot_flags(forecast, rule or HotRule())
    before = np.array([name in hot_now for name in forecast.adapters], dtype=bool)
    previous = np.vstack([before[None, :], hot[:-1]])
    rises = np.argwhere(hot & ~previous)
    items = [_item(forecast, int(step), int(column), lead_s) for step, column in rises]
    return tuple(sorted(items, key=lambda item: (item.load_at_s, item.adapter)))


def _item(
    forecast: PanelForecast, step: int, column: int, lead_s: int | Mapping[str, int]
) -> PreloadItem:
    adapter = forecast.adapters[column]
    lead = lead_s if isinstance(lead_s, int) else int(lead_s.get(adapter, 900))
    needed_at = forecast.origin_s + step * forecast.bucket_s
    load_at = max(forecast.origin_s, needed_at - lead)
    mean = float(forecast.mean[step, column])
    p_nonzero = float(forecast.p_nonzero[step, column])
    late = (
        " (late: less than the lead time is left)" if needed_at - lead < forecast.origin_s else ""
    )
    return PreloadItem(
        adapter=adapter,
        load_at_s=load_at,
        needed_at_s=needed_at,
        expected_requests=mean,
        p_nonzero=p_nonzero,
        reason=(
            f"forecast rises to {mean:.1f} requests per {forecast.bucket_s // 60} min "
            f"(P(any) {p_nonzero:.0%}); load {lead // 60} min ahead{late}"
        ),
    )
