"""Reconcile: a desired plan and what the pods hold now, to an ordered tuple of actions.

Pure: no IO, no clock, no logging. ``reconcile(plan, observed)`` simulates the pods
while it emits actions, so that every prefix of the result keeps these promises:

- ``max_cpu_loras`` holds on every pod at every step: on a full pod, unload first,
  choosing adapters the plan does not want anywhere, then warm ones, then hot ones.
- Make before break: an adapter the plan still wants is unloaded only once a replica
  is registered on a pod where the plan wants it, so a hot adapter never drops below
  one ready replica. Only when no such order exists (a cycle of full pods swapping
  adapters) is one unload forced, and its reason says so.
- Loads of hot adapters are followed by a warm-up; with a ledger of warmed adapters,
  hot adapters registered but never warmed are warmed too.
- Pinned adapters (the plan's, or the pod's ledger's) are never unloaded.

Pods the plan names but ``observed`` lacks (unreachable) get no actions, and their
adapters elsewhere are kept: nothing is unloaded towards a pod that cannot load.
The executor runs actions of one pod in order and waits, for each action, for the
earlier actions on the same adapter (``depends_on``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from placement.domain import Action, ActionKind, AdapterId, Load, PodId, Unload, Warmup
from placement.plan import Plan


@dataclass(frozen=True, kw_only=True)
class PodState:
    """What one pod holds now, and its limits."""

    registered: frozenset[AdapterId]
    max_cpu_loras: int
    max_loras: int
    #: The ledger of warm-ups on this pod, oldest first: the GPU slots' LRU as far as
    #: lorafleet knows it. None when unknown (then only adapters loaded now are warmed).
    warmed: tuple[AdapterId, ...] | None = None
    #: Adapters that must never be unloaded from this pod.
    pinned: frozenset[AdapterId] = frozenset()


@dataclass(frozen=True, kw_only=True)
class _Want:
    """The plan for one observed pod, capped to its limits, in load priority order."""

    adapters: tuple[AdapterId, ...]
    hot: frozenset[AdapterId]
    pinned: frozenset[AdapterId]


def _wants(plan: Plan, observed: Mapping[PodId, PodState]) -> dict[PodId, _Want]:
    wants = {}
    for pod_id, state in observed.items():
        pod_plan = plan.pods.get(pod_id)
        pinned = tuple(pod_plan.pinned) if pod_plan else ()
        keep = tuple(sorted(state.pinned & state.registered))
        hot = tuple(pod_plan.hot) if pod_plan else ()
        ordered = tuple(dict.fromkeys(keep + pinned + hot + (pod_plan.warm if pod_plan else ())))
        adapters = ordered[: state.max_cpu_loras]
        wants[pod_id] = _Want(
            adapters=adapters,
            hot=frozenset([a for a in hot if a in adapters][: state.max_loras]),
            pinned=frozenset(pinned) | state.pinned,
        )
    return wants


class _Simulation:
    """The pods' registrations as the actions so far leave them."""

    def __init__(self, plan: Plan, observed: Mapping[PodId, PodState]) -> None:
        self.observed = observed
        self.wants = _wants(plan, observed)
        self.regs = {pod_id: set(state.registered) for pod_id, state in observed.items()}
        self.gpu = {
            pod_id: None if state.warmed is None else list(state.warmed)[-state.max_loras :]
            for pod_id, state in observed.items()
        }
        self.pending = {
            pod_id: [a for a in want.adapters if a not in self.regs[pod_id]]
            for pod_id, want in self.wants.items()
        }
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

    def pods(self) -> list[PodId]:
        return sorted(self.observed)

    def room(self, pod_id: PodId) -> int:
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

    def unload(self, pod_id: PodId, adapter: AdapterId, reason: str) -> None:
        _, dep = self.support(pod_id, adapter)
        if dep is not None:
            self.waits_on[len(self.actions)] = dep
        self.regs[pod_id].discard(adapter)
        gpu = self.gpu[pod_id]
        if gpu is not None and adapter in gpu:
            gpu.remove(adapter)
        self.actions.append(Unload(pod=pod_id, adapter=adapter, reason=reason))

    def warm(self, pod_id: PodId, adapter: AdapterId, reason: str) -> None:
        gpu = self.gpu[pod_id]
        if gpu is not None:
            if adapter in gpu:
                gpu.remove(adapter)
            gpu.append(adapter)
            del gpu[: -self.observed[pod_id].max_loras]
        self.actions.append(Warmup(pod=pod_id, adapter=adapter, reason=reason))

    def load(self, pod_id: PodId, adapter: AdapterId) -> None:
        want = self.wants[pod_id]
        hot = adapter in want.hot
        tier = "pinned" if adapter in want.pinned else "hot" if hot else "warm"
        self.regs[pod_id].add(adapter)
        self.loaded_at[(pod_id, adapter)] = len(self.actions)
        self.actions.append(
            Load(
                pod=pod_id,
                adapter=adapter,
                reason=f"{tier} in plan",
                pinned=adapter in want.pinned,
            )
        )
        if hot:
            self.warm(pod_id, adapter, "hot: pull onto GPU")

    def load_into_room(self, pod_id: PodId) -> bool:
        """Load what waits while the pod has room; True if anything was emitted."""
        pending, before = self.pending[pod_id], len(self.actions)
        while pending and self.room(pod_id) > 0:
            self.load(pod_id, pending.pop(0))
        return len(self.actions) > before

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
        """Unload what is no longer wanted, and warm hot adapters the ledger lacks."""
        for pod_id in self.pods():
            for adapter in self.extras(pod_id):
                if self.safe(pod_id, adapter):
                    elsewhere = sorted(self.homes.get(adapter, ()))
                    reason = f"moved to {', '.join(elsewhere)}" if elsewhere else "not in plan"
                    self.unload(pod_id, adapter, reason)
        for pod_id in self.pods():
            self._rewarm(pod_id)

    def _rewarm(self, pod_id: PodId) -> None:
        """Warm hot adapters the GPU LRU lost, refreshing the ones it kept first so
        that the last warm-ups are exactly the hot set (no more than ``max_loras``)."""
        gpu = self.gpu[pod_id]
        hot = {a for a in self.wants[pod_id].hot if a in self.regs[pod_id]}
        if gpu is None or hot <= set(gpu):
            return
        kept = [a for a in gpu if a in hot]
        for adapter in kept + sorted(hot - set(gpu)):
            reason = "hot: keep on GPU" if adapter in kept else "hot but not on GPU"
            self.warm(pod_id, adapter, reason)


@dataclass(frozen=True, kw_only=True)
class ActionSchedule:
    """Reconcile's actions, and for each the indices of earlier ones it must wait for:
    the previous action on its pod and, for a make-before-break unload, the load of
    the replica that keeps its adapter served."""

    actions: tuple[Action, ...]
    after: tuple[tuple[int, ...], ...]


def reconcile(desired: Plan, observed: Mapping[PodId, PodState]) -> tuple[Action, ...]:
    """The actions that bring the observed pods to ``desired``, in a safe order."""
    return schedule(desired, observed).actions


def schedule(desired: Plan, observed: Mapping[PodId, PodState]) -> ActionSchedule:
    """``reconcile`` with the precise order each action needs (see ``ActionSchedule``)."""
    sim = _Simulation(desired, observed)
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
    last_on_pod: dict[PodId, int] = {}
    last_here: dict[tuple[PodId, AdapterId], int] = {}
    after = []
    for index, action in enumerate(sim.actions):
        here = (action.pod, action.adapter)
        before = {last_on_pod[action.pod]} if action.pod in last_on_pod else set()
        if here in last_here:
            before.add(last_here[here])
        if index in sim.waits_on:
            before.add(sim.waits_on[index])
        after.append(tuple(sorted(before)))
        last_on_pod[action.pod] = index
        last_here[here] = index
    return ActionSchedule(actions=tuple(sim.actions), after=tuple(after))


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
