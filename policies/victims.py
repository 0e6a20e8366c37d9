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
from collections.abc import Callable, Sequence

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


#: How many inter-arrival times the forecast counts for in a victim's rate: its weight
#: against the victim's idle time on its pod (``victim_worth_s``).
PRIOR_GAPS = 1.0


def victim_worth_s(pod: PodLike, ctx: RoutingContext, *, refresh: Sequence[str] = ()) -> float:
    """What evicting ``pod``'s next victim (after ``refresh``) is expected to cost: the
    chance that it is asked for there within ``victim_horizon_s``, times a reload from
    host RAM (its load penalty), times its class weight. 0 with a free slot, or for a
    victim without a forecast.

    The chance treats the victim's requests on this pod as a Poisson stream whose rate
    is uncertain: a Gamma prior worth ``PRIOR_GAPS`` inter-arrival times at its forecast
    rate (``VictimWorth.rate``, shared among the pods holding it), updated by the time
    it has now idled there (``now_s - victim_last_used_s``, none without the caller's
    clock). With prior shape a and rate b (a / share) and idle time t, the chance of a
    request within horizon H is 1 - ((b + t) / (b + t + H)) ** a: the forecast while
    the victim was used a moment ago, fading as it idles (a session's adapter is asked
    for again soon after a use and seldom after a pause, which its mean rate cannot
    say). Measured (greedy planner): legal-research 7,241 loads (the forecast alone
    8,164, the idle time alone 7,214, bounded affinity 7,296); war story Thursday
    09:00-13:00 21,144 (22,555, 23,285; bounded 23,533).
    """
    victims = ctx.victims
    if victims is None or pod.free_slots > 0:
        return 0.0
    victim = victim_after(pod, victims, refresh)
    if victim is None:
        return 0.0
    idle_s = 0.0 if refresh else max(0.0, ctx.now_s - pod.victim_last_used_s)
    return adapter_worth_s(victim, idle_s, ctx, victims)


def adapter_worth_s(
    adapter: str, idle_s: float, ctx: RoutingContext, victims: VictimWorth
) -> float:
    """What evicting ``adapter`` after it has idled ``idle_s`` on its pod is expected to
    cost (``victim_worth_s``'s rule for any adapter, not only the next victim)."""
    copies = sum(1 for other in ctx.pods if adapter in other.gpu_adapters)
    share = victims.rate(adapter) / max(1, copies)
    if share <= 0.0:
        return 0.0
    prior_s = PRIOR_GAPS / share + idle_s
    reuse = 1.0 - math.pow(prior_s / (prior_s + victims.victim_horizon_s), PRIOR_GAPS)
    reload_s = ctx.warm_load_s + (ctx.slot_wait_s or 0.0)
    return reuse * reload_s * ctx.load_penalty_factor * victims.weight(adapter)


def estimate_refresh(
    pod: PodLike,
    worth_s: Callable[[str], float],
    *,
    warmup_s: float,
    margin_s: float,
) -> tuple[str, ...]:
    """The warm-ups to send to a full ``pod`` before a load, in order, so that the
    engine's LRU victim is the idle adapter ``worth_s`` values least (the first in LRU
    order among equals): every idle adapter less recently used than it. Sent only when
    they pay: the LRU victim's worth must exceed the least one's by ``margin_s`` plus
    ``warmup_s`` per warm-up (each holds a batch place). Empty with a free slot, fewer
    than two idle adapters, or when the LRU victim is the least valued already."""
    if pod.free_slots > 0:
        return ()
    idle = idle_adapters(pod)
    if len(idle) < 2:
        return ()
    values = [worth_s(name) for name in idle]
    least = min(range(len(idle)), key=values.__getitem__)
    if least == 0 or values[0] - values[least] <= margin_s + least * warmup_s:
        return ()
    return tuple(idle[:least])
