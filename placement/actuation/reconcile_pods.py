"""One pod as reconcile sees it: what it holds, what the plan wants of it, its GPU slots.

Pure: no IO, no clock, no logging. ``PodState`` is reconcile's input for one pod (the
listing, the engine, the limits, the ledger's GPU order and pins); ``pod_want`` caps the
plan's adapters for that pod to its limits, most valuable first, and says what it cut;
``GpuSlots`` replays what the pod's GPU holds as actions run. This module decides no
order of actions: ``reconcile_replay`` does, and ``reconcile`` is the entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.domain import AdapterId, PodId
from placement.plan import Plan
from placement.residency import EngineModel


@dataclass(frozen=True, kw_only=True)
class PodState:
    """What one pod holds now, its engine and its limits."""

    registered: frozenset[AdapterId]
    engine: EngineModel
    #: vLLM: ``--max-cpu-loras`` (the host cache); SGLang: ``--max-loaded-loras``.
    max_cpu_loras: int
    max_loras: int
    #: The pod's GPU slots, least recently used first, from the controller's ledger (the
    #: engine model fed every action lorafleet ran); on vLLM a slot still held by an
    #: unloaded name appears as ``?unloaded-N``. None when unknown.
    warmed: tuple[AdapterId, ...] | None = None
    #: Adapters that must never be unloaded from this pod.
    pinned: frozenset[AdapterId] = frozenset()
    #: The ``lora_path`` the pod lists for each registered adapter (``/v1/models``).
    paths: Mapping[AdapterId, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class PodWant:
    """The plan for one observed pod, capped to its limits."""

    #: Load priority order (pins, hot, warm; the most valuable first).
    adapters: tuple[AdapterId, ...]
    #: The hot set, least valuable first: the order they are activated in.
    hot: tuple[AdapterId, ...]
    #: The warm adapters, least valuable first.
    warm: tuple[AdapterId, ...]
    pinned: frozenset[AdapterId]
    left_out: tuple[tuple[AdapterId, str], ...]


Worth = Callable[[AdapterId], tuple[float, float, str]]


def _worth(plan: Plan, pod_id: PodId, demand_rps: Mapping[AdapterId, float]) -> Worth:
    def worth(adapter: AdapterId) -> tuple[float, float, str]:
        entry = plan.adapters.get(adapter)
        share = entry.pods.get(pod_id, 0.0) if entry is not None else 0.0
        return (demand_rps.get(adapter, 0.0) * share, share, adapter)

    return worth


def pod_want(
    plan: Plan, pod_id: PodId, state: PodState, demand_rps: Mapping[AdapterId, float]
) -> PodWant:
    """The plan for ``pod_id`` capped to its limits: pins and kept pins first, then the
    hot set and the warm adapters, most valuable first; what the caps cut is left out."""
    pod_plan = plan.pods.get(pod_id)
    worth = _worth(plan, pod_id, demand_rps)
    pinned = tuple(pod_plan.pinned) if pod_plan else ()
    keep = tuple(sorted(state.pinned & state.registered))
    hot = tuple(sorted(dict.fromkeys(pod_plan.hot if pod_plan else ()), key=worth, reverse=True))
    warm = tuple(sorted(dict.fromkeys(pod_plan.warm if pod_plan else ()), key=worth, reverse=True))
    ordered = tuple(dict.fromkeys(keep + pinned + hot + warm))
    adapters = ordered[: state.max_cpu_loras]
    hot_set = [a for a in hot if a in adapters][: state.max_loras]
    left_out = [(a, f"over max_cpu_loras {state.max_cpu_loras}") for a in ordered[len(adapters) :]]
    left_out += [
        (a, f"hot over max_loras {state.max_loras}: warm")
        for a in hot
        if a in adapters and a not in hot_set
    ]
    return PodWant(
        adapters=adapters,
        hot=tuple(reversed(hot_set)),
        warm=tuple(sorted((a for a in adapters if a not in hot_set), key=worth)),
        pinned=frozenset(pinned) | state.pinned,
        left_out=tuple(left_out),
    )


class GpuSlots:
    """What reconcile knows of one pod's GPU slots: the adapters on them, least
    recently activated first, replayed from the ledger's activations.

    SGLang's pinned adapters hold their slots for good. Unknown (no ledger): unknown
    entries fill the slots until activations push them out."""

    def __init__(self, state: PodState) -> None:
        self.known = state.warmed is not None
        self.slots = state.max_loras
        self.sglang = state.engine.is_sglang
        self.fixed = set(state.pinned & state.registered) if self.sglang else set()
        self.lru: list[AdapterId] = []
        self._unknown = 0
        if state.warmed is None:
            for _ in range(self.slots):
                self.lru.append(self._placeholder())
        for adapter in state.warmed or ():
            self.activate(adapter)

    def _placeholder(self) -> AdapterId:
        """An entry no name points to (not a valid adapter name)."""
        self._unknown += 1
        return AdapterId(f"?{self._unknown}")

    def holds(self, adapter: AdapterId) -> bool:
        return adapter in self.fixed or adapter in self.lru

    def activate(self, adapter: AdapterId, *, pinned: bool = False, fresh: bool = False) -> None:
        """``fresh``: a vLLM load of a new entry; an unloaded one of the same name keeps
        its slot until the LRU evicts it."""
        if pinned and self.sglang:
            self.fixed.add(adapter)
        if adapter in self.lru:
            at = self.lru.index(adapter)
            if fresh:
                self.lru[at] = self._placeholder()
            else:
                del self.lru[at]
        if adapter not in self.fixed:
            self.lru.append(adapter)
        del self.lru[: max(0, len(self.lru) - max(0, self.slots - len(self.fixed)))]

    def unload(self, adapter: AdapterId) -> None:
        """SGLang frees the slot; vLLM keeps the entry on its slot until LRU eviction."""
        if self.sglang:
            self.fixed.discard(adapter)
            if adapter in self.lru:
                self.lru.remove(adapter)
