"""What a load's victim is worth, and the warm-ups that keep the classes apart.

A vLLM pod evicts the least recently used adapter and cannot be told which
(``pin_lora`` is not over HTTP: POD-API.md), so lorafleet works around the victim in
two ways. It chooses the pod: a load pays what the victim it pushes out is worth
(``victim_worth_s``). And it reorders a pod's LRU: a warm-up (a short real request)
refreshes an adapter's place, so before a load lands on a full pod whose victim is of a
higher class than an adapter idle beside it, the higher-class ones are warmed up, in
their LRU order, and the lowest class is evicted instead (``class_refresh``).

Owns: the engine's next victim as a router reads it (``lru_victim``), the warm-ups
that put the lowest class resident on the victim's place, the victim a load would evict
after them (``victim_after``), and its worth. Pure: no IO, no clock. Must not import
``placement``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.route_context import PodLike, RoutingContext, VictimWorth


def lru_victim(pod: PodLike) -> str | None:
    """The adapter the engine's LRU evicts next on ``pod``: the least recently used
    with no request running or queued, else the least recently used."""
    first: str | None = None
    for name in pod.gpu_adapters:
        if name not in pod.running_adapters and name not in pod.waiting_adapters:
            return name
        if first is None:
            first = name
    return first


def idle_adapters(pod: PodLike) -> list[str]:
    """The adapters on ``pod``'s GPU with no request running or queued, LRU first:
    those the engine may evict."""
    running, waiting = pod.running_adapters, pod.waiting_adapters
    return [name for name in pod.gpu_adapters if name not in running and name not in waiting]


def class_refresh(pod: PodLike, victims: VictimWorth | None) -> tuple[str, ...]:
    """The warm-ups to send to a full ``pod`` before a load, in order, so that the
    engine's LRU victim is of the lowest class idle there: every idle adapter of a
    higher class that is less recently used than the first one of that lowest class.
    Empty with a free slot, without classes, or when the victim is of the lowest class
    already (or is no adapter at all: a vLLM ghost slot, by ``victim_of``)."""
    if victims is None or not victims.class_weight or pod.free_slots > 0:
        return ()
    if victims.victim_of is not None and victims.victim_of(pod) is None:
        return ()
    idle = idle_adapters(pod)
    if len(idle) < 2:
        return ()
    weight = victims.weight
    lowest = min(weight(name) for name in idle)
    refresh: list[str] = []
    for name in idle:
        if weight(name) <= lowest:
            break
        refresh.append(name)
    return tuple(refresh)


def victim_after(pod: PodLike, victims: VictimWorth, refresh: Sequence[str]) -> str | None:
    """The adapter a load on full ``pod`` evicts once ``refresh`` is warmed up."""
    if refresh:
        warmed = frozenset(refresh)
        return next((name for name in idle_adapters(pod) if name not in warmed), None)
    return lru_victim(pod) if victims.victim_of is None else victims.victim_of(pod)


def victim_worth_s(pod: PodLike, ctx: RoutingContext, *, refresh: Sequence[str] = ()) -> float:
    """What evicting ``pod``'s next victim (after ``refresh``) is expected to cost: the
    chance that it is asked for there within ``victim_horizon_s``, times a reload from
    host RAM (its load penalty), times its class weight. 0 with a free slot.

    The chance is that of a Poisson stream at the rate the victim's idle time on this
    pod implies (one request per idle time since its last use there, the engine LRU's
    own evidence, priced rather than only ordered), when the caller's clock gives it
    (``now_s`` after ``victim_last_used_s``); otherwise, and for a victim a warm-up
    uncovers, its forecast rate (``VictimWorth.rate``) shared among the pods holding
    it. The forecast is not the first choice because it measured worse where traffic
    comes in sessions: on legal-research (seed 1, greedy planner) the forecast's rate
    gave 8,164 loads, the idle rate with the forecast as a floor 7,746, the idle rate
    alone 7,214, bounded affinity 7,296; on the war story (Thursday 09:00-13:00) 23,324,
    23,285 and bounded 23,533. An adapter's LRU copy on one pod is the copy its traffic
    does not reach, so its fleet rate overstates what losing that copy costs. Where
    arrivals are Poisson the forecast did better (ServeGen m-mid: 34,882 loads with the
    idle rate, bounded 37,923; docs/benchmarks.md has 29,354 with the forecast).
    """
    victims = ctx.victims
    if victims is None or pod.free_slots > 0:
        return 0.0
    victim = victim_after(pod, victims, refresh)
    if victim is None:
        return 0.0
    idle_s = ctx.now_s - pod.victim_last_used_s
    if idle_s > 0.0 and not refresh:
        rate = 1.0 / idle_s
    else:
        copies = sum(1 for other in ctx.pods if victim in other.gpu_adapters)
        rate = victims.rate(victim) / max(1, copies)
    if rate <= 0.0:
        return 0.0
    reuse = -math.expm1(-rate * victims.victim_horizon_s)
    return reuse * ctx.warm_load_s * ctx.load_penalty_factor * victims.weight(victim)
