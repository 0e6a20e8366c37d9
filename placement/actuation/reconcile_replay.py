"""The pods as reconcile's actions so far leave them, and the phases that emit the actions.

Pure: no IO, no clock, no logging. ``FleetReplay`` holds every observed pod's
registrations and GPU slots (``reconcile_pods.GpuSlots``), emits the three actions
(load, unload, warm-up) while following each pod's engine, and runs the phases
``reconcile.schedule`` drives: loads into room, unloads that make room (make before
break), a forced unload to break a cycle, and the final unloads and hot activations.
The rules those phases keep are in ``reconcile``'s docstring. This module owns the
order of actions, not what a pod wants (``reconcile_pods``) nor the waits between
actions (``reconcile``).
"""

from __future__ import annotations

from collections.abc import Mapping

from placement.actuation.reconcile_pods import GpuSlots, PodState, pod_want
from placement.domain import Action, AdapterId, Load, PodId, Unload, Warmup
from placement.plan import Plan
from placement.residency import EngineModel

#: No limit on the names a vLLM pod lists: its API server keeps them in a dict.
_UNBOUNDED = 1 << 30


class FleetReplay:
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
            pod_id: pod_want(plan, pod_id, state, demand_rps) for pod_id, state in observed.items()
        }
        self.regs = {pod_id: set(state.registered) for pod_id, state in observed.items()}
        self.gpu = {pod_id: GpuSlots(state) for pod_id, state in observed.items()}
        #: Whether this apply loads onto the pod (the GPU changes even when unknown).
        self.loaded = dict.fromkeys(observed, False)
        self.pending = {
            pod_id: [a for a in want.adapters if a not in self.regs[pod_id]]
            for pod_id, want in self.wants.items()
        }
        self.reload = {pod_id: self._changed(pod_id) for pod_id in observed}
        self.homes: dict[AdapterId, set[PodId]] = {}
        self.hot_anywhere: set[AdapterId] = set()
        #: The names the plan has an entry for, any tier (cold too): the catalog's.
        self.known = frozenset(plan.adapters)
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

    def kept_listed(self, pod_id: PodId, adapter: AdapterId) -> bool:
        """Whether a vLLM pod keeps listing an adapter the plan does not want there.

        An unload over HTTP frees nothing on vLLM (the API server forgets the name; the
        CPU-cache entry and the GPU slot stay until LRU eviction, vllm-project/vllm#54839)
        and the name's next load reads it again from storage into a second entry. So a
        name the plan still knows, listed from the catalog's source, stays: the router
        may serve it there, and the engine's LRU evicts it when the slot is wanted. A name
        the plan does not know, or listed from another path, is unloaded."""
        if self.engine(pod_id) is not EngineModel.VLLM or adapter not in self.known:
            return False
        path, source = self.observed[pod_id].paths.get(adapter), self.sources.get(adapter)
        return path is None or source is None or path == source

    def finish(self) -> None:
        """Unload what is no longer wanted (``kept_listed`` stays), then activate the
        hot sets where needed."""
        for pod_id in self.pods():
            for adapter in self.extras(pod_id):
                if self.kept_listed(pod_id, adapter):
                    continue
                if self.safe(pod_id, adapter):
                    elsewhere = sorted(self.homes.get(adapter, ()))
                    reason = f"moved to {', '.join(elsewhere)}" if elsewhere else "not in plan"
                    self.unload(pod_id, adapter, reason)
        for pod_id in self.pods():
            self.hot_phase(pod_id)
