"""Pod states for the reconcile suites, and the registrations a list of actions leaves.

Plans come from ``tests.factories.make_plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from placement.actuation.reconcile import PodState
from placement.domain import Action, ActionKind, AdapterId, PodId


def ids(names: Iterable[str]) -> tuple[AdapterId, ...]:
    return tuple(AdapterId(name) for name in names)


def state(
    registered: Iterable[str],
    *,
    cpu: int,
    gpu: int = 1,
    warmed: Iterable[str] | None = None,
    pinned: Iterable[str] = (),
) -> PodState:
    return PodState(
        registered=frozenset(ids(registered)),
        max_cpu_loras=cpu,
        max_loras=gpu,
        warmed=None if warmed is None else ids(warmed),
        pinned=frozenset(ids(pinned)),
    )


def replay(
    observed: Mapping[PodId, PodState], actions: Iterable[Action]
) -> Iterable[dict[PodId, set[AdapterId]]]:
    """The registrations after each action, in order."""
    regs = {pod: set(s.registered) for pod, s in observed.items()}
    for action in actions:
        if action.kind is ActionKind.LOAD:
            regs[action.pod].add(action.adapter)
        elif action.kind is ActionKind.UNLOAD:
            regs[action.pod].discard(action.adapter)
        yield regs


def after(observed: Mapping[PodId, PodState], actions: Iterable[Action]) -> dict[PodId, PodState]:
    """The pod states once every action is applied, with the ledger updated."""
    regs = {pod: set(s.registered) for pod, s in observed.items()}
    lru = {pod: None if s.warmed is None else list(s.warmed) for pod, s in observed.items()}
    for action in actions:
        held, order = regs[action.pod], lru[action.pod]
        if action.kind is ActionKind.LOAD:
            held.add(action.adapter)
        elif action.kind is ActionKind.UNLOAD:
            held.discard(action.adapter)
        if order is not None and action.kind is not ActionKind.LOAD:
            if action.adapter in order:
                order.remove(action.adapter)
            if action.kind is ActionKind.WARMUP:
                order.append(action.adapter)
    return {
        pod: PodState(
            registered=frozenset(regs[pod]),
            max_cpu_loras=s.max_cpu_loras,
            max_loras=s.max_loras,
            warmed=None if lru[pod] is None else tuple(lru[pod] or ()),
            pinned=s.pinned,
        )
        for pod, s in observed.items()
    }
