"""The replay engine's victim when the GPU slots are full: the engine's own LRU, or a
counterfactual eviction policy (``--eviction``), or Belady's for the oracle; and the
victim's cost routers read on each pod (``SimPod.victim_cost``), and the horizon a
router's victim worth looks over with each wait (``victim_horizon``).

``EngineEviction`` is a part of ``FleetReplay`` (placement.sim.engine): it reads the
replay's pods, clock, workload and forecast, and passes the model of
``placement.residency`` the one victim it may take (under LRU the model chooses, with
the adapters in use as busy). Owns no IO and no wall clock; mutates nothing but the
pod it fetches to.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from enum import Enum

from placement.residency import Effects
from placement.settings import Settings
from placement.sim.pods import SimPod, lru_victim
from placement.sim.workload import SimWorkload
from policies.eviction import (
    CacheEntry,
    EvictionContext,
    EvictionPolicy,
    EvictionSettings,
    choose_victim,
)


class VictimWait(Enum):
    """What a router's victim worth (``policies.victims.victim_worth_s``) reads as the
    engine's victim's wait on a pod (``SimPod.victim_last_used_s``)."""

    #: The time since its last use there: all a router of a real engine knows.
    IDLE = "idle"
    #: The wait to its true next request: the oracle's.
    NEXT_USE = "next-use"


def victim_horizon(settings: Settings, wait: VictimWait) -> float:
    """The horizon a victim's worth looks over when it reads ``wait``: with the true
    next use (the oracle, and the hybrids' ``n``) the oracle's own
    (``SimSettings.oracle_victim_horizon_s``), chosen for the oracle; with the idle time
    lorafleet's (``RouterSettings.victim_horizon_s``), chosen for lorafleet."""
    if wait is VictimWait.NEXT_USE:
        return settings.sim.oracle_victim_horizon_s
    return settings.router.victim_horizon_s


class EngineEviction:
    """Victim choice for ``FleetReplay``; the attributes are the replay's."""

    pods: list[SimPod]
    workload: SimWorkload
    eviction_settings: EvictionSettings
    router_eviction: EvictionPolicy
    forecast_rps: dict[str, float]
    now_s: float
    _next_use: dict[str, list[float]] | None
    #: ``steer_victim_wait``'s choice; None: the eviction's own (``_victim_cost``).
    victim_wait: VictimWait | None = None
    #: ``SimSettings.load_admission`` "vllm": a load never evicts the adapter of a
    #: running request (the batch holds at most ``max_loras`` adapters).
    vllm_admission: bool = False

    def _fetch(self, pod: SimPod, adapter: str, now_s: float) -> Effects:
        """The engine model's load or request for ``adapter``, with the victim it evicts
        if the slots are full: under LRU the engine's own, skipping adapters in use
        while it has another choice; under another policy that policy's, passed to the
        model as the only one it may take."""
        busy: set[str]
        if pod.free_slots > 0 or self.router_eviction is EvictionPolicy.LRU:
            busy = {*pod.running_adapters, *pod.waiting_adapters}
            if self.vllm_admission and busy.issuperset(pod.gpu_adapters):
                busy = set(pod.running_adapters)  # never one of the batch's (max_loras)
        else:
            victim = self._victim(pod, now_s)
            if self.vllm_admission and (victim is None or victim in pod.running_adapters):
                idle = (name for name in pod.gpu_adapters if name not in pod.running_adapters)
                victim = next(idle, victim)
            busy = {name for name in pod.gpu_adapters if name != victim}
        return pod.fetch(adapter, busy=busy, now_s=now_s)

    def _victim(self, pod: SimPod, now_s: float) -> str | None:
        if self.router_eviction is EvictionPolicy.BELADY:
            return self._belady_victim(pod)[0]
        return choose_victim(self._eviction_context(pod, now_s))

    def engine_victim(self, pod: SimPod) -> str | None:
        """The adapter this engine evicts next on full ``pod``: Belady's under Belady
        (with every adapter there planned, the model's least recently used: it has no
        other choice), else the LRU one (a router's view: ``policies.victims.lru_victim``)."""
        if self.router_eviction is EvictionPolicy.BELADY:
            victim = self._belady_victim(pod)[0]
            return victim if victim is not None else next(iter(pod.gpu_adapters), None)
        return lru_victim(pod)

    def steer_victim_wait(self, wait: VictimWait, eviction: EvictionPolicy) -> None:
        """Make the routers on this replay read ``wait`` as the engine's victim's wait
        (a lever of ``bench/oracle_levers.py``): under LRU the idle time is the engine's
        own and under Belady the true next use, which change nothing. Call before
        ``run``, with the router's eviction."""
        own = VictimWait.NEXT_USE if eviction is EvictionPolicy.BELADY else VictimWait.IDLE
        if wait is own:
            return
        self.victim_wait = wait
        if self._next_use is None:
            self._next_use = self._arrivals_by_adapter()
        for pod in self.pods:
            pod.victim_cost = self._victim_cost

    def _victim_cost(self, pod: SimPod) -> float:
        """When the engine's victim on ``pod`` would have been last used, were it LRU's:
        under Belady (``victim_wait`` None) now minus its wait to the next request, so
        routers compare pods on one scale; by ``victim_wait`` otherwise."""
        if pod.free_slots > 0:
            return -math.inf
        if self.victim_wait is None:
            victim, next_s = self._belady_victim(pod)
        else:
            victim = self.engine_victim(pod)
            next_s = math.inf if victim is None else self.next_use_s(victim)
        if victim is None:
            return math.inf
        if self.victim_wait is VictimWait.IDLE:
            return pod.last_used.get(victim, 0.0)
        return 2.0 * self.now_s - next_s

    def next_use_s(self, adapter: str) -> float:
        """When ``adapter`` is next asked for after now (replay seconds; inf: never)."""
        if self._next_use is None:
            self._next_use = self._arrivals_by_adapter()
        times = self._next_use.get(adapter, ())
        k = bisect_right(times, self.now_s)
        return times[k] if k < len(times) else math.inf

    def _belady_victim(self, pod: SimPod) -> tuple[str | None, float]:
        """``choose_victim`` for Belady without building entries: the idle unpinned
        adapter used furthest in the future (else the busy one), and that time."""
        if self._next_use is None:
            self._next_use = self._arrivals_by_adapter()
        best: tuple[str | None, float] = (None, -math.inf)
        busy: tuple[str | None, float] = (None, -math.inf)
        now_s = self.now_s
        for adapter in pod.gpu_adapters:
            if adapter in pod.planned:
                continue
            times = self._next_use.get(adapter, ())
            k = bisect_right(times, now_s)
            next_s = times[k] if k < len(times) else math.inf
            idle = adapter not in pod.running_adapters and adapter not in pod.waiting_adapters
            chosen = best if idle else busy
            if chosen[0] is None or next_s > chosen[1]:
                if idle:
                    best = (adapter, next_s)
                else:
                    busy = (adapter, next_s)
        return best if best[0] is not None else busy

    def _eviction_context(self, pod: SimPod, now_s: float) -> EvictionContext:
        size = self.workload.size_bytes
        entries = [
            CacheEntry(
                adapter=adapter,
                last_used_s=pod.last_used.get(adapter, loaded_at),
                uses=pod.uses.get(adapter, 0),
                recent_uses_s=pod.recent.get(adapter, ()),
                size_bytes=size.get(adapter, 0),
                pinned=adapter in pod.planned,
                in_use=adapter in pod.running_adapters or adapter in pod.waiting_adapters,
                forecast_rps=self.forecast_rps.get(adapter, 0.0),
            )
            for adapter, loaded_at in pod.gpu_adapters.items()
        ]
        return EvictionContext(
            entries=entries,
            now_s=now_s,
            policy=self.router_eviction,
            settings=self.eviction_settings,
            next_use_s=self._next_uses(pod, now_s),
        )

    def _next_uses(self, pod: SimPod, now_s: float) -> dict[str, float]:
        if self._next_use is None:
            return {}
        result: dict[str, float] = {}
        for adapter in pod.gpu_adapters:
            times = self._next_use.get(adapter, [])
            k = bisect_right(times, now_s)
            result[adapter] = times[k] if k < len(times) else math.inf
        return result

    def _arrivals_by_adapter(self) -> dict[str, list[float]]:
        by_adapter: dict[str, list[float]] = {}
        for moment, adapter in zip(self.workload.arrival_s, self.workload.adapters, strict=True):
            by_adapter.setdefault(adapter, []).append(moment)
        return by_adapter
