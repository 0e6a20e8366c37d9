"""One simulated pod's state: the slots, caches, batch and queue the engine mutates.

Owns ``PodSpec`` (a pod's limits), ``SimPod`` (its live state, which satisfies
``policies.routing.PodLike`` so routers read it without a copy per request) and the
LRU victim rule on it. Mutated only by ``placement.sim.engine``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PodSpec:
    pod_id: str
    max_loras: int
    max_cpu_loras: int
    capacity_rps: float = 1.0


class SimPod:
    """One pod's live state; satisfies ``policies.routing.PodLike`` without copies."""

    __slots__ = (
        "busy_until",
        "gpu_adapters",
        "gpu_util",
        "healthy",
        "kv_tokens",
        "kv_usage",
        "last_used",
        "load_adapter",
        "load_cold",
        "loading",
        "max_cpu_loras",
        "max_loras",
        "pinned",
        "pod_id",
        "queue",
        "queue_depth",
        "recent",
        "registered",
        "running",
        "running_adapters",
        "served",
        "uses",
        "victim_cost",
        "waiting_adapters",
    )

    def __init__(self, spec: PodSpec) -> None:
        self.pod_id = spec.pod_id
        self.max_loras = spec.max_loras
        self.max_cpu_loras = spec.max_cpu_loras
        self.healthy = True
        self.queue: deque[int] = deque()
        self.queue_depth = 0
        self.running = 0
        self.kv_tokens = 0
        self.kv_usage = 0.0
        self.gpu_util = 0.0
        #: adapter -> the time it landed on the slot; dict order is LRU order.
        self.gpu_adapters: dict[str, float] = {}
        self.registered: dict[str, None] = {}
        self.running_adapters: dict[str, int] = {}
        self.waiting_adapters: dict[str, int] = {}
        self.loading: set[str] = set()
        self.load_adapter: str | None = None
        self.load_cold = False
        self.pinned: frozenset[str] = frozenset()
        self.busy_until = 0.0
        self.last_used: dict[str, float] = {}
        self.uses: dict[str, int] = {}
        self.recent: dict[str, deque[float]] = {}
        self.served: set[str] = set()
        #: Set by the engine when eviction is not LRU: the victim's cost on the LRU
        #: scale (an equivalent last-use time), so routers compare pods alike.
        self.victim_cost: Callable[[SimPod], float] | None = None

    @property
    def free_slots(self) -> int:
        return self.max_loras - len(self.gpu_adapters) - len(self.loading)

    @property
    def victim_last_used_s(self) -> float:
        if self.victim_cost is not None:
            return self.victim_cost(self)
        victim = lru_victim(self)
        return math.inf if victim is None else self.last_used.get(victim, 0.0)


def lru_victim(pod: SimPod) -> str | None:
    """``choose_victim`` for LRU without building entries: the slot dict is in LRU
    order, so the first idle unpinned adapter, else the first unpinned one. An adapter
    with requests running or queued counts as in use (Chameleon's reference counts)."""
    fallback: str | None = None
    for adapter in pod.gpu_adapters:
        if adapter in pod.pinned:
            continue
        if adapter not in pod.running_adapters and adapter not in pod.waiting_adapters:
            return adapter
        if fallback is None:
            fallback = adapter
    return fallback
