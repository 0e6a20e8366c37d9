"""Reconcile: a desired plan and what the pods hold now, to an ordered tuple of actions.

Pure: no IO, no clock, no logging. ``reconcile(plan, observed)`` follows each pod's
engine (``placement.residency``: ``EngineModel``) while it emits actions, so that once
they have run each pod lists the plan's adapters and its GPU holds the plan's hot set,
the most valuable hot adapter activated last (the last the engine's LRU evicts):

- vLLM activates every load on a GPU slot (evicting the least recently used) and an
  unload frees nothing: the host-cache entry and the GPU slot stay until LRU eviction.
  So a pod loads its warm adapters first and its hot ones last (loaded, or warmed up
  when kept), and loads never wait for unloads: room comes from the LRU order, not
  from an unload. So a name the plan moves off a pod but still knows (any tier, cold
  too) stays listed there from its source: unloading it would free nothing, and the
  router's next load of it there would read it from storage into a second entry
  (``FleetReplay.kept_listed``). Names the plan does not know, or listed from another
  path, are unloaded once the loads are done. A GPU slot the hot set leaves free
  holds the last warm adapters loaded.
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

This module is the entry point and the waits between actions (``ActionSchedule``,
``depends_on``); ``reconcile_pods`` holds a pod's input (``PodState``) and what the plan
wants of it, ``reconcile_replay`` the phases that emit the actions in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from placement.actuation.reconcile_pods import PodState
from placement.actuation.reconcile_replay import FleetReplay
from placement.domain import Action, ActionKind, AdapterId, PodId
from placement.plan import Plan


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
    sim = FleetReplay(desired, observed, sources=sources or {}, demand_rps=demand_rps or {})
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
