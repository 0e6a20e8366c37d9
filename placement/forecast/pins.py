"""Which adapters are worth pinning, on how many pods each, and what that costs the rest.

The practice (docs/background.md, "Pin your heavy hitters"): from the request logs,
sort adapters by requests and pin the top few production adapters across enough pods
to carry their peak. ``recommend_pins`` does that per pool from a request log of any
length, and asks three things of a candidate:

- **heavy**: at least ``min_share`` of the pool's requests;
- **steady**: it has traffic in at least ``min_active_share`` of the log's busy hours
  (hours with at least a tenth of the median hour's pool traffic), so a burst of one
  afternoon is not pinned for good;
- **production**: catalog ``class: production`` (batch jobs and experiments come and go).

Each pin's pods: enough to carry its peak hour at ``utilisation`` of a pod's
``capacity_rps``, at least ``min_pods`` (a pin on one pod is lost with it), at most the
pool's pods. Pins stop at ``max_pins`` per pool, or when pinned slots would exceed
``max_slot_share`` of the pool's GPU slots: the rest of the traffic lives in what is left.
Pure: counts in, recommendations out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from placement.domain import AdapterClass, AdapterId, Catalog, Fleet


@dataclass(frozen=True, kw_only=True)
class PinRules:
    max_pins: int = 10
    min_share: float = 0.01
    min_active_share: float = 0.9
    min_pods: int = 2
    utilisation: float = 0.8
    max_slot_share: float = 0.5


@dataclass(frozen=True, kw_only=True)
class Pin:
    adapter: str
    pool: str
    pods: int
    share: float
    active_share: float
    peak_rps: float


@dataclass(frozen=True, kw_only=True)
class PoolPins:
    pool: str
    pins: tuple[Pin, ...]
    #: The pool's requests the pins carry.
    pinned_share: float
    #: GPU slots the pins take, and the pool's.
    pinned_slots: int
    slots: int
    #: Adapters that were heavy but not pinned, with why.
    passed_over: Mapping[str, str]


def recommend_pins(
    counts: pd.DataFrame, catalog: Catalog, fleet: Fleet, rules: PinRules = PinRules()
) -> list[PoolPins]:
    """``counts``: requests per adapter per hour (``ts``, ``adapter``, ``requests``)."""
    adapters = catalog.by_name()
    pool_of = {
        str(adapter.name): pool.name
        for adapter in catalog.adapters
        for pool in fleet.pools
        if pool.base_model == adapter.base_model
    }
    result = []
    for pool in fleet.pools:
        mine = counts[counts["adapter"].astype(str).map(pool_of.get) == pool.name]
        slots = sum(pod.max_loras for pod in pool.pods)
        if mine.empty:
            result.append(
                PoolPins(
                    pool=pool.name,
                    pins=(),
                    pinned_share=0.0,
                    pinned_slots=0,
                    slots=slots,
                    passed_over={},
                )
            )
            continue
        hourly = mine.groupby("ts")["requests"].sum()
        busy_hours = hourly[hourly >= 0.1 * hourly.median()].index
        total = float(mine["requests"].sum())
        per_adapter = mine.groupby("adapter", observed=True)["requests"].sum()
        ranked = per_adapter.sort_values(ascending=False, kind="stable")
        capacity = min(pod.capacity_rps for pod in pool.pods) * rules.utilisation
        pins: list[Pin] = []
        passed: dict[str, str] = {}
        used = 0
        for name, requests in ranked.items():
            if len(pins) >= rules.max_pins:
                break
            share = float(requests) / total
            if share < rules.min_share:
                break
            adapter = adapters.get(AdapterId(str(name)))
            if adapter is None:
                continue
            rows = mine[mine["adapter"] == name]
            active = float(rows["ts"].isin(busy_hours).sum()) / max(1, len(busy_hours))
            peak_rps = float(rows["requests"].max()) / 3600.0
            if adapter.adapter_class is not AdapterClass.PRODUCTION:
                passed[str(name)] = f"class {adapter.adapter_class.value}"
                continue
            if active < rules.min_active_share:
                passed[str(name)] = f"active in {active:.0%} of busy hours"
                continue
            pods = min(
                len(pool.pods),
                max(rules.min_pods, math.ceil(peak_rps / capacity) if capacity > 0 else 1),
            )
            if used + pods > rules.max_slot_share * slots:
                passed[str(name)] = "the pool's pinned slots would pass their share"
                break
            used += pods
            pins.append(
                Pin(
                    adapter=str(name),
                    pool=pool.name,
                    pods=pods,
                    share=share,
                    active_share=active,
                    peak_rps=peak_rps,
                )
            )
        result.append(
            PoolPins(
                pool=pool.name,
                pins=tuple(pins),
                pinned_share=sum(pin.share for pin in pins),
                pinned_slots=used,
                slots=slots,
                passed_over=passed,
            )
        )
    return result
