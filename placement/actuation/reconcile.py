"""Reconcile: a desired plan and what the pods hold now, to an ordered tuple of actions.

Pure: no IO, no clock, no logging. ``reconcile(plan, observed)`` follows each pod's
engine (``placement.residency``: ``EngineModel``) while it emits actions, so that once
they have run each pod lists the plan's adapters and its GPU holds the plan's hot set,
the most valuable hot adapter activated last (the last the engine's LRU evicts):

- vLLM activates every load on a GPU slot (evicting the least recently used) and an
  unload frees nothing: the host-cache entry and the GPU slot stay until LRU eviction.
  So a pod loads its warm adapters first and its hot ones last (loaded, or warmed up
  when kept), and loads never wait for unloads: room comes from the LRU order, not
  from an unload. The names a plan drops are still unloaded, once the loads are done.
  A GPU slot the hot set leaves free holds the last warm adapters loaded.
- SGLang registers on load (a pinned load also takes a slot) and activates on request.
  ``--max-loaded-loras`` (``max_cpu_loras``) is a soft cap: a load past it makes the
  engine unload an adapter of its choosing. So a pod never lists more than its cap at
  any step: on a full pod, unload first, choosing adapters the plan does not want
  anywhere, then warm ones, then hot ones. The hot adapters are warmed up at the end.
- Every engine: the plan's adapters on a pod are capped to ``max_cpu_loras`` and its
  hot set to ``max_loras``, keeping the most valuable; ``ActionSchedule.left_out``
  says what was cut. Value is the adapter's forecast rate times its share on the pod
  (``demand_rps``), else the share, from the plan's weights.
- Make before break: an adapter the plan still wants is unloaded only once a replica
  is registered on a pod where the plan wants it, so a hot adapter never drops below
  one ready replica. Only when no such order exists (a cycle of full SGLang pods
  swapping adapters) is one unload forced, and its reason says so.
- A kept adapter whose ``source`` changed (``sources`` against the pod's listed paths)
  is loaded again in place.
- What the GPU holds is known from the pod's ledger (``PodState.warmed``: the engine
  model's GPU slots, least recently used first). Hot adapters are activated again only
  when that says one is missing, or when the pod's ledger is unknown and this apply
  loads onto it; so applying the same plan twice does nothing the second time.
- Pinned adapters (the plan's, or the pod's ledger's) are never unloaded.

Pods the plan names but ``observed`` lacks (unreachable) get no actions, and their
adapters elsewhere are kept: nothing is unloaded towards a pod that cannot load.
The executor runs actions of one pod in order and waits, for each action, for the
earlier actions on the same adapter (``depends_on``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.domain import Action, ActionKind, AdapterId, Load, PodId, Unload, Warmup
from placement.plan import Plan
from placement.residency import EngineModel

#: No limit on the names a vLLM pod lists: its API server keeps them in a dict.
_UNBOUNDED = 1 << 30


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
class _Want:
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


def _want(
    plan: Plan, pod_id: PodId, state: PodState, demand_rps: Mapping[AdapterId, float]
) -> _Want:
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
    return _Want(
        adapters=adapters,
        hot=tuple(reversed(hot_set)),
        warm=tuple(sorted((a for a in adapters if a not in hot_set), key=worth)),
        pinned=frozenset(pinned) | state.pinned,
        left_out=tuple(left_out),
    )


class _Gpu:
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


class _Simulation:
    """The pods' registrations and GPU slots as the actions so far leave them."""

    def __init__(
        self,
        plan: Plan,
        observed: Mapping[PodId, PodState],
        *,
        sources: Mapping[AdapterId, str],
        demand_rps: Mapping[AdapterId, float],
    ) -> None:
        self.observed = observed
        self.sources = sources
        self.wants = {
            pod_id: _want(plan, pod_id, state, demand_rps) for pod_id, state in observed.items()
        }
        self.regs = {pod_id: set(state.registered) for pod_id, state in observed.items()}
        self.gpu = {pod_id: _Gpu(state) for pod_id, state in observed.items()}
        #: Whether this apply loads onto the pod (the GPU changes even when unknown).
        self.loaded = dict.fromkeys(observed, False)
        self.pending = {
            pod_id: [a for a in want.adapters if a not in self.regs[pod_id]]
            for pod_id, want in self.wants.items()
        }
        self.reload = {pod_id: self._changed(pod_id) for pod_id in observed}
        self.homes: dict[AdapterId, set[PodId]] = {}
        self.hot_anywhere: set[AdapterId] = set()
        for pod_id, pod_plan in plan.pods.items():
            for adapter in pod_plan.registered + pod_plan.pinned:
                self.homes.setdefault(adapter, set()).add(pod_id)
            self.hot_anywhere.update(pod_plan.hot)
        for pod_id, want in self.wants.items():
            for adapter in want.adapters:
                self.homes.setdefault(adapter, set()).add(pod_id)
        self.actions: list[Action] = []
        #: Where each load was emitted, and the load each make-before-break unload needs.
        self.loaded_at: dict[tuple[PodId, AdapterId], int] = {}
        self.waits_on: dict[int, int] = {}

    def _changed(self, pod_id: PodId) -> list[AdapterId]:
        """Kept adapters whose listed path is not the catalog's source any more."""
        paths = self.observed[pod_id].paths
        return [
            a
            for a in self.wants[pod_id].adapters
            if a in self.regs[pod_id] and a in paths and a in self.sources
            if paths[a] != self.sources[a]
        ]

    def pods(self) -> list[PodId]:
        return sorted(self.observed)

    def engine(self, pod_id: PodId) -> EngineModel:
        return self.observed[pod_id].engine

    def room(self, pod_id: PodId) -> int:
        if self.engine(pod_id) is EngineModel.VLLM:
            return _UNBOUNDED  # an unload frees nothing: loads never wait for one
        return self.observed[pod_id].max_cpu_loras - len(self.regs[pod_id])

    def extras(self, pod_id: PodId) -> list[AdapterId]:
        """Registered adapters the plan does not want here, cheapest to lose first:
        wanted nowhere; then those whose unload waits on no load elsewhere (short
        dependency chains let pods work in parallel); then warm before hot."""
        want = self.wants[pod_id]
        extra = self.regs[pod_id] - set(want.adapters) - want.pinned

        def key(adapter: AdapterId) -> tuple[int, int, str]:
            cost = self._cost(adapter)
            safe, dep = self.support(pod_id, adapter)
            waits = 0 if cost == 0 else 1 if safe and dep is None else 2
            return (waits, cost, adapter)

        return sorted(extra, key=key)

    def _cost(self, adapter: AdapterId) -> int:
        if adapter not in self.homes:
            return 0
        return 2 if adapter in self.hot_anywhere else 1

    def support(self, pod_id: PodId, adapter: AdapterId) -> tuple[bool, int | None]:
        """Whether unloading keeps a replica where the plan wants one (or the plan wants
        none), and the index of the load that replica waits on (None: it is there now)."""
        homes = self.homes.get(adapter)
        if not homes:
            return True, None
        loads = []
        for other in sorted(homes):
            if other == pod_id or other not in self.regs or adapter not in self.regs[other]:
                continue
            index = self.loaded_at.get((other, adapter))
            if index is None:
                return True, None
            loads.append(index)
        return (True, min(loads)) if loads else (False, None)

    def safe(self, pod_id: PodId, adapter: AdapterId) -> bool:
        return self.support(pod_id, adapter)[0]

    # the three actions -------------------------------------------------------------
    def unload(self, pod_id: PodId, adapter: AdapterId, reason: str) -> None:
        _, dep = self.support(pod_id, adapter)
        if dep is not None:
            self.waits_on[len(self.actions)] = dep
        self.regs[pod_id].discard(adapter)
        self.gpu[pod_id].unload(adapter)
        self.actions.append(Unload(pod=pod_id, adapter=adapter, reason=reason))

    def warm(self, pod_id: PodId, adapter: AdapterId, reason: str) -> None:
        self.gpu[pod_id].activate(adapter)
        self.actions.append(Warmup(pod=pod_id, adapter=adapter, reason=reason))

    def load(self, pod_id: PodId, adapter: AdapterId) -> None:
        want = self.wants[pod_id]
        inplace = adapter in self.regs[pod_id]
        if inplace:
            self.reload[pod_id].remove(adapter)
            old = self.observed[pod_id].paths.get(adapter, "")
            reason = f"source changed: {old} -> {self.sources.get(adapter, '')}"
        else:
            tier = "pinned" if adapter in want.pinned else "hot" if adapter in want.hot else "warm"
            reason = f"{tier} in plan"
        pinned = adapter in want.pinned
        self.regs[pod_id].add(adapter)
        self.loaded[pod_id] = True
        gpu = self.gpu[pod_id]
        if self.engine(pod_id) is EngineModel.VLLM:
            gpu.activate(adapter, fresh=not inplace)  # vLLM: every load takes a GPU slot
        else:
            if inplace:
                gpu.unload(adapter)  # SGLang's client unloads, then loads
            if pinned:
                gpu.activate(adapter, pinned=True)
        if not inplace:
            self.loaded_at[(pod_id, adapter)] = len(self.actions)
        self.actions.append(
            Load(pod=pod_id, adapter=adapter, reason=reason, pinned=pinned, inplace=inplace)
        )

    # phases ------------------------------------------------------------------------
    def load_into_room(self, pod_id: PodId) -> bool:
        """Load what waits while the pod has room; True if anything was emitted."""
        before = len(self.actions)
        if self.engine(pod_id) is EngineModel.VLLM:
            self._vllm_loads(pod_id)
            return len(self.actions) > before
        for adapter in list(self.reload[pod_id]):  # an unload then a load: room-neutral
            self.load(pod_id, adapter)
        pending = self.pending[pod_id]
        while pending and self.room(pod_id) > 0:
            self.load(pod_id, pending.pop(0))
        return len(self.actions) > before

    def _vllm_loads(self, pod_id: PodId) -> None:
        """Warm adapters first, least valuable first; then the hot set, activated last."""
        want, pending, reload = self.wants[pod_id], self.pending[pod_id], self.reload[pod_id]
        for adapter in want.warm:
            if adapter in pending or adapter in reload:
                self.load(pod_id, adapter)
        pending.clear()
        self.hot_phase(pod_id)

    def hot_phase(self, pod_id: PodId) -> None:
        """Activate the hot set, least valuable first, when the GPU may lack any of it."""
        hot, regs, gpu = self.wants[pod_id].hot, self.regs[pod_id], self.gpu[pod_id]
        vllm = self.engine(pod_id) is EngineModel.VLLM
        # vLLM loads its new and changed hot adapters here; SGLang did in the load pass.
        due = [a for a in hot if a not in regs or a in self.reload[pod_id]] if vllm else []
        lacking = [a for a in hot if a in regs and not gpu.holds(a)]
        # Unknown GPU (no ledger) and nothing loaded: no reason to think it changed.
        if not due and (not lacking or not (gpu.known or self.loaded[pod_id])):
            return
        for adapter in hot:
            if adapter in due:
                self.load(pod_id, adapter)  # vLLM: the load is the activation
            elif adapter in regs:
                reason = "hot: activate last" if gpu.holds(adapter) else "hot: pull onto GPU"
                self.warm(pod_id, adapter, reason)

    def make_room(self, pod_id: PodId) -> bool:
        """Unload safely as many extras as the waiting loads need (or the pod is over)."""
        pending, before = self.pending[pod_id], len(self.actions)
        short = len(pending) - self.room(pod_id)
        for adapter in self.extras(pod_id):
            if short <= 0:
                break
            if self.safe(pod_id, adapter):
                reason = f"full pod: room for {pending[0]}" if pending else "over max_cpu_loras"
                self.unload(pod_id, adapter, reason)
                short -= 1
        return len(self.actions) > before

    def force(self) -> bool:
        """Break a cycle of full pods: unload the cheapest extra where a load waits."""
        for pod_id in self.pods():
            if self.pending[pod_id] and self.room(pod_id) <= 0:
                extras = self.extras(pod_id)
                if extras:
                    reason = (
                        f"forced: no make-before-break order frees a slot for "
                        f"{self.pending[pod_id][0]}"
                    )
                    self.unload(pod_id, extras[0], reason)
                    return True
        return False

    def finish(self) -> None:
        """Unload what is no longer wanted, then activate the hot sets where needed."""
        for pod_id in self.pods():
            for adapter in self.extras(pod_id):
                if self.safe(pod_id, adapter):
                    elsewhere = sorted(self.homes.get(adapter, ()))
                    reason = f"moved to {', '.join(elsewhere)}" if elsewhere else "not in plan"
                    self.unload(pod_id, adapter, reason)
        for pod_id in self.pods():
            self.hot_phase(pod_id)


@dataclass(frozen=True, kw_only=True)
class ActionSchedule:
    """Reconcile's actions, and for each the indices of earlier ones it must wait for:
    the previous action on its pod and, for a make-before-break unload, the load of
    the replica that keeps its adapter served."""

    actions: tuple[Action, ...]
    after: tuple[tuple[int, ...], ...]
    #: Planned adapters a pod's limits cannot hold as planned, and why.
    left_out: tuple[tuple[PodId, AdapterId, str], ...] = ()


def reconcile(
    desired: Plan,
    observed: Mapping[PodId, PodState],
    *,
    sources: Mapping[AdapterId, str] | None = None,
    demand_rps: Mapping[AdapterId, float] | None = None,
) -> tuple[Action, ...]:
    """The actions that bring the observed pods to ``desired``, in a safe order.

    ``sources``: each adapter's ``lora_path`` (the catalog's ``source``): a kept adapter
    listed with another path is loaded again in place. ``demand_rps``: the forecast
    rate of each adapter, which orders the hot set (the most valuable activated last).
    """
    return schedule(desired, observed, sources=sources, demand_rps=demand_rps).actions


def schedule(
    desired: Plan,
    observed: Mapping[PodId, PodState],
    *,
    sources: Mapping[AdapterId, str] | None = None,
    demand_rps: Mapping[AdapterId, float] | None = None,
) -> ActionSchedule:
    """``reconcile`` with the precise order each action needs (see ``ActionSchedule``)."""
    sim = _Simulation(desired, observed, sources=sources or {}, demand_rps=demand_rps or {})
    while True:
        # Loads everywhere first, then the unloads they make safe: an unload then waits
        # on a load of the previous phase, never on a chain through this one.
        progressed = False
        for pod_id in sim.pods():
            progressed = sim.load_into_room(pod_id) or progressed
        for pod_id in sim.pods():
            progressed = sim.make_room(pod_id) or progressed
        if progressed:
            continue
        if not any(sim.pending.values()) or not sim.force():
            break
    sim.finish()
    return ActionSchedule(
        actions=tuple(sim.actions),
        after=_after(sim.actions, sim.waits_on),
        left_out=tuple(
            (pod_id, adapter, why)
            for pod_id in sim.pods()
            for adapter, why in sim.wants[pod_id].left_out
        ),
    )


def _after(actions: list[Action], waits_on: Mapping[int, int]) -> tuple[tuple[int, ...], ...]:
    last_on_pod: dict[PodId, int] = {}
    last_here: dict[tuple[PodId, AdapterId], int] = {}
    after = []
    for index, action in enumerate(actions):
        here = (action.pod, action.adapter)
        before = {last_on_pod[action.pod]} if action.pod in last_on_pod else set()
        if here in last_here:
            before.add(last_here[here])
        if index in waits_on:
            before.add(waits_on[index])
        after.append(tuple(sorted(before)))
        last_on_pod[action.pod] = index
        last_here[here] = index
    return tuple(after)


def depends_on(actions: tuple[Action, ...]) -> tuple[tuple[int, ...], ...]:
    """For each action, the indices of earlier actions it must wait for.

    The previous action on the same pod (one at a time per pod) and the previous one
    on the same pod and adapter; for an unload, also every earlier load or warm-up of
    the same adapter on other pods (make before break).
    """
    last_on_pod: dict[PodId, int] = {}
    last_here: dict[tuple[PodId, AdapterId], int] = {}
    placed: dict[AdapterId, list[int]] = {}
    deps = []
    for index, action in enumerate(actions):
        before = set(placed.get(action.adapter, [])) if action.kind is ActionKind.UNLOAD else set()
        if action.pod in last_on_pod:
            before.add(last_on_pod[action.pod])
        if (action.pod, action.adapter) in last_here:
            before.add(last_here[(action.pod, action.adapter)])
        deps.append(tuple(sorted(before)))
        last_on_pod[action.pod] = index
        last_here[(action.pod, action.adapter)] = index
        if action.kind is not ActionKind.UNLOAD:
            placed.setdefault(action.adapter, []).append(index)
    return tuple(deps)
