"""Which adapters are worth pinning, on how many pods each, and what that costs the rest.

The practice (docs/background.md, "Pin your heavy hitters"): from the request logs,
sort adapters by requests and pin the top few production adapters. ``recommend_pins``
does that per pool from a request log of any length, and asks three things of a
candidate:

- **heavy**: at least ``min_share`` of the pool's requests;
- **steady**: it has traffic in at least ``min_active_share`` of the log's busy hours
  (hours with at least a tenth of the median hour's pool traffic), so a burst of one
  afternoon is not pinned for good;
- **production**: catalog ``class: production`` (batch jobs and experiments come and go).

Each pin's pods: ``pods_per_pin`` (one by default). A pin is a slot taken from the
pool's dynamic caching for good, and an adapter busy enough to need several pods is
kept on them by the routing and the LRU anyway: in the war story's Thursday cascade its
four busiest adapters, pinned on the pods their peak needs (16 of 32 slots), were
already on the GPU for 99.6% of their requests, and with the engine holding those pins
the rest fell from 87.5% to 69.6% GPU hits (``bench/capacity_pins.py``). With
``pods_per_pin`` None: enough pods to carry its peak hour at ``utilisation`` of a
pod's ``capacity_rps``, at least ``min_pods``, at most the pool's pods.

Pins stop at ``max_pins`` per pool, or when pinned slots would exceed
``max_slot_share`` of the pool's GPU slots: the rest of the traffic lives in what is
left.

Which pods: each pin, the heaviest first, goes to the pods holding the fewest pins so
far (then in the fleet's order), never more than ``max_loras - 1`` pins on one pod, so
every pod keeps a slot for the unpinned traffic (SGLang refuses more pinned adapters
than that). Naming the pods lets the plan and an engine's own pins (SGLang's
``pinned`` load, vLLM's engine-API ``pin_lora``) agree on where each pin lives.
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
    #: Pods each pin is held on (None: enough to carry its peak hour).
    pods_per_pin: int | None = 1
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
    #: The pods it is pinned on (``pods`` of them).
    pod_ids: tuple[str, ...] = ()


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
        pool_pods = [(str(pod.name), pod.max_loras - 1) for pod in pool.pods]
        pinned_on = dict.fromkeys((name for name, _ in pool_pods), 0)
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
            needed = math.ceil(peak_rps / capacity) if capacity > 0 else 1
            pods = min(
                len(pool.pods),
                rules.pods_per_pin
                if rules.pods_per_pin is not None
                else max(rules.min_pods, needed),
            )
            if used + pods > rules.max_slot_share * slots:
                passed[str(name)] = "the pool's pinned slots would pass their share"
                break
            chosen = _least_pinned(pool_pods, pinned_on, pods)
            if len(chosen) < pods:
                passed[str(name)] = "no pod left with a slot free of pins"
                break
            used += pods
            for pod_id in chosen:
                pinned_on[pod_id] += 1
            pins.append(
                Pin(
                    adapter=str(name),
                    pool=pool.name,
                    pods=pods,
                    share=share,
                    active_share=active,
                    peak_rps=peak_rps,
                    pod_ids=chosen,
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


def _least_pinned(
    pods: list[tuple[str, int]], pinned_on: Mapping[str, int], count: int
) -> tuple[str, ...]:
    """``count`` pods with the fewest pins (then in order) that can take one more."""
    open_pods = [(pinned_on[name], i, name) for i, (name, room) in enumerate(pods)
                 if pinned_on[name] < room]  # fmt: skip
    return tuple(name for _, _, name in sorted(open_pods)[:count])
