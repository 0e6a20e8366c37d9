"""Small builders of plans and pod states for the reconcile and apply suites."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from placement.domain import Action, ActionKind, AdapterId, PodId, Tier
from placement.plan import AdapterPlan, Plan, PodPlan
from placement.reconcile import PodState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ids(names: Iterable[str]) -> tuple[AdapterId, ...]:
    return tuple(AdapterId(name) for name in names)


def make_plan(
    pods: Mapping[str, tuple[Iterable[str], Iterable[str]]],
    *,
    pinned: Mapping[str, Iterable[str]] | None = None,
) -> Plan:
    """``{pod: (hot, warm)}``; an adapter hot anywhere has tier hot."""
    pinned = pinned or {}
    pod_plans = {
        PodId(pod): PodPlan(hot=ids(hot), warm=ids(warm), pinned=ids(pinned.get(pod, ())))
        for pod, (hot, warm) in pods.items()
    }
    adapters: dict[AdapterId, AdapterPlan] = {}
    for tier in (Tier.WARM, Tier.HOT):
        for pod_id, pod_plan in pod_plans.items():
            for adapter in pod_plan.hot if tier is Tier.HOT else pod_plan.warm:
                replicas = dict(adapters[adapter].pods) if adapter in adapters else {}
                replicas[pod_id] = 1.0
                adapters[adapter] = AdapterPlan(tier=tier, pods=MappingProxyType(replicas))
    return Plan(
        id="test",
        created_at=T0,
        valid_from=T0,
        valid_until=T0,
        pods=MappingProxyType(pod_plans),
        adapters=MappingProxyType(adapters),
    )


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
        warmed=None if warmed is None else frozenset(ids(warmed)),
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
    actions = tuple(actions)
    regs = {pod: set(s.registered) for pod, s in observed.items()}
    for step in replay(observed, actions):
        regs = step
    warmed_now = {(a.pod, a.adapter) for a in actions if a.kind is ActionKind.WARMUP}
    return {
        pod: PodState(
            registered=frozenset(regs[pod]),
            max_cpu_loras=s.max_cpu_loras,
            max_loras=s.max_loras,
            warmed=None
            if s.warmed is None
            else frozenset(
                a for a in s.warmed | {a for p, a in warmed_now if p == pod} if a in regs[pod]
            ),
            pinned=s.pinned,
        )
        for pod, s in observed.items()
    }
